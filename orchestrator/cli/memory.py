"""`orch memory [--json]`, `orch memory forget SHAPE|--suite S`: what orch has learned per job
shape (peak, OOM floor, samples, running attempts' peaks, throughput by jobs per card)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli.common import db_option, echo_json, json_option, open_store
from orchestrator.cli.tables import plain_columns
from orchestrator.errors import UsageError
from orchestrator.plans.inputs import check_text
from orchestrator.prediction.families import FamilyFloor, FamilyPoint, fit_family
from orchestrator.prediction.fused_groups import split_group_key
from orchestrator.prediction.shapes import RunningPeak, measured_margin, running_margin, shape_label
from orchestrator.prediction.throughput import MIN_CURVE_STEPS, relative_curve, spread
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import gpu_indexes
from orchestrator.store.learning import (
    forget_shapes,
    list_shapes,
    live_attempts_and_jobs,
    read_family_members,
    read_throughput,
    shape_known,
    suite_known,
)
from orchestrator.store.rows import FamilyTag
from orchestrator.wording import one_line


def _running(store: Store) -> tuple[dict[str, RunningPeak], dict[str, tuple[str, str]], dict[str, FamilyTag]]:
    """Shape key -> its running attempts past step K; shape key -> (suite, label) of a live
    attempt of it, for shapes nothing has been learned of yet; shape key -> its family."""
    from orchestrator.prediction.job_facts import (  # the ladder: not for every CLI start
        JobShapeCache,
        attempt_family_tag,
        attempt_shape_key,
    )
    from orchestrator.prediction.learned import running_peaks

    live, jobs = live_attempts_and_jobs(store)
    cache = JobShapeCache()
    key_of: dict[int, str] = {}  # attempt id -> shape key, worked out once per attempt
    names: dict[str, tuple[str, str]] = {}
    tags: dict[str, FamilyTag] = {}
    for attempt in live:
        job = jobs.get(attempt.job_id)
        if job is not None:
            key = key_of[attempt.id] = attempt_shape_key(job, attempt, cache)
            names.setdefault(key, (job.suite, shape_label(job.config_name, attempt.level, job.data)))
            if (tag := attempt_family_tag(job, attempt, cache)) is not None:
                tags[key] = tag
    return running_peaks(live, jobs, lambda _job, attempt: key_of[attempt.id]), names, tags


def family_snapshot(store: Store, running: dict[str, RunningPeak], names: dict[str, tuple[str, str]],
                    live_tags: dict[str, FamilyTag],
                    taught: dict[str, tuple[str, ...]] | None = None) -> list[dict[str, Any]]:
    """One entry per memory family with a measured member or an OOM floor: its fit (fixed part,
    per sample or per sample-token), its error and margin, its points and floors, named by the
    suites and configs that taught it (`taught`: shape key -> every suite that taught it)."""
    members: dict[str, list[tuple[str, FamilyTag, int | None, bool, int | None, str | None, str | None]]] = {}
    learned = {m.shape_key: m for m in read_family_members(store)}
    for key, m in learned.items():
        run = running.get(key)
        peak = m.peak_mib or (run.peak_mib if run else None)
        members.setdefault(m.tag.family_key, []).append(
            (key, m.tag, peak, not m.peak_mib and run is not None, m.oom_floor_mib, m.suite, m.label))
    for key, tag in live_tags.items():
        if key not in learned and (run := running.get(key)) is not None:
            suite, label = names.get(key, (None, None))
            members.setdefault(tag.family_key, []).append((key, tag, run.peak_mib, True, None, suite, label))
    out: list[dict[str, Any]] = []
    for family_key, rows in sorted(members.items()):
        points = [FamilyPoint(t.batch_size, t.tokens, t.task, peak, running=r)
                  for _, t, peak, r, _, _, _ in rows if peak]
        floors = [FamilyFloor(t.batch_size, t.tokens, t.task, floor) for _, t, _, _, floor, _, _ in rows if floor]
        fit = fit_family(points, floors)
        suites = sorted({suite for key, *_, suite, _ in rows if suite}
                        | {each for key, *_ in rows for each in (taught or {}).get(key, ())})
        configs = sorted({label.split(" ")[0] for *_, label in rows if label}, key=lambda c: (len(c), c))
        out.append({
            "family": family_key, "name": f"{'/'.join(suites)}: {', '.join(configs)}",
            "model": family_key.split("|", 1)[-1],
            "fixed_mib": None if fit is None else round(fit.fixed_mib),
            "per_sample_mib": None if fit is None else round(fit.per_unit_mib, 3),
            "per_token": bool(fit and fit.per_token),
            "error": None if fit is None else round(fit.error_fraction, 4),
            "margin": None if fit is None else round(fit.margin_fraction, 3),
            "points": [{"batch_size": t.batch_size, "tokens": t.tokens, "task": t.task, "peak_mib": peak,
                        "running": r, "label": label} for _, t, peak, r, _, _, label in rows if peak],
            "floors": [{"batch_size": t.batch_size, "task": t.task, "oom_floor_mib": floor}
                       for _, t, _, _, floor, _, _ in rows if floor],
        })  # fmt: skip
    return out


def render_families(families: list[dict[str, Any]]) -> str:
    lines = ["", "memory families: peak ≈ fixed + per sample × batch (× tokens where known)"]
    for f in families:
        if f["fixed_mib"] is None:
            fit = "no member measured yet"
        else:
            unit = "sample-token" if f["per_token"] else "sample"
            fit = (f"fit {_gib(f['fixed_mib'])} + {f['per_sample_mib']:.1f} MiB per {unit}, "
                   f"error {f['error']:.0%}, margin {f['margin']:.0%}")
        lines.append(f"  {f['name']}" + (f" ({f['model']})" if f["model"] else "") + f": {fit}")
        points = sorted(f["points"], key=lambda p: (p["task"], p["batch_size"]))
        for p in points:
            how = "running" if p["running"] else "measured"
            lines.append(f"    batch {p['batch_size']:>5} {p['task']}: {_gib(p['peak_mib'])} ({how})")
        for floor in sorted(f["floors"], key=lambda p: (p["task"], p["batch_size"])):
            lines.append(f"    batch {floor['batch_size']:>5} {floor['task']}: at least "
                         f"{_gib(floor['oom_floor_mib'])} (OOM)")
    # each line as one_line shows it: the suites, configs, model and tasks it names are user text
    return "\n".join(one_line(line) for line in lines)


def memory_snapshot(store: Store) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One entry per shape that has a learned row, running attempts past step K, or throughput;
    one per memory family (`family_snapshot`)."""
    rows = {r.shape_key: r for r in list_shapes(store)}
    running, names, tags = _running(store)
    rates: dict[str, dict[str, dict[int, float]]] = {}
    counted: dict[str, dict[str, dict[int, float]]] = {}  # on enough steps: what the scheduler uses
    spreads: dict[str, dict[str, dict[int, float]]] = {}
    steps: dict[str, dict[str, dict[int, int]]] = {}
    for t in read_throughput(store):
        rates.setdefault(t.shape_key, {}).setdefault(t.gpu_uuid, {})[t.tenants] = t.samples_per_s
        steps.setdefault(t.shape_key, {}).setdefault(t.gpu_uuid, {})[t.tenants] = t.steps
        if t.steps < MIN_CURVE_STEPS:
            continue
        counted.setdefault(t.shape_key, {}).setdefault(t.gpu_uuid, {})[t.tenants] = t.samples_per_s
        if (gap := spread(t.rate_min, t.rate_max, t.samples_per_s)) is not None:
            spreads.setdefault(t.shape_key, {}).setdefault(t.gpu_uuid, {})[t.tenants] = gap
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
            # every suite that taught it (`suite`: the last one)
            "suites": list(row.suites) if row is not None and row.suites else [suite] if suite else [],
            # a fused process's peak with this many members (`<shape>|fused<k>`); null: one job's
            "fused_members": split_group_key(key)[1],
            "peak_mib": peak, "oom_floor_mib": floor, "samples": samples,
            "running": None if run is None else {"peak_mib": run.peak_mib, "step": run.step, "attempts": run.attempts},
            "source": source, "margin": round(margin, 3),
            "throughput": {
                gpu: {"samples_per_s": {str(k): round(v, 2) for k, v in sorted(by_k.items())},
                      "steps": {str(k): n for k, n in sorted(steps[key][gpu].items())},
                      "relative": {str(k): round(v, 2) for k, v in
                                   relative_curve(counted.get(key, {}).get(gpu, {})).items()},
                      "spread": {str(k): round(v, 2) for k, v in sorted(spreads.get(key, {}).get(gpu, {}).items())}}
                for gpu, by_k in sorted(rates.get(key, {}).items())
            },
        })  # fmt: skip
    return out, family_snapshot(store, running, names, tags, {key: row.suites for key, row in rows.items()})


