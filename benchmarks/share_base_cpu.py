"""`share_base: sequential` against `off` through the real daemon, on CPU: a check of the
mechanism, not a timed test.

2 configs × 4 seeds of the LoRA worker's tiny Llama (bf16, LoRA dropout 0.1, RTE sample data),
plan 2 on one simulated 24 GiB card (real daemon, tmux, SQLite and worker processes; only the GPU
is simulated). Each mode gets its own state database; the time is from `orch daemon start` to
every job ended. Every per-seed figure (test and val metrics, best step, final loss, loss summary
and each step's loss, gradient norm and validation) is compared between the modes.

    python -m benchmarks.share_base_cpu [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.noisy_rte import flip_every_fourth_label, numerics_config
from orchestrator.daemon.state import runs_dir, tmux_socket_name
from workers.lora.sample_data import main as write_sample_data

REPO = Path(__file__).resolve().parents[1]
SEEDS = (1, 2, 3, 4)


def configs(data: Path, steps: int) -> dict[str, dict[str, Any]]:
    narrow = numerics_config(
        data, steps=steps, eval_every_steps=5, prec="bf16", seed=0, dropout=0.1
    )
    del narrow["seed"]  # each job's seed comes from its pair
    wide = {
        **narrow,
        "learning_rate": 5e-3,
        "peft": {"r": 4, "alpha": 4, "dropout": 0.1, "targets": ["q_proj", "k_proj", "o_proj"]},
    }
    return {"narrow": narrow, "wide": wide}


def run_mode(
    root: Path, mode: str, data: Path, steps: int
) -> tuple[float, dict[tuple[str, int], Any]]:
    """Seconds from daemon start to every job ended, and each job's figures by (config, seed)."""
    root.mkdir(parents=True)
    plans = root / "plans"
    for name, content in configs(data, steps).items():
        (plans / "configs" / "tiny").mkdir(parents=True, exist_ok=True)
        (plans / "configs" / "tiny" / f"{name}.yaml").write_text(yaml.safe_dump(content))
    suite = {
        "worker": "lora",
        "mem_gib": 2,
        "configs": ["narrow", "wide"],
        "share_base": mode,
        "hang_timeout_s": 600,
        "env": {"ORCH_WORKER_DEVICE": "cpu"},
    }
    (plans / "suites").mkdir(parents=True)
    (plans / "suites" / "tiny.yaml").write_text(yaml.safe_dump(suite))
    db = root / "state.db"
    env = {
        **os.environ,
        "ORCH_DB": str(db),
        "ORCH_PLANS": str(plans),
        "ORCH_GPU_BACKEND": "sim",
        "ORCH_SIM_GPUS": "1x24GiB",
        "ORCH_SIM_DIR": str(root / "sim"),
        "ORCH_LAUNCHER": "tmux",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }

    def orch(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return done.stdout

    pairs = " ".join(f"{seed}:glue-tvt_rte" for seed in SEEDS)
    orch("submit", "--suite", "tiny", "--pairs", pairs, "--gpu-plan", "2")
    started = time.monotonic()
    orch("daemon", "start", "--poll", "0.2")
    try:
        while True:
            jobs = json.loads(orch("jobs", "--json"))
            if all(job["state"] in ("succeeded", "failed", "cancelled") for job in jobs):
                break
            time.sleep(0.5)
        elapsed_s = time.monotonic() - started
    finally:
        orch("daemon", "stop", "--timeout", "30")
        subprocess.run(
            ["tmux", "-L", tmux_socket_name(db), "kill-server"], check=False, capture_output=True
        )
    assert all(job["state"] == "succeeded" for job in jobs), jobs
    return elapsed_s, figures(runs_dir(db) / "tiny")


def figures(suite_runs: Path) -> dict[tuple[str, int], Any]:
    found: dict[tuple[str, int], Any] = {}
    for result_path in sorted(suite_runs.glob("*/attempt-*/result.json")):
        _, config, seed, _ = result_path.parent.parent.name.split("-", 3)
        result = json.loads(result_path.read_text())
        progress = [
            json.loads(line)
            for line in (result_path.parent / "progress.jsonl").read_text().splitlines()
        ]
        found[(config, int(seed[1:]))] = {
            "metrics": result["metrics"],
            "best_step": result["best_step"],
            "final_loss": result["final_loss"],
            "loss_summary": result["loss_summary"],
            "steps": [
                (p["step"], p.get("loss"), p.get("grad_norm"), p.get("val")) for p in progress
            ],
            "share_base": result.get("share_base", "off"),
        }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="share-base-") as tmp:
        root = Path(tmp)
        data = root / "data"
        write_sample_data(
            ["--out", str(data), "--tasks", "rte", "--n-train", "60", "--n-dev", "40"]
        )
        flip_every_fourth_label(data)
        off_s, off = run_mode(root / "off", "off", data, args.steps)
        sequential_s, sequential = run_mode(root / "sequential", "sequential", data, args.steps)
    print(
        f"2 configs x {len(SEEDS)} seeds, tiny Llama bf16, dropout 0.1, {args.steps} steps, "
        "plan 2, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"share_base off:        {off_s:6.1f} s")
    print(f"share_base sequential: {sequential_s:6.1f} s  ({sequential_s / off_s:.2f} x off)")
    assert set(off) == set(sequential) and len(off) == 2 * len(SEEDS)
    differing = [
        key
        for key in off
        if {**off[key], "share_base": ""} != {**sequential[key], "share_base": ""}
    ]
    warm = sum(figures["share_base"] == "sequential" for figures in sequential.values())
    print(f"jobs trained in a warm process: {warm} of {len(sequential)}")
    print(
        f"per-seed figures bit-identical: {len(off) - len(differing)} of {len(off)}"
        + (f" (differ: {differing})" if differing else "")
    )
    return 0 if not differing else 1


if __name__ == "__main__":
    raise SystemExit(main())
