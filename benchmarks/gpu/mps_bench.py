"""CUDA MPS on one GPU: the throughput factor per co-located count, error containment, the
memory fence, and a sweep through `orch daemon run --mps` against the same sweep without it.

    python benchmarks/gpu/mps_bench.py factors --out OUT     # 1..4 warm processes, MPS off then on
    python benchmarks/gpu/mps_bench.py contain --out OUT     # one client's illegal memory access; the fence
    python benchmarks/gpu/mps_bench.py orch --out OUT --work /tmp/mps-orch   # 4 jobs, plan 4, --mps and not
    python benchmarks/gpu/mps_bench.py overlap --out OUT --steps 130          # scarce: --overlap and not

Every process is benchmarks/gpu/mps_worker.py (a 210M Llama, LoRA r=16, bf16, batch 32 of 256
random tokens). `factors` starts 4 processes, warms them up, then lets 1, 2, 3 and 4 of them
train `--steps` steps at once (the others idle with their CUDA context): T(N), the card's total
training throughput with N processes in solo-process units, is N x solo seconds / mean seconds
of the N. Once with no MPS, once with all four as clients of a control daemon that
orchestrator.gpu.mps starts. It writes OUT/mps-factors.json. `contain` writes OUT/mps-contain.json:
three clients training, one of which runs a kernel that writes through a bad pointer after 5 s;
what became of the two others, with MPS and without; and a client fenced at 2 GiB that asks for
3 GiB beside a neighbour. `orch` writes OUT/mps-orch.json: per attempt its training seconds (the
worker's own figure), its MPS variables, and the daemon's MPS events. `overlap` writes
OUT/mps-overlap.json: with a ballast leaving `--leave-gib`, `--jobs` jobs of `--batch` that cannot
share the card, through `orch daemon run` without and with `--overlap` (start-up overlap), each
attempt's start and end, and the start-up orch learned.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.gpu.mps import MpsControl, MpsDirs, client_env
from orchestrator.store.db import Store
from orchestrator.store.startups import read_startups
from orchestrator.store.sweep_attempts import all_attempts

WORKER = Path(__file__).resolve().parent / "mps_worker.py"


def _mps(root: Path) -> MpsControl:
    control = MpsControl(MpsDirs(root / "pipe", root / "log"), ())
    control.start()
    return control


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen([sys.executable, str(WORKER), *args], env={**os.environ, **env}, stdout=handle,
                            stderr=subprocess.STDOUT)  # fmt: skip


def _wait_files(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {[str(p) for p in paths if not p.exists()]}")
        time.sleep(0.02)


def factors_once(root: Path, steps: int, mps: bool) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    control = _mps(root / "mps") if mps else None
    env = client_env(control.dirs, 0, measured=False) if control else {}
    procs = [_spawn(["--phases", str(root), "--rank", str(r), "--steps", str(steps)], env, root / f"log-{r}.txt")
             for r in range(4)]  # fmt: skip
    try:
        _wait_files([root / f"ready-{r}" for r in range(4)], 240)
        seconds: dict[int, list[float]] = {}
        for k, n in enumerate((1, 2, 3, 4), start=1):
            (root / f"go-{k}").write_text(json.dumps(list(range(n))))
            _wait_files([root / f"done-{k}-{r}" for r in range(n)], 300)
            seconds[n] = [json.loads((root / f"done-{k}-{r}").read_text())["seconds"] for r in range(n)]
        (root / "stop").write_text("1")
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if control is not None:
            control.stop()
    solo = seconds[1][0]
    factor = {n: round(n * solo / (sum(s) / len(s)), 3) for n, s in seconds.items()}
    return {"mps": mps, "steps": steps, "seconds": {n: [round(x, 3) for x in s] for n, s in seconds.items()},
            "throughput": factor,
            "per_job_slowdown": {n: round(max(s) / solo, 3) for n, s in seconds.items()}}  # fmt: skip


def factors(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mpsf-"))
    plain = factors_once(work / "plain", args.steps, False)
    under = factors_once(work / "mps", args.steps, True)
    gain = {n: round(under["throughput"][n] / plain["throughput"][n], 3) for n in plain["throughput"]}
    return {"plain": plain, "mps": under, "mps_over_plain": gain}


def _tail(path: Path, n: int = 6) -> list[str]:
    return path.read_text(errors="replace").strip().splitlines()[-n:]


def contain_once(root: Path, mps: bool) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    control = _mps(root / "mps") if mps else None
    env = client_env(control.dirs, 0, measured=False) if control else {}
    try:
        neighbours = [_spawn(["--run-s", "25"], env, root / f"neighbour-{r}.txt") for r in range(2)]
        faulty = _spawn(["--fault-after-s", "5"], env, root / "faulty.txt")
        codes = {"faulty": faulty.wait(180)}
        for r, p in enumerate(neighbours):
            codes[f"neighbour-{r}"] = p.wait(180)
        server = ""
        if control is not None:
            server = control.ask("get_server_list").strip()
    finally:
        if control is not None:
            control.stop()
    return {"mps": mps, "exit_codes": codes, "server_list_after": server,
            "tails": {name: _tail(root / f"{name}.txt") for name in codes}}  # fmt: skip


def fence(root: Path) -> dict[str, Any]:
    """A client fenced at 2 GiB asks for 3 GiB while a neighbour (unfenced) trains."""
    root.mkdir(parents=True, exist_ok=True)
    control = _mps(root / "mps")
    try:
        neighbour = _spawn(["--run-s", "20"], client_env(control.dirs, 0, measured=False), root / "neighbour.txt")
        limited = {**client_env(control.dirs, 0, measured=False), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}
        over = _spawn(["--alloc-mib", "3072", "--steps", "5"], limited, root / "over.txt")
        under = _spawn(["--alloc-mib", "1024", "--steps", "5"], limited, root / "under.txt")
        codes = {"over": over.wait(180), "under": under.wait(180), "neighbour": neighbour.wait(180)}
    finally:
        control.stop()
    return {"exit_codes": codes, "tails": {n: _tail(root / f"{n}.txt", 3) for n in codes}}


def contain(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mpsc-"))
    return {"plain": contain_once(work / "plain", False), "mps": contain_once(work / "mps", True),
            "fence": fence(work / "fence")}  # fmt: skip


def orch_once(work: Path, tag: str, mps: bool, steps: int, budget_s: float, *, batch: int = 32, jobs: int = 4,
              mem_gib: float = 16, overlap: bool = False, warmup: int = 3) -> dict[str, Any]:
    from benchmarks.gpu.sweep_common import finish, orch, start_daemon

    root = work / tag
    shutil.rmtree(root, ignore_errors=True)
    (root / "plans" / "suites").mkdir(parents=True)
    (root / "plans" / "configs" / "mps").mkdir(parents=True)
    (root / "plans" / "configs" / "mps" / f"b{batch}.yaml").write_text(f"batch: {batch}\n")
    worker = f"{sys.executable} {WORKER} --steps {steps} --batch {{cfg.batch}} --warmup {warmup}"
    body = {"worker": worker, "mem_gib": mem_gib, "max_attempts": 3, "configs": [f"b{batch}"],
            "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}  # fmt: skip
    import yaml

    (root / "plans" / "suites" / "mps.yaml").write_text(yaml.safe_dump(body))
    db = root / "state.db"
    pairs = ",".join(f"{n}:x" for n in range(1, jobs + 1))
    orch(["submit", "--suite", "mps", "--pairs", pairs, "--gpu-plan", "4"], db, root / "plans")
    started = time.monotonic()
    daemon = start_daemon(db, ["--backend", "nvml", "--poll", "0.5", *(["--mps"] if mps else []),
                               *(["--overlap"] if overlap else [])])
    try:
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline and daemon.poll() is None:
            listed = json.loads(orch(["jobs", "--json"], db) or "[]")
            if listed and all(j["state"] in ("succeeded", "failed", "cancelled") for j in listed):
                break
            time.sleep(1.0)  # polling the sweep's progress
        wall_s = time.monotonic() - started
        runs = []
        for run_dir in sorted((root / "runs").rglob("attempt-*")):
            log_text = (run_dir / "stdout.log").read_text(errors="replace") if (run_dir / "stdout.log").exists() else ""
            last = [json.loads(x) for x in log_text.splitlines() if x.startswith('{"train_s"')]
            runs.append(
                {
                    "run_dir": run_dir.name,
                    "result": last[-1] if last else None,
                    "tail": log_text.splitlines()[-3:],
                }
            )
        status = orch(["status", "--json"], db, check=False)
    finally:
        finish(db, daemon, None)
    daemon_log = Path(str(db) + ".daemon.log").read_text(errors="replace").splitlines()
    with Store(db) as store:
        attempts = sorted(all_attempts(store), key=lambda a: a.started_at)
        startups = [{"key": key, "seconds": s.seconds, "held_mib": s.held_mib, "samples": s.samples}
                    for key, s in read_startups(store).items()]
    first = min((a.started_at for a in attempts), default=0.0)
    makespan = max((a.ended_at or 0.0 for a in attempts), default=0.0) - first
    spans = [{"job": a.job_id, "n": a.n, "started_at": round(a.started_at - first, 1),
              "ended_at": round((a.ended_at or first) - first, 1), "outcome": a.outcome.value if a.outcome else None,
              "peak_mib": a.peak_mib, "predicted_peak_mib": a.predicted_peak_mib} for a in attempts]
    return {"tag": tag, "mps": mps, "overlap": overlap, "wall_s": round(wall_s, 1), "makespan_s": round(makespan, 1),
            "spans": spans,
            "startups": startups, "attempts": runs,
            "mps_log_lines": [line for line in daemon_log if "MPS" in line][-10:],
            "status": json.loads(status) if status.strip().startswith("{") else None,
            "jobs": json.loads(orch(["jobs", "--json"], db, check=False) or "[]")}  # fmt: skip


def overlap(args: argparse.Namespace) -> dict[str, Any]:
    """Memory scarce (a ballast leaves --leave-gib): jobs that cannot share the card, through orch
    without and with --overlap."""
    from benchmarks.gpu.run_sweep import start_ballast

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    ballast, info = start_ballast(work, args.leave_gib)
    try:
        plain, ahead = (orch_once(work, tag, False, args.steps, args.budget_s, batch=args.batch, jobs=args.jobs,
                                  mem_gib=args.mem_gib, warmup=0, overlap=on)
                        for tag, on in (("no-overlap", False), ("overlap", True)))
    finally:
        os.killpg(ballast.pid, 9)
        ballast.wait(30)
    for run in (plain, ahead):
        run.pop("status", None)
    return {"ballast": info, "leave_gib": args.leave_gib, "plain": plain, "overlap": ahead,
            "speedup": round(plain["makespan_s"] / ahead["makespan_s"], 3) if ahead["makespan_s"] else None}


def orch_runs(args: argparse.Namespace) -> dict[str, Any]:
    work = args.work.resolve()
    return {"plain": orch_once(work, "plain", False, args.steps, args.budget_s),
            "mps": orch_once(work, "mps", True, args.steps, args.budget_s)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("factors", "contain", "orch", "overlap"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mps-orch"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--batch", type=int, default=64, help="overlap: per-job batch")
    parser.add_argument("--jobs", type=int, default=6, help="overlap: jobs per run")
    parser.add_argument("--mem-gib", type=float, default=14.0, help="overlap: declared per job")
    parser.add_argument("--leave-gib", type=float, default=20.0, help="overlap: memory the ballast leaves")
    args = parser.parse_args(argv)
    run = {"factors": factors, "contain": contain, "orch": orch_runs, "overlap": overlap}[args.what]
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2, default=str)
    (args.out / f"mps-{args.what}.json").write_text(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
