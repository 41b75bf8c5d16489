"""Intervals and tests on a table's counted values, through scipy (the `stats` extra): a
t-based 95 % interval of a row's mean (`orch results --ci`) and a paired-by-seed t test between
two settings (`orch results --compare A B`). No statistics are written by hand here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.results.aggregate import ResultSummary
from orchestrator.results.formats import column_title
from orchestrator.spread import in_square_range

CONFIDENCE = 0.95
SAME_DIFFERENCE = 1e-9  # differences closer than this (relative) are one difference: no t test


def _scipy_stats() -> Any:
    try:
        from scipy import stats
    except ImportError:
        raise UsageError("--ci and --compare need scipy: pip install 'orch[stats]'") from None
    return stats


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The t-based interval of the mean of `values` (sample std, n − 1 degrees of freedom);
    None for fewer than two values."""
    if len(values) < 2:
        return None
    stats = _scipy_stats()
    mean = sum(values) / len(values)
    sem = stats.sem(values)  # sample std (ddof 1) / sqrt(n)
    if sem == 0 or not math.isfinite(sem):
        return mean, mean
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=sem)
    return float(low), float(high)


def row_interval(summary: ResultSummary) -> tuple[float, float] | None:
    return t_interval([r.value for r in summary.runs if r.value is not None])


@dataclass(frozen=True)
class PairedTest:
    """A paired-by-seed comparison of two rows on one task and metric: the mean of A − B over
    the seeds both counted, scipy's paired t statistic and two-sided p value (None for fewer
    than two pairs), and the seeds only one of them counted (left out)."""

    task: str
    metric: str
    seeds: tuple[int, ...]
    mean_difference: float | None
    t: float | None
    p: float | None
    only_a: tuple[int, ...]
    only_b: tuple[int, ...]


def paired_test(a: ResultSummary, b: ResultSummary) -> PairedTest:
    """A against B on their common task and metric, pairing the value each counts per seed
    (pooled rows, which may count a seed twice, are refused by the caller)."""
    va = {r.seed: r.value for r in a.runs if r.value is not None}
    vb = {r.seed: r.value for r in b.runs if r.value is not None}
    common = tuple(sorted(set(va) & set(vb)))
    only_a = tuple(sorted(set(va) - set(vb)))
    only_b = tuple(sorted(set(vb) - set(va)))
    diffs = [va[s] - vb[s] for s in common]
    mean_diff = sum(diffs) / len(diffs) if diffs else None
    t_stat = p_value = None
    if len(common) >= 2 and max(diffs) - min(diffs) > SAME_DIFFERENCE * max(
        1.0, abs(mean_diff or 0.0)
    ):
        # the pairs' differences (metrics up to 1e300), scaled where their squares would overflow
        # (scipy then says t = 0, p = 1 without a word): a common scale leaves t and p as they are
        result = _scipy_stats().ttest_rel(in_square_range(diffs), [0.0] * len(diffs))
        t_stat, p_value = float(result.statistic), float(result.pvalue)
    elif len(common) >= 2:
        t_stat = p_value = math.nan  # no spread in the differences: a t statistic would be noise
    return PairedTest(a.task, a.metric, common, mean_diff, t_stat, p_value, only_a, only_b)


def paired_text(test: PairedTest, digits: int = 4) -> str:
    """One line: `glue_rte (accuracy): A − B = +0.0125 over 4 paired seeds (1 2 3 4); t = 2.10,
    p = 0.127 (paired t test)`."""
    head = f"{column_title(test.task, test.metric)}: "
    if test.mean_difference is None:
        return head + "no seed counted in both: nothing to pair"
    text = (
        head
        + f"A − B = {test.mean_difference:+.{digits}f} over {len(test.seeds)} paired seed(s) ("
        + " ".join(map(str, test.seeds))
        + ")"
    )
    if test.t is None or test.p is None:
        text += "; a test needs two pairs"
    elif math.isnan(test.t):
        text += "; every pair differs by the same amount: no t test"
    else:
        text += f"; t = {test.t:.3f}, p = {test.p:.3g} (paired t test, two-sided)"
    left = [
        f"seeds only in {name}: {' '.join(map(str, seeds))}"
        for name, seeds in (("A", test.only_a), ("B", test.only_b))
        if seeds
    ]
    return text + ("; " + "; ".join(left) + " (left out)" if left else "")
