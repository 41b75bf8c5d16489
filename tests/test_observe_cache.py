"""The daemon's cache of what it observes: run-dir files read again only when they changed
(and always through the validating reader), processes followed by pidfd once proven."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from rows_helpers import attempt_of

from orchestrator.attempts import rundir_reads as runfiles
from orchestrator.attempts.observe_cache import ObserveCache
from orchestrator.attempts.reconcile import PROGRESS_REFRESH_S, observe, process_matches


def run_dir_in(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    run_dir = runs / "suite" / "000001-job" / "attempt-1"
    run_dir.mkdir(parents=True, mode=0o700)
    return run_dir


def write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # as the wrapper writes them: a new inode each time


def test_files_are_read_again_only_when_they_changed(  # type: ignore[no-untyped-def]
    tmp_path: Path, monkeypatch
) -> None:
    run_dir = run_dir_in(tmp_path)
    reads: list[Path] = []
    real = runfiles.read_run_files
    monkeypatch.setattr(runfiles, "read_run_files", lambda d, **kw: reads.append(d) or real(d, **kw))
    cache = ObserveCache()
    write_json(run_dir / "pid.json", {"pid": 12345, "pgid": 12345, "create_time": 1.0})
    first = cache.run_files(run_dir)
    assert first.pid_record is not None and first.pid_record["pid"] == 12345
    assert cache.run_files(run_dir) is first and len(reads) == 1
    with open(run_dir / "progress.jsonl", "a") as handle:
        handle.write(json.dumps({"t": time.time(), "step": 3}) + "\n")
    assert cache.run_files(run_dir).last_progress == {
        "t": json.loads((run_dir / "progress.jsonl").read_text())["t"],
        "step": 3,
    }
    write_json(run_dir / "exit.json", {"exit_code": 0})
    assert cache.run_files(run_dir).exit_record == {"exit_code": 0}
    assert len(reads) == 3
    # a symlink put in pid.json's place changes the signature: refused by the validating reader
    (run_dir / "pid.json").unlink()
    (run_dir / "pid.json").symlink_to(tmp_path / "elsewhere.json")
    again = cache.run_files(run_dir)
    assert again.pid_record is None and any("symlink" in p for p in again.problems)
    cache.end_pass([])
    assert cache.run_files(run_dir) is not again  # forgotten once not live


def test_a_proven_process_is_followed_by_pidfd(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    cache = ObserveCache()
    checks: list[int] = []

    def check(pid: int, create_time: float | None) -> bool:
        checks.append(pid)
        return process_matches(pid, create_time)

    try:
        create_time = psutil.Process(proc.pid).create_time()
        assert cache.process_matches(proc.pid, create_time + 50.0, check) is False  # not the recorded one
        assert cache.process_matches(proc.pid, create_time, check) is True
        assert cache.process_matches(proc.pid, create_time, check) is True
        assert len(checks) == 2  # the second time, the pidfd alone
        proc.kill()
        proc.wait()
        assert cache.process_matches(proc.pid, create_time, check) is False
    finally:
        proc.kill()
        proc.wait()
        cache.close()


def test_observe_with_the_cache_sees_what_observe_without_it_sees(tmp_path: Path) -> None:
    run_dir = run_dir_in(tmp_path)
    me = psutil.Process()
    write_json(run_dir / "pid.json", {"pid": me.pid, "pgid": os.getpgid(0), "create_time": me.create_time()})
    attempt = attempt_of(pid=me.pid, proc_create_time=me.create_time())
    now = [100.0]
    cache = ObserveCache(monotonic_s=lambda: now[0])
    for _ in range(2):
        cached, plain = observe(run_dir, 1.0, attempt, cache), observe(run_dir, 1.0, attempt)
        assert cached == plain and cached.launcher_alive and cached.process_alive
    write_json(run_dir / "exit.json", {"exit_code": 3})
    # its wrapper still runs: the record is seen at the refresh, or once the wrapper has ended
    assert observe(run_dir, 1.0, attempt, cache).exit_record is None
    now[0] += PROGRESS_REFRESH_S
    assert observe(run_dir, 1.0, attempt, cache).exit_record == {"exit_code": 3}
    cache.close()


def test_new_progress_lines_alone_wait_for_the_refresh(tmp_path: Path) -> None:
    run_dir = run_dir_in(tmp_path)
    write_json(run_dir / "pid.json", {"pid": 12345, "pgid": 12345, "create_time": 1.0})
    progress = run_dir / "progress.jsonl"
    with open(progress, "a") as handle:
        handle.write(json.dumps({"t": 1.0, "step": 1}) + "\n")
    cache = ObserveCache()
    first = cache.run_files(run_dir, max_age_s=60.0)
    assert first.last_progress == {"t": 1.0, "step": 1}
    with open(progress, "a") as handle:
        handle.write(json.dumps({"t": 2.0, "step": 2}) + "\n")
    held = cache.run_files(run_dir, max_age_s=60.0)
    assert held is first  # the step and its time stay as they were read, together
    assert cache.run_files(run_dir, max_age_s=0.0).last_progress == {"t": 2.0, "step": 2}
    # anything but an append is read at once: the file replaced, or an exit record
    write_json(progress, {"t": 3.0, "step": 3})
    assert cache.run_files(run_dir, max_age_s=60.0).last_progress == {"t": 3.0, "step": 3}
    write_json(run_dir / "exit.json", {"exit_code": 0})
    assert cache.run_files(run_dir, max_age_s=60.0).exit_record == {"exit_code": 0}


def test_a_settled_attempts_files_are_not_looked_at_between_refreshes(  # type: ignore[no-untyped-def]
    tmp_path: Path, monkeypatch
) -> None:
    from orchestrator.attempts import observe_cache

    run_dir = run_dir_in(tmp_path)
    now = [100.0]
    cache = ObserveCache(monotonic_s=lambda: now[0])
    looked: list[Path] = []
    real = observe_cache.signature
    monkeypatch.setattr(observe_cache, "signature", lambda d: looked.append(d) or real(d))
    # before the wrapper has recorded itself, its launcher being alive holds nothing back
    cache.run_files(run_dir, 5.0, settled=True)
    assert cache.run_files(run_dir, 5.0, settled=True).pid_record is None and len(looked) == 2
    write_json(run_dir / "pid.json", {"pid": 12345, "pgid": 12345, "create_time": 1.0})
    assert cache.run_files(run_dir, 5.0, settled=True).pid_record is not None
    write_json(run_dir / "exit.json", {"exit_code": 0})
    looked.clear()
    assert cache.run_files(run_dir, 5.0, settled=True).exit_record is None and not looked  # unlooked-at
    assert cache.run_files(run_dir, 5.0).exit_record == {"exit_code": 0}  # not settled: looked at
    write_json(run_dir / "exit.json", {"exit_code": 1})
    assert cache.run_files(run_dir, 5.0, settled=True).exit_record == {"exit_code": 1}  # an end is never held
    os.unlink(run_dir / "exit.json")
    cache.run_files(run_dir, 5.0)
    looked.clear()
    now[0] += 5.0  # the refresh: looked at again
    assert cache.run_files(run_dir, 5.0, settled=True).exit_record is None and len(looked) == 1
    cache.close()


def test_a_refresh_after_appended_lines_reads_only_the_progress(  # type: ignore[no-untyped-def]
    tmp_path: Path, monkeypatch
) -> None:
    run_dir = run_dir_in(tmp_path)
    write_json(run_dir / "pid.json", {"pid": 12345, "pgid": 12345, "create_time": 1.0})
    progress = run_dir / "progress.jsonl"
    with open(progress, "a") as handle:
        handle.write(json.dumps({"t": 1.0, "step": 1}) + "\n")
    whole: list[Path] = []
    real = runfiles.read_run_files
    monkeypatch.setattr(runfiles, "read_run_files", lambda d, **kw: whole.append(d) or real(d, **kw))
    cache = ObserveCache()
    first = cache.run_files(run_dir, max_age_s=0.0)
    with open(progress, "a") as handle:
        handle.write(json.dumps({"t": 2.0, "step": 2}) + "\n")
    again = cache.run_files(run_dir, max_age_s=0.0)
    assert again.last_progress == {"t": 2.0, "step": 2} and again.pid_record == first.pid_record
    assert len(whole) == 1  # the records were not read again
    write_json(run_dir / "exit.json", {"exit_code": 0})  # a new record: everything is read
    assert cache.run_files(run_dir, max_age_s=0.0).exit_record == {"exit_code": 0} and len(whole) == 2
    cache.close()
