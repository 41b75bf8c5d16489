"""`orch memory [--json]`, `orch memory forget SHAPE|--suite S`: what orch has learned per job
shape (peak, OOM floor, samples, running attempts' peaks, throughput by jobs per card)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli.common import db_option, echo_json, json_option, open_store
from orchestrator.errors import UsageError
from orchestrator.plans.inputs import check_text
from orchestrator.shapes import RunningPeak, measured_margin, running_margin, shape_label
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import gpu_indexes
from orchestrator.store.learning import (
    forget_shapes,
    list_shapes,
    live_attempts_and_jobs,
    read_throughput,
    shape_known,
    suite_known,
)
from orchestrator.throughput import relative_curve


def _running(store: Store) -> tuple[dict[str, RunningPeak], dict[str, tuple[str, str]]]:
    """Shape key -> its running attempts past step K; shape key -> (suite, label) of a live
    attempt of it, for shapes nothing has been learned of yet."""
    from orchestrator.learned import running_peaks
    from orchestrator.prediction import (  # the ladder: not for every CLI start
        JobShapeCache,
        attempt_shape_key,
    )

    live, jobs = live_attempts_and_jobs(store)
    cache = JobShapeCache()
    key_of: dict[int, str] = {}  # attempt id -> shape key, worked out once per attempt
    names: dict[str, tuple[str, str]] = {}
    for attempt in live:
        job = jobs.get(attempt.job_id)
        if job is not None:
            key = key_of[attempt.id] = attempt_shape_key(job, attempt, cache)
            names.setdefault(key, (job.suite, shape_label(job.config_name, attempt.level, job.data)))
    return running_peaks(live, jobs, lambda _job, attempt: key_of[attempt.id]), names


def memory_snapshot(store: Store) -> list[dict[str, Any]]:
    """One entry per shape that has a learned row, running attempts past step K, or throughput."""
    rows = {r.shape_key: r for r in list_shapes(store)}
    running, names = _running(store)
    rates: dict[str, dict[str, dict[int, float]]] = {}
    for t in read_throughput(store):
        rates.setdefault(t.shape_key, {}).setdefault(t.gpu_uuid, {})[t.tenants] = t.samples_per_s
    out: list[dict[str, Any]] = []
    named: dict[str, tuple[str | None, str | None]] = {
        key: (row.suite, row.label) if row is not None and row.label else names.get(key, (None, None))
        for key in set(rows) | set(running) | set(rates)
        for row in (rows.get(key),)
    }
    for key in sorted(named, key=lambda k: (named[k][1] or "", k)):
        suite, label = named[key]
        row = rows.get(key)
        run = running.get(key)
        peak, floor = (row.peak_mib, row.oom_floor_mib) if row else (None, None)
        samples = row.samples if row else 0
        if peak:
            source, margin = f"measured ({samples} attempt{'s' if samples != 1 else ''})", measured_margin(samples)
        elif run is not None:
            source, margin = f"measured (running, step {run.step})", running_margin(run.step)
        elif floor:
            source, margin = "OOM floor", measured_margin(1)
        else:
            source, margin = "throughput only", 0.0
        out.append({
            "shape": key, "suite": suite, "label": label,
            "peak_mib": peak, "oom_floor_mib": floor, "samples": samples,
            "running": None if run is None else {"peak_mib": run.peak_mib, "step": run.step, "attempts": run.attempts},
            "source": source, "margin": round(margin, 3),
            "throughput": {
                gpu: {"samples_per_s": {str(k): round(v, 2) for k, v in sorted(by_k.items())},
                      "relative": {str(k): round(v, 2) for k, v in relative_curve(by_k).items()}}
                for gpu, by_k in sorted(rates.get(key, {}).items())
            },
        })  # fmt: skip
    return out


def _gib(mib: int | None) -> str:
    return "-" if not mib else f"{mib / 1024:.1f} GiB"


def render(entries: list[dict[str, Any]], gpu_index: dict[str, int] | None = None) -> str:
    if not entries:
        return "nothing learned yet"
    lines = [f"{'shape':<40} {'peak':>9} {'floor':>9} {'n':>3} {'margin':>6}  source / throughput"]
    for e in entries:
        # configs of the same name in two suites are two shapes: the suite tells them apart
        name = (f"{e['suite']}/{e['label']}" if e["suite"] else e["label"]) or e["shape"][:40]
        peak = e["peak_mib"] or (e["running"] or {}).get("peak_mib")
        lines.append(
            f"{name[:40]:<40} {_gib(peak):>9} {_gib(e['oom_floor_mib']):>9} {e['samples']:>3} "
            f"{e['margin']:>6.0%}  {e['source']}"
        )
        for gpu, curve in e["throughput"].items():
            relative = curve["relative"] or {}
            shown = ", ".join(f"{k}:{v}x" for k, v in relative.items()) or "no solo reading yet"
            card = f"GPU {gpu_index[gpu]}" if gpu_index and gpu in gpu_index else gpu[-12:]
            lines.append(f"{'':<40}   {card}: jobs per card -> throughput {shown}")
        lines.append(f"{'':<40}   key {e['shape']}")
    return "\n".join(lines)


@click.group("memory", invoke_without_command=True)
@json_option
@db_option
@click.pass_context
def memory_group(ctx: click.Context, as_json: bool, db_path: Path) -> None:
    """What orch has learned per job shape: peak, OOM floor, samples, throughput per card."""
    if ctx.invoked_subcommand is not None:
        return
    with open_store(db_path) as store:
        entries = memory_snapshot(store)
        cards = gpu_indexes(store, (gpu for e in entries for gpu in e["throughput"]))
    if as_json:
        echo_json({"shapes": entries})
    else:
        click.echo(render(entries, cards))


@memory_group.command("forget")
@click.argument("shape", required=False)
@click.option("--suite", default=None, help="Forget every shape this suite taught.")
@json_option
@db_option
def memory_forget(shape: str | None, suite: str | None, as_json: bool, db_path: Path) -> None:
    """Forget one shape (its key, from `orch memory`) or every shape a suite taught."""
    if (shape is None) == (suite is None):
        raise UsageError("give a SHAPE key or --suite NAME (one of them)")
    check_text("SHAPE" if shape is not None else "--suite", shape if shape is not None else str(suite))
    with open_store(db_path, create=False) as store:
        # every live attempt counts here, before step K too: its held memory is a floor
        _past_step_k, running = _running(store)
        if shape is not None and not shape_known(store, shape):
            if shape in running:
                raise UsageError(f"shape {shape!r} has learned nothing yet: only its running attempts, "
                                 "whose peak counts until they end")  # fmt: skip
            raise UsageError(f"no learned shape {shape!r} (see `orch memory`)")
        if suite is not None and not suite_known(store, suite):
            raise UsageError(f"no suite {suite!r} in this database (see `orch status`)")
        forgotten = forget_shapes(store, shape_key=shape, suite=suite)
    still_running = [key for key in forgotten if key in running]
    if as_json:
        echo_json({"forgotten": len(forgotten), "shapes": forgotten, "still_running": still_running,
                   "shape": shape, "suite": suite})  # fmt: skip
        return
    note = ""
    if still_running:
        note = (f"; {len(still_running)} of them still ha{'s' if len(still_running) == 1 else 've'} running "
                "attempts, whose peak counts until they end")  # fmt: skip
    click.echo(f"forgot {len(forgotten)} shape(s){note}")


def register(group: click.Group) -> None:
    group.add_command(memory_group)
