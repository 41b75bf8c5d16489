"""The run-dir boundary: every malformed value a hostile run used, refused and named, never
raised; files reached without following symlinks; the runs dir itself checked."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from rows_helpers import attempt_of
from run_dirs import private_attempt_dir

from orchestrator.attempts.reconcile import Verdict, judge, observe
from orchestrator.attempts.rundir_reads import (
    read_log_tail,
    read_output,
    read_result,
    read_run_files,
    stat_output,
)
from orchestrator.executors.lost_marker import mark_lost
from orchestrator.executors.observation import Observation
from orchestrator.executors.run_dir import prepare_run_dir
from orchestrator.executors.runs_tree import RunTreeError, check_runs_root

GOOD_PID = {"pid": 4242, "pgid": 4242, "create_time": 500.0}


@pytest.mark.parametrize(
    ("record", "named"),
    [
        ({**GOOD_PID, "pid": "abc"}, "pid.json: pid must be an integer"),
        ({**GOOD_PID, "pid": 1e30}, "pid.json: pid must be an integer"),
        ({**GOOD_PID, "pid": True}, "pid.json: pid must be an integer"),
        ({**GOOD_PID, "pid": -1}, "pid.json: pid must be an integer"),
        ({**GOOD_PID, "create_time": "abc"}, "pid.json: create_time must be a time"),
        ({**GOOD_PID, "pgid": "x"}, "pid.json: pgid must be an integer"),
        ([1, 2], "pid.json: not a JSON object"),
    ],
)
def test_invalid_pid_json_is_refused_and_named(tmp_path: Path, record: object, named: str) -> None:
    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "pid.json").write_text(json.dumps(record))
    files = read_run_files(run_dir)
    assert files.pid_record is None and files.pid_file_present
    assert any(named in p for p in files.problems), files.problems


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"status": "succeeded", "peak_mem_mib": 1e308}', "peak_mem_mib must be"),
        # NaN and infinities parse (a metric gone NaN keeps the run's others), and no field takes one
        ('{"status": "succeeded", "peak_mem_mib": Infinity}', "peak_mem_mib must be"),
        ('{"status": "succeeded", "peak_mem_mib": 1e400}', "peak_mem_mib must be"),
        ('{"status": "succeeded", "metrics": [1, 2]}', "metrics must be a mapping"),
        ("[" * 50000 + "]" * 50000, "not valid JSON"),
    ],
)
def test_invalid_result_fields_are_dropped_and_named(tmp_path: Path, text: str, named: str) -> None:
    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "result.json").write_text(text)
    problems: list[str] = []
    result = read_result(run_dir, problems)
    assert any(named in p for p in problems), problems
    if result is not None:
        assert "peak_mem_mib" not in result and isinstance(result["metrics"], dict)


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ('{"metrics": {"test": {"accuracy": 0.6}}}', None),  # optional: the exit code decides
        ('{"status": 7}', 7),  # kept for the classifier to name
        ('{"status": ["done"]}', "['done']"),
        ('{"status": "' + "x" * 100 + '"}', "'" + "x" * 36 + "..."),
    ],
)
def test_result_status_is_optional_and_any_value_is_kept_short(tmp_path: Path, text: str, status: object) -> None:
    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "result.json").write_text(text)
    problems: list[str] = []
    result = read_result(run_dir, problems)
    assert result is not None and result.get("status") == status and problems == []


def test_progress_with_a_step_like_10_of_100_is_dropped(tmp_path: Path) -> None:
    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "progress.jsonl").write_text(
        '{"step": 3, "total": 100}\n{"step": "10/100", "total": 100, "loss": 1.5}\n'
    )
    files = read_run_files(run_dir)
    assert files.last_progress == {"total": 100, "loss": 1.5}
    assert any("step must be" in p for p in files.problems)


@pytest.mark.parametrize("kind", ["dir", "fifo", "symlink", "huge"])
def test_wrong_kinds_of_file_are_refused(tmp_path: Path, kind: str) -> None:
    run_dir = private_attempt_dir(tmp_path)
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({**GOOD_PID}))
    path = run_dir / "pid.json"
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(target)
    else:
        path.write_bytes(b" " * (1 << 20) + json.dumps(GOOD_PID).encode())
    started = time.monotonic()
    files = read_run_files(run_dir)
    assert time.monotonic() - started < 5  # a FIFO never blocks the reader
    assert files.pid_record is None and files.problems


def test_a_symlinked_level_of_the_runs_tree_is_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "result.json").write_text('{"status": "succeeded"}')
    runs = tmp_path / "runs"
    (runs / "suite" / "job").mkdir(parents=True)
    runs.chmod(0o700)
    (runs / "suite" / "job" / "attempt-1").symlink_to(elsewhere)
    run_dir = runs / "suite" / "job" / "attempt-1"
    problems: list[str] = []
    assert read_result(run_dir, problems) is None
    assert any("symlink" in p for p in problems)
    with pytest.raises(RunTreeError, match="symlink"):
        prepare_run_dir(run_dir, {"model": "x"}, {})
    assert sorted(p.name for p in elsewhere.iterdir()) == ["result.json"]  # nothing written there
    assert mark_lost(run_dir)  # a run dir that is a link can hold no wrapper of ours
    assert not (elsewhere / "lost").exists()


def test_prepare_never_writes_through_a_planted_config_symlink(tmp_path: Path) -> None:
    # a dir holding anything is not the new attempt's: it goes aside with the link in it, untouched
    # (write_in_dir's replacing of a planted link is tested in test_rundir_files)
    run_dir = private_attempt_dir(tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    target.chmod(0o644)
    (run_dir / "config.yaml").symlink_to(target)
    assert prepare_run_dir(run_dir, {"model": "x"}, {}) == run_dir.with_name("attempt-1.stale-1")
    assert target.read_text() == "keep me" and oct(target.stat().st_mode & 0o777) == "0o644"
    assert not (run_dir / "config.yaml").is_symlink()
    assert (run_dir.with_name("attempt-1.stale-1") / "config.yaml").readlink() == target


def test_a_world_writable_runs_dir_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    with pytest.raises(RunTreeError, match="other users can write"):
        check_runs_root(runs, create=False)
    runs.rmdir()
    runs.symlink_to(tmp_path)
    with pytest.raises(RunTreeError, match="symlink"):
        check_runs_root(runs, create=False)


def test_invalid_pid_json_is_judged_on_the_launchers_process(tmp_path: Path) -> None:
    """A pid.json that is not valid JSON no longer leaves the attempt pending for ever: it is
    alive while the wrapper the launcher started runs, and lost once that is gone."""
    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "pid.json").write_text("{not json")
    me = attempt_of(id=1, started_at=time.time(), executor="tmux", executor_id="@1",
                    pid=os.getpid(), pgid=None, proc_create_time=__import__("psutil").Process().create_time(),
                    run_dir=str(run_dir))
    obs = observe(run_dir, time.time(), me)
    assert obs.pid_file_present and obs.pid_record is None and obs.launcher_alive
    assert judge(me, obs, 600) is Verdict.ALIVE
    gone: Observation = Observation(**{**obs.__dict__, "launcher_alive": False})
    assert judge(me, gone, 600) is Verdict.LOST


def test_log_reads_are_bounded_and_refuse_links_and_fifos(tmp_path: Path) -> None:
    run_dir = private_attempt_dir(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not show")
    (run_dir / "stdout.log").symlink_to(secret)
    assert read_log_tail(run_dir) == "" and stat_output(run_dir) is None
    assert read_output(run_dir, 0, 1024) == b""
    (run_dir / "stdout.log").unlink()
    os.mkfifo(run_dir / "stdout.log")  # a FIFO would block a plain open(): never read
    assert read_log_tail(run_dir) == "" and stat_output(run_dir) is None
    assert read_output(run_dir, 0, 1024) == b""
    (run_dir / "stdout.log").unlink()
    (run_dir / "stdout.log").write_bytes(b"x" * 100_000 + b"END")
    assert read_log_tail(run_dir, 10) == "xxxxxxxEND"
    assert read_output(run_dir, 99_998, 3) == b"xxE"
    found = stat_output(run_dir)
    assert found is not None and found.size_bytes == 100_003


def test_result_json_through_a_symlink_is_not_read(tmp_path: Path) -> None:
    run_dir = private_attempt_dir(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"status": "succeeded", "metrics": {"test": {"accuracy": 1.0}}}))
    (run_dir / "result.json").symlink_to(other)
    problems: list[str] = []
    assert read_result(run_dir, problems) is None
    assert any("symlink" in p for p in problems), problems
