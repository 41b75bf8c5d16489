"""Throughput per GPU and job shape as a function of how many jobs share the card. Pure.

Memory says how many jobs fit; this says how many are worth it. From each attempt's samples/s
at each number of tenants (itself included) the curve T(k) = k · rate(k) / rate(1) follows, in
units of one job alone; the marginal gain of one more job on a card holding k is
T(k+1) − T(k). Placement prefers the card where a job adds the most, and a suite's
`min_stack_gain` stops stacking where the measured gain is below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# A reading for k jobs on a card counts once it rests on this many optimizer steps: a few
# intervals of a noisy start (warm-up, the first evaluation) made 3 jobs read 3.16x.
MIN_CURVE_STEPS = 20


def interval_rate(
    prev_step: int, prev_t: float, step: int, t: float, samples_per_step: int
) -> float | None:
    """Samples/s between two progress readings; None when nothing can be said. An interval from
    a reading before the first step (step 0: imports, model load, tokenising) says nothing of
    training speed: start-up is left out."""
    if t <= prev_t or step <= prev_step or samples_per_step <= 0 or prev_step < 1:
        return None
    return (step - prev_step) * samples_per_step / (t - prev_t)


def relative_curve(rates: Mapping[int, float]) -> dict[int, float]:
    """{tenants: mean rate of one attempt} -> {tenants: aggregate rate in solo-job units}.
    Empty without a solo reading: nothing to compare against. k jobs never do more than k
    jobs' work: a reading above k x (noise, a solo reading taken while slowed) is capped there."""
    solo = rates.get(1)
    if not solo or solo <= 0:
        return {}
    return {k: min(float(k), k * rate / solo) for k, rate in sorted(rates.items()) if k >= 1 and rate > 0}


def spread(rate_min: float | None, rate_max: float | None, mean: float) -> float | None:
    """How far one attempt's readings at one count strayed, as a fraction of their mean
    ((max - min) / mean); None where not recorded."""
    if rate_min is None or rate_max is None or mean <= 0:
        return None
    return (rate_max - rate_min) / mean


def marginal_gain(curve: Mapping[int, float], tenants_now: int) -> float | None:
    """What one more job adds to a card holding `tenants_now`, in solo-job units: 1 on an idle
    card; measured T(k+1) − T(k) where both are known; None otherwise."""
    if tenants_now <= 0:
        return 1.0
    before, after = curve.get(tenants_now), curve.get(tenants_now + 1)
    if before is None or after is None:
        return None
    return after - before


def curves_by_gpu(rows: Iterable[tuple[str, str, int, float]]) -> dict[str, dict[str, dict[int, float]]]:
    """(shape key, gpu uuid, tenants, mean samples/s) rows -> shape -> gpu -> relative curve.
    A GPU with no solo reading of the shape borrows the rates pooled over the other GPUs."""
    rates: dict[str, dict[str, dict[int, float]]] = {}
    for shape, gpu, tenants, rate in rows:
        rates.setdefault(shape, {}).setdefault(gpu, {})[tenants] = rate
    out: dict[str, dict[str, dict[int, float]]] = {}
    for shape, per_gpu in rates.items():
        pooled: dict[int, list[float]] = {}
        for by_tenants in per_gpu.values():
            for k, rate in by_tenants.items():
                pooled.setdefault(k, []).append(rate)
        pooled_curve = relative_curve({k: sum(v) / len(v) for k, v in pooled.items()})
        out[shape] = {gpu: relative_curve(r) or pooled_curve for gpu, r in per_gpu.items()}
        out[shape]["*"] = pooled_curve
    return out


def family_curves(
    shape_curves: Mapping[str, Mapping[int, Mapping[int, float]]], family_of: Mapping[str, str]
) -> dict[str, dict[int, dict[int, float]]]:
    """Shape -> GPU -> relative curve, and each shape's memory family -> family -> GPU ->
    the curve averaged over the family's shapes, per number of tenants: a config of the family
    never measured stacks by what its siblings measured (the curve is relative, so batch sizes
    with different samples/s average fairly)."""
    sums: dict[str, dict[int, dict[int, list[float]]]] = {}
    for shape, per_gpu in shape_curves.items():
        family = family_of.get(shape)
        if family is None:
            continue
        for gpu, curve in per_gpu.items():
            by_k = sums.setdefault(family, {}).setdefault(gpu, {})
            for k, value in curve.items():
                by_k.setdefault(k, []).append(value)
    return {
        family: {gpu: {k: sum(v) / len(v) for k, v in sorted(by_k.items())} for gpu, by_k in per_gpu.items()}
        for family, per_gpu in sums.items()
    }
