"""The torchrun job of tests/test_torchrun_e2e.py through orch on a GPU machine: per-rank peaks.

    python benchmarks/gpu/torchrun_orch.py --work /tmp/orch-torchrun --out OUT          # GPU, ~2 min
    python benchmarks/gpu/torchrun_orch.py --dry --work /tmp/tr-dry --out /tmp/tr-out    # sim GPUs, CPU

Two jobs of `examples/torchrun_tiny.py` (an MLP under DDP over gloo, CUDA tensors), each started
by `torchrun --nproc_per_node=... --master_port={port}` in its own tmux window by the daemon. On a
machine of two or more GPUs each job asks `gpus: 2` and gets `--nproc_per_node={nproc}`, one rank
per card; on a single GPU (where that is all there is) each job asks `gpus: 1` and runs 2 ranks
on that one card (the config's `ranks`), which exercises the same path. Reported per attempt in
OUT/torchrun-summary.json: its cards, its port, the per-rank peaks orch measured (NVML, per
process of the job's tree), the per-card peaks, the peak the ranks report themselves
(torch.cuda.max_memory_allocated, which excludes the CUDA context), host RAM and CPU peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def orch(args: list[str], env: dict[str, str], check: bool = True) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"orch {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def gpu_count(dry: bool) -> int:
    if dry:
        return 4
    import torch

    return torch.cuda.device_count()


def write_plans(plans: Path, gpus: int, hidden: int, steps: int) -> None:
    nproc = "{nproc}" if gpus > 1 else "{cfg.ranks}"
    worker = (f"{sys.executable} -m torch.distributed.run --nproc_per_node={nproc} --master_addr=127.0.0.1 "
              f"--master_port={{port}} {REPO / 'examples' / 'torchrun_tiny.py'} --steps {steps} --hidden {hidden} "
              "--batch {cfg.micro_batch} --step-s 0.05")  # fmt: skip
    (plans / "configs" / "tr").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "tr" / "ddp.yaml").write_text(yaml.safe_dump(
        {"gpus": min(gpus, 2), "ranks": 2, "micro_batch": 256}))
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "suites" / "tr.yaml").write_text(yaml.safe_dump(
        {"worker": worker, "mem_gib": 3, "configs": ["ddp"], "max_attempts": 2, "hang_timeout_s": 300}))


def summarize(db: Path) -> list[dict[str, Any]]:
    from orchestrator.rundir_files import RunDir
    from orchestrator.store import Store
    from orchestrator.store.sweep_attempts import all_attempts

    with Store(db, create=False) as store:
        attempts = all_attempts(store)
    out = []
    for a in attempts:
        reported: Any = None
        log = RunDir(a.run_dir).log
        if log.exists():
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
            reported = json.loads(lines[-1]).get("ranks") if lines else None
        out.append({
            "job": a.job_id, "outcome": None if a.outcome is None else a.outcome.value, "gpus": list(a.cards),
            "port": a.port, "per_rank_peak_mib": a.peak_by_rank, "per_card_peak_mib": a.peak_by_gpu,
            "peak_mib": a.peak_mib, "ranks_report_alloc_mib": reported, "host_peak_mib": a.host_peak_mib,
            "cpu_peak_cores": a.cpu_peak_cores,
            "seconds": None if a.ended_at is None else round(a.ended_at - a.started_at, 1),
        })  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry", action="store_true", help="simulated GPUs, ranks on the CPU")
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=4096)
    args = parser.parse_args()
    subprocess.run(["rm", "-rf", str(args.work)], check=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    db, plans = args.work / "state.db", args.work / "plans"
    env = {**os.environ, "ORCH_DB": str(db), "ORCH_PLANS": str(plans), "COLUMNS": "160",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    backend = "nvml"
    if args.dry:
        backend = "sim"
        env.update(ORCH_GPU_BACKEND="sim", ORCH_SIM_GPUS="4x24GiB", ORCH_SIM_DIR=str(args.work / "sim"))
    gpus = gpu_count(args.dry)
    write_plans(plans, gpus, args.hidden if not args.dry else 64, args.steps if not args.dry else 20)
    orch(["submit", "--suite", "tr", "--pairs", "1:glue_rte 2:glue_rte", "--gpu-plan", "2"], env)
    log = open(str(db) + ".daemon.log", "ab")  # noqa: SIM115  (the daemon writes it until it exits)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "daemon", "run", "--db", str(db), "--backend", backend, "--poll", "0.5"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO, env=env,
    )  # fmt: skip
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.budget_s:
            jobs = json.loads(orch(["jobs", "--json"], env))
            states = [j["state"] for j in (jobs["jobs"] if isinstance(jobs, dict) else jobs)]
            if states and all(s in ("succeeded", "failed", "cancelled") for s in states):
                break
            time.sleep(2)
        else:
            orch(["cancel", "--all"], env, check=False)
    finally:
        orch(["daemon", "stop", "--timeout", "20"], env, check=False)
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
        from orchestrator.daemon.state import tmux_socket_name

        subprocess.run(["tmux", "-L", tmux_socket_name(db), "kill-server"], capture_output=True, check=False)
    attempts = summarize(db)
    summary = {"gpus_on_machine": gpus, "ranks_per_job": 2, "one_card_for_both_ranks": gpus < 2,
               "wall_s": round(time.monotonic() - started, 1), "attempts": attempts}  # fmt: skip
    (args.out / "torchrun-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2), flush=True)
    return 0 if attempts and all(a["outcome"] == "succeeded" for a in attempts) else 1


if __name__ == "__main__":
    sys.exit(main())