def _gib(mib: int | None) -> str:
    return "-" if not mib else f"{mib / 1024:.1f} GiB"


def _throughput(e: dict[str, Any], gpu_index: dict[str, int] | None) -> str:
    """`GPU 0 1:1.0x, 2:1.8x; GPU 1 1:1.0x`: per card, jobs on it -> throughput in units of one job alone."""
    cards = []
    for gpu, curve in e["throughput"].items():
        relative, gaps = curve["relative"] or {}, curve.get("spread") or {}
        shown = ", ".join(f"{k}:{v}x" + (f" (±{gaps[k] / 2:.0%})" if k in gaps else "")
                          for k, v in relative.items()) or "no solo reading yet"
        cards.append(f"{f'GPU {gpu_index[gpu]}' if gpu_index and gpu in gpu_index else gpu[-12:]} {shown}")
    return "; ".join(cards) or "-"


def _unnamed(e: dict[str, Any]) -> str:
    """A shape no attempt named (its key's head), with its group size where it is a fused
    process's record: a named one says `fused ×k` in its label."""
    shape, members = split_group_key(e["shape"])
    return shape[:40] if members is None else f"{shape[:40]}, fused ×{members}"


def render(entries: list[dict[str, Any]], gpu_index: dict[str, int] | None = None, *, keys: bool = False) -> str:
    """One line per shape in aligned columns; its key (what `orch memory forget` takes) only
    with `keys`."""
    if not entries:
        return "nothing learned yet\n"
    headers = ["shape", "peak", "OOM floor", "runs", "margin", "learned from",
               "throughput (jobs on a card: × one job alone)", *(["key"] if keys else [])]
    rows = []
    for e in entries:
        # configs of the same name in two suites are two shapes: the suite tells them apart; a shape
        # two suites taught (the same config in both) names both
        suites = ",".join(e.get("suites") or ([e["suite"]] if e["suite"] else []))
        name = (f"{suites}/{e['label']}" if suites else e["label"]) or _unnamed(e)
        peak = e["peak_mib"] or (e["running"] or {}).get("peak_mib")
        rows.append([name, _gib(peak), _gib(e["oom_floor_mib"]), str(e["samples"]), f"{e['margin']:.0%}", e["source"],
                     _throughput(e, gpu_index), *([e["shape"]] if keys else [])])
    # each cell as one_line shows it: names and keys hold user text (a model path with a line break
    # or a right-to-left override would split a row or reorder it); --json keeps them raw
    return plain_columns(headers, [[one_line(cell) for cell in row] for row in rows])


