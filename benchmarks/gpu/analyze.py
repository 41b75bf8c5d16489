"""Figures of one GPU sweep from its dumps (see run_sweep.py):

    python benchmarks/gpu/analyze.py SWEEP_DIR [--baseline SWEEP_DIR] [--out summary.json]

SWEEP_DIR holds dumps/{jobs,status,meta}.json, dumps/show/N.json, nvml.csv and runs/ (the
attempts' run dirs with pid.json and result.json), as run_sweep.py leaves it (or as its tarball
unpacks).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"n": len(values), "min": round(ordered[0], 3), "median": round(statistics.median(ordered), 3),
            "mean": round(statistics.fmean(ordered), 3), "max": round(ordered[-1], 3)}  # fmt: skip


def _local_run_dir(sweep: Path, recorded: str) -> Path:
    """The run dir under `sweep`, wherever the sweep ran (the recorded path is the device's)."""
    parts = Path(recorded).parts
    return sweep.joinpath(*parts[parts.index("runs") :]) if "runs" in parts else Path(recorded)


def load_attempts(sweep: Path) -> list[dict[str, Any]]:
    attempts = []
    for show_file in sorted((sweep / "dumps" / "show").glob("*.json"), key=lambda p: int(p.stem)):
        job = _read_json(show_file)
        if not job:
            continue
        for attempt in job.get("attempts", []):
            run_dir = _local_run_dir(sweep, attempt["run_dir"])
            attempts.append({
                "job": job["id"], "config": job.get("config"), "seed": job.get("seed"), **attempt,
                "started_s": _epoch(attempt.get("started_at")), "ended_s": _epoch(attempt.get("ended_at")),
                "pid_json": _read_json(run_dir / "pid.json"), "result": _read_json(run_dir / "result.json"),
                "config_yaml": (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else "",
            })  # fmt: skip
    return sorted(attempts, key=lambda a: a["started_s"] or 0.0)


def _samples(attempt: dict[str, Any]) -> int:
    """Training samples the attempt processed: steps × batch × accumulation."""
    import yaml

    config = yaml.safe_load(attempt["config_yaml"] or "{}") or {}
    steps = (attempt["result"] or {}).get("steps") or 0
    return (
        int(steps)
        * int(config.get("batch_size", 0))
        * int(config.get("gradient_accumulation_steps", 1))
    )


def oom_learning(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape (config, level): OOMs before its first success and after it; and per half."""
    first_success: dict[tuple[str, int], float] = {}
    for a in attempts:
        if a["outcome"] == "succeeded":
            first_success.setdefault((a["config"], a["level"]), a["ended_s"] or 0.0)
    per_shape: dict[str, dict[str, int]] = {}
    for a in attempts:
        if a["outcome"] != "oom":
            continue
        key = (a["config"], a["level"])
        bucket = per_shape.setdefault(
            f"{key[0]}@L{key[1]}", {"before_first_success": 0, "after": 0}
        )
        learned = key in first_success and (a["started_s"] or 0.0) > first_success[key]
        bucket["after" if learned else "before_first_success"] += 1
    starts = [a["started_s"] for a in attempts if a["started_s"]]
    middle = (min(starts) + max(starts)) / 2 if starts else 0.0
    ooms = [a for a in attempts if a["outcome"] == "oom"]
    return {
        "oom_attempts": len(ooms),
        "oom_first_half": sum(1 for a in ooms if (a["started_s"] or 0) <= middle),
        "oom_second_half": sum(1 for a in ooms if (a["started_s"] or 0) > middle),
        "per_shape": per_shape,
        "level0_ooms_by_seed_order": [
            {"job": a["job"], "config": a["config"], "seed": a["seed"], "n": a["n"], "level": a["level"],
             "predicted_mib": a.get("predicted_peak_mib"), "peak_mib": a.get("peak_mib")}
            for a in ooms
        ],
    }  # fmt: skip


def attribution(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for a in attempts:
        result = a["result"] or {}
        if a["outcome"] != "succeeded" or "peak_mem_mib" not in result:
            continue
        reserved, allocated = result["peak_mem_mib"], result.get("peak_mem_allocated_mib")
        rows.append({"job": a["job"], "n": a["n"], "config": a["config"], "level": a["level"],
                     "nvml_peak_mib": a.get("peak_mib"), "torch_reserved_mib": reserved,
                     "torch_allocated_mib": allocated,
                     "gap_nvml_minus_reserved_mib": (a.get("peak_mib") or 0) - reserved})  # fmt: skip
    return rows


def memory_in_use(sweep: Path, start_s: float, end_s: float) -> dict[str, Any]:
    path = sweep / "nvml.csv"
    if not path.exists():
        return {}
    used, jobs, util = [], [], []
    jobs_by_gpu: dict[str, list[float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if start_s <= float(row["t_s"]) <= end_s:
                used.append(float(row["used_mib"]))
                jobs.append(float(row["used_mib"]) - float(row["ballast_mib"] or 0))
                jobs_by_gpu.setdefault(row["gpu"], []).append(jobs[-1])
                if row["util_pct"] not in ("", "None"):
                    util.append(float(row["util_pct"]))
    free_for_jobs = None
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    if rows:
        first = rows[0]
        free_for_jobs = float(first["total_mib"]) - float(first["ballast_mib"] or 0)
    return {
        "samples": len(used),
        "mean_used_mib_all": round(statistics.fmean(used)) if used else None,
        "mean_used_mib_jobs": round(statistics.fmean(jobs)) if jobs else None,
        "max_used_mib_jobs": round(max(jobs)) if jobs else None,
        "mib_left_by_ballast": free_for_jobs,
        "mean_util_pct": round(statistics.fmean(util), 1) if util else None,
        # per card, so that a sweep on several GPUs shows whether every card was kept busy
        "mean_used_mib_jobs_by_gpu": {gpu: round(statistics.fmean(values))
                                      for gpu, values in sorted(jobs_by_gpu.items())},
    }  # fmt: skip


def _outcomes_by_gpu(attempts: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    by_gpu: dict[str, dict[str, int]] = {}
    for a in attempts:
        counts = by_gpu.setdefault(str(a.get("gpu")), {})
        counts[str(a["outcome"])] = counts.get(str(a["outcome"]), 0) + 1
    return dict(sorted(by_gpu.items()))


def analyze(sweep: Path) -> dict[str, Any]:
    attempts = load_attempts(sweep)
    meta = _read_json(sweep / "dumps" / "meta.json") or {}
    starts = [a["started_s"] for a in attempts if a["started_s"]]
    ends = [a["ended_s"] for a in attempts if a["ended_s"]]
    wall_s = (max(ends) - min(starts)) if starts and ends else None
    succeeded = [a for a in attempts if a["outcome"] == "succeeded"]
    samples = sum(_samples(a) for a in succeeded)
    latencies = [
        _epoch(a["pid_json"]["started_at"]) - a["started_s"]
        for a in attempts
        if a["pid_json"] and a["started_s"]
    ]
    jobs = _read_json(sweep / "dumps" / "jobs.json") or []
    job_states: dict[str, int] = {}
    for job in jobs:
        job_states[job["state"]] = job_states.get(job["state"], 0) + 1
    outcomes: dict[str, int] = {}
    for a in attempts:
        outcomes[str(a["outcome"])] = outcomes.get(str(a["outcome"]), 0) + 1
    durations = [
        a["ended_s"] - a["started_s"] for a in succeeded if a["ended_s"] and a["started_s"]
    ]
    return {
        "tag": meta.get("tag"), "gpu_plan": meta.get("gpu_plan"), "incomplete": meta.get("incomplete"),
        "jobs": len(jobs), "job_states": job_states, "attempts": len(attempts), "attempt_outcomes": outcomes,
        "wall_s": round(wall_s, 1) if wall_s else None,
        "sum_succeeded_attempt_s": round(sum(durations), 1),
        "succeeded_attempt_s": _stats(durations),
        "train_samples": samples,
        "sweep_samples_per_s": round(samples / wall_s, 2) if wall_s else None,
        "per_job_samples_per_s": _stats([a["result"]["samples_per_s"] for a in succeeded
                                         if a["result"] and a["result"].get("samples_per_s")]),
        "memory": memory_in_use(sweep, min(starts), max(ends)) if starts and ends else {},
        "ooms": oom_learning(attempts),
        "dispatch_latency_s": _stats(latencies),
        "attribution": attribution(attempts),
        "attempt_outcomes_by_gpu": _outcomes_by_gpu(attempts),
        "levels_of_successes": {f"{a['config']}@L{a['level']}": sum(
            1 for b in succeeded if (b["config"], b["level"]) == (a["config"], a["level"])) for a in succeeded},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    summary: dict[str, Any] = {"packed": analyze(args.sweep)}
    if args.baseline:
        summary["baseline"] = analyze(args.baseline)
        packed_s, base_s = summary["packed"]["wall_s"], summary["baseline"]["wall_s"]
        if packed_s and base_s:
            summary["speedup_wall"] = round(base_s / packed_s, 2)
    text = json.dumps(summary, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
