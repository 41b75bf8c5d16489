"""A worker that attacks its own run dir: `python hostile_worker.py CONFIG RUN_DIR`.

The config's `corrupt` key names what it does (see MODES); `victim_pid` / `victim_create_time`
name a process for a forged pid.json; `hold_s` is how long it stays alive afterwards;
`ignore_term: true` makes it ignore SIGTERM (a hung worker that will not stop); `link_target`
is where its symlinks point (/etc/passwd unless given: a test that runs beside others which add
Unix users points them at a canary file of its own).
Standard library only, like a user's script.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

HUGE = 12 * 1024 * 1024


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.hostile")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _swap_for(path: Path, kind: str, link_target: str = "/etc/passwd") -> None:
    """Put something that is not a regular file where `path` was."""
    if path.is_dir() and not path.is_symlink():
        os.rmdir(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(link_target)
    elif kind == "dangling":
        path.symlink_to("/nonexistent/orch-target")


def _link_target(config: dict[str, object]) -> str:
    return str(config.get("link_target", "/etc/passwd"))


def _pid_json(run_dir: Path, **fields: object) -> None:
    record = json.loads((run_dir / "pid.json").read_text())
    record.update(fields)
    _replace(run_dir / "pid.json", json.dumps(record).encode())


def _result(run_dir: Path, text: str) -> None:
    _replace(run_dir / "result.json", text.encode())


def _progress(run_dir: Path, data: bytes) -> None:
    with open(run_dir / "progress.jsonl", "ab") as handle:
        handle.write(data)


def corrupt(mode: str, run_dir: Path, config: dict[str, object]) -> None:
    pid = run_dir / "pid.json"
    if mode == "pid_str":
        _pid_json(run_dir, pid="abc")
    elif mode == "pid_huge":
        _replace(pid, pid.read_text().replace('"pid": ', '"pid": 1e30, "x": ', 1).encode())
    elif mode == "pid_negative":
        _pid_json(run_dir, pid=-5, pgid=-5)
    elif mode == "create_time_str":
        _pid_json(run_dir, create_time="abc")
    elif mode == "pgid_str":
        _pid_json(run_dir, pgid="x")
    elif mode == "pgid_one":
        _pid_json(run_dir, pgid=1)
    elif mode == "pid_forged":
        _pid_json(run_dir, pid=config["victim_pid"], pgid=config["victim_pid"],
                  create_time=config["victim_create_time"])
    elif mode == "pid_garbage":
        _replace(pid, b"{not json")
    elif mode == "pid_list":
        _replace(pid, b"[1, 2, 3]")
    elif mode == "pid_binary":
        _replace(pid, os.urandom(4096))
    elif mode == "pid_huge_file":
        _replace(pid, b" " * HUGE + b"{}")
    elif mode in ("pid_dir", "pid_fifo", "pid_symlink"):
        _swap_for(pid, mode.split("_")[1], _link_target(config))
    elif mode == "exit_str":
        _replace(run_dir / "exit.json", json.dumps({"exit_code": "x", "signal": "y"}).encode())
    elif mode == "exit_dir":
        _swap_for(run_dir / "exit.json", "dir")
    elif mode == "result_infinity":
        _result(run_dir, '{"status": "succeeded", "peak_mem_mib": Infinity, "metrics": {}}')
    elif mode == "result_1e308":
        _result(run_dir, '{"status": "succeeded", "peak_mem_mib": 1e308, "metrics": {}}')
    elif mode == "result_1e400":
        _result(run_dir, '{"status": "succeeded", "peak_mem_mib": 1e400, "longest_tokens": 1e400}')
    elif mode == "result_bigint":
        _result(run_dir, '{"status": "succeeded", "peak_mem_mib": ' + "9" * 4000 + "}")
    elif mode == "result_metrics_list":
        _result(run_dir, '{"status": "succeeded", "metrics": [1, 2, 3]}')
    elif mode == "result_metrics_str":
        _result(run_dir, '{"status": "succeeded", "metrics": {"test": "high"}}')
    elif mode == "result_wrong_types":
        _result(run_dir, '{"status": 7, "error": ["x"], "longest_tokens": "many", "steps": -1}')
    elif mode == "result_deep":
        _result(run_dir, "[" * 100000 + "]" * 100000)
    elif mode == "result_binary":
        _result(run_dir, os.urandom(8192).decode("latin-1"))
    elif mode == "result_huge":
        _replace(run_dir / "result.json", b'{"status": "succeeded", "error": "' + b"x" * HUGE + b'"}')
    elif mode in ("result_dir", "result_fifo", "result_symlink"):
        _swap_for(run_dir / "result.json", mode.split("_")[1], _link_target(config))
    elif mode == "progress_step_str":
        _progress(run_dir, b'{"step": "10/100", "total": 100, "loss": "NaN"}\n')
    elif mode == "progress_nan":
        _progress(run_dir, b'{"step": 5, "total": 10, "loss": NaN, "peak_mem_mib": 1e308}\n')
    elif mode == "progress_binary":
        _progress(run_dir, os.urandom(16384))
    elif mode == "progress_huge_line":
        _progress(run_dir, b'{"step": ' + b"1" * HUGE)
    elif mode in ("progress_dir", "progress_fifo", "progress_symlink"):
        _swap_for(run_dir / "progress.jsonl", mode.split("_")[1], _link_target(config))
    elif mode == "log_symlink":
        _swap_for(run_dir / "stdout.log", "symlink", _link_target(config))
    elif mode == "log_fifo":
        _swap_for(run_dir / "stdout.log", "fifo")
    elif mode == "log_binary":
        sys.stdout.buffer.write(os.urandom(65536))
        sys.stdout.flush()
    elif mode == "rundir_symlink":
        # move the run dir away and leave a symlink in its place
        moved = run_dir.with_name(run_dir.name + ".moved")
        os.rename(run_dir, moved)
        run_dir.symlink_to(moved)
    elif mode == "rundir_to_outside":
        # move the run dir aside and leave a symlink to a folder outside the runs tree
        os.rename(run_dir, run_dir.with_name(run_dir.name + ".moved"))
        run_dir.symlink_to(str(config["outside_dir"]))
    elif mode == "forge_neighbours":
        # write an exit.json and a result.json saying "failed" into every other attempt's dir
        deadline = time.monotonic() + float(str(config.get("forge_s", "2")))
        while time.monotonic() < deadline:
            for other in run_dir.parents[2].glob("*/*/attempt-*"):
                if other != run_dir and not other.is_symlink():
                    _replace(other / "exit.json", b'{"exit_code": 1, "signal": null, "ended_at": "forged"}')
                    _result(other, '{"status": "failed", "error": "forged by another attempt", "metrics": {}}')
            time.sleep(0.05)
    elif mode == "none":
        pass
    else:
        raise SystemExit(f"unknown corrupt mode {mode!r}")


def main() -> int:
    config_path, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    config: dict[str, object] = {}
    for line in config_path.read_text().splitlines():  # flat `key: value` lines (orch dumps YAML)
        key, _, value = line.partition(": ")
        config[key.strip()] = value.strip().strip("'\"")
    if config.get("ignore_term") == "true":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for key in ("victim_pid",):
        if key in config:
            config[key] = int(str(config[key]))
    if "victim_create_time" in config:
        config["victim_create_time"] = float(str(config["victim_create_time"]))
    time.sleep(0.2)  # let the wrapper record the child pid first
    corrupt(str(config.get("corrupt", "none")), run_dir, config)
    print(f"hostile worker: did {config.get('corrupt')}", flush=True)
    time.sleep(float(str(config.get("hold_s", "1"))))
    return int(str(config.get("exit_code", "0")))


if __name__ == "__main__":
    sys.exit(main())