@click.group("memory", invoke_without_command=True)
@click.option("--keys", is_flag=True, help="Add each shape's key (what `orch memory forget` takes).")
@json_option
@db_option
@click.pass_context
def memory_group(ctx: click.Context, keys: bool, as_json: bool, db_path: Path) -> None:
    """What orch has learned per job shape: peak, OOM floor, samples, throughput per card."""
    if ctx.invoked_subcommand is not None:
        return
    with open_store(db_path) as store:
        entries, families = memory_snapshot(store)
        cards = gpu_indexes(store, (gpu for e in entries for gpu in e["throughput"]))
    if as_json:
        echo_json({"shapes": entries, "families": families})
    else:
        click.echo(render(entries, cards, keys=keys), nl=False)
        if families:
            click.echo(render_families(families))


@memory_group.command("forget")
@click.argument("shape", required=False)
@click.option("--suite", default=None, help="Forget every shape this suite taught.")
@json_option
@db_option
def memory_forget(shape: str | None, suite: str | None, as_json: bool, db_path: Path) -> None:
    """Forget one shape (its key, from `orch memory --keys`) or every shape a suite taught."""
    if (shape is None) == (suite is None):
        raise UsageError("give a SHAPE key or --suite NAME (one of them)")
    check_text("SHAPE" if shape is not None else "--suite", shape if shape is not None else str(suite))
    with open_store(db_path, create=False) as store:
        # every live attempt counts here, before step K too: its held memory is a floor
        _past_step_k, running, _tags = _running(store)
        if shape is not None and not shape_known(store, shape):
            if shape in running:
                raise UsageError(f"shape {shape!r} has learned nothing yet: only its running attempts, "
                                 "whose peak counts until they end")  # fmt: skip
            raise UsageError(f"no learned shape {shape!r} (see `orch memory --keys`)")
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
