"""A worker whose processes leave its process group: `python escaping_worker.py CONFIG RUN_DIR`.

`escape: setsid_hang`: leaves its session, ignores SIGTERM and stays silent (a hung worker that
will not stop); from attempt 2 on it says whether attempt 1's process still lives, and exits.
`escape: double_fork_gpu`: a grandchild leaves the session and holds `hold_mib` of simulated
GPU memory; the worker itself exits 0 at once.
Each escaped process writes its pid to `escaped.pid` in the run dir.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def _config(path: Path) -> dict[str, str]:
    config: dict[str, str] = {}
    for line in path.read_text().splitlines():  # flat `key: value` lines (orch dumps YAML)
        key, _, value = line.partition(": ")
        config[key.strip()] = value.strip().strip("'\"")
    return config


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def setsid_hang(run_dir: Path) -> int:
    attempt = int(os.environ.get("ORCH_ATTEMPT", "1"))
    if attempt > 1:
        earlier = run_dir.with_name(f"attempt-{attempt - 1}") / "escaped.pid"
        alive = earlier.exists() and _alive(int(earlier.read_text()))
        (run_dir / "predecessor.txt").write_text(f"alive: {alive}\n")
        print(f"attempt {attempt}: the process of attempt {attempt - 1} alive: {alive}", flush=True)
        return 0
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (run_dir / "escaped.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(60)  # silent: no output, no progress


def double_fork_gpu(run_dir: Path, config: dict[str, str]) -> int:
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            from orchestrator.gpu.sim_files import gpu_dir, parse_sizes_mib
            from workers.sim import SimAllocation

            sizes = parse_sizes_mib(os.environ["ORCH_SIM_GPUS"])
            index = int(os.environ.get("ORCH_GPU_INDEX", "0"))
            alloc = SimAllocation(gpu_dir(Path(os.environ["ORCH_SIM_DIR"]), index), sizes[index])
            alloc.allocate(int(config["hold_mib"]))
            (run_dir / "escaped.pid").write_text(str(os.getpid()))
            time.sleep(600)
        os._exit(0)
    os.wait()
    deadline = time.monotonic() + 30
    while not (run_dir / "escaped.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # until the grandchild holds its memory
    print('{"accuracy": 0.5}', flush=True)
    return 0


def main() -> int:
    config_path, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    config = _config(config_path)
    if config.get("escape") == "setsid_hang":
        return setsid_hang(run_dir)
    return double_fork_gpu(run_dir, config)


if __name__ == "__main__":
    sys.exit(main())
