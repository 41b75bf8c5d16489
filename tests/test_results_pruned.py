"""Results with pruned runs: kept out of every mean, counted in the denominator, marked and
explained (at which step, the value and its rank there)."""

from __future__ import annotations

import csv
import io
import json

from orchestrator.lifecycle import JobState
from orchestrator.results.aggregate import ResultRow, aggregate
from orchestrator.results.formats import PRUNED, cell_marks, legend_lines, to_csv, to_records

WHY = "pruned at step 12 (val_accuracy 0.52, ranked 7 of 9 at that step; asha)"


def _rows() -> list[ResultRow]:
    kept = [
        ResultRow("S", "lr_good", "toy", seed, {"accuracy": 0.8 + 0.02 * seed}, job=seed)
        for seed in (1, 2)
    ]
    partly = [
        ResultRow("S", "lr_mid", "toy", seed, {"accuracy": 0.6}, job=10 + seed) for seed in (1, 2)
    ]
    partly += [
        ResultRow("S", "lr_mid", "toy", seed, {}, job=10 + seed, state=JobState.PRUNED, reason=WHY)
        for seed in (3, 4)
    ]
    gone = [
        ResultRow("S", "lr_bad", "toy", seed, {}, job=20 + seed, state=JobState.PRUNED, reason=WHY)
        for seed in (1, 2)
    ]
    return kept + partly + gone


def test_pruned_runs_stay_out_of_the_mean_and_are_counted_and_marked() -> None:
    by_config = {s.config: s for s in aggregate(_rows(), metric="accuracy")}
    mid, bad, good = by_config["lr_mid"], by_config["lr_bad"], by_config["lr_good"]
    assert (mid.n, mid.mean) == (2, 0.6)  # only the seeds that ran to their end
    assert mid.n_text == "2 of 4 (2 pruned)"
    assert bad.mean is None and bad.n_text == "0 of 2 (2 pruned)"
    assert any(note == f"seeds 3, 4 (jobs 13, 14) {WHY}: not counted" for note in mid.notes)
    assert (
        PRUNED in cell_marks(mid) and PRUNED in cell_marks(bad) and PRUNED not in cell_marks(good)
    )
    assert "¶" not in cell_marks(mid)  # not a failure: pruned runs are no seeds lost by accident
    assert any(line.startswith("‡ early stopping") for line in legend_lines([mid]))
    record = next(r for r in to_records([mid]))
    assert record["denominator"]["pruned"] == 2
    assert [s["status"] for s in record["seed_states"]] == [
        "counted",
        "counted",
        "pruned",
        "pruned",
    ]
    (parsed,) = csv.DictReader(io.StringIO(to_csv([mid])))
    assert parsed["pruned"] == "2"
    json.dumps(record)  # the --json record stays serialisable
