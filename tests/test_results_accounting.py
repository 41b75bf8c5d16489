"""Every submitted run accounted for in every results format: n of the seeds submitted, the seeds
that failed (with their error), were cancelled or have not finished, a row for a setting none of
whose runs succeeded, one value per seed (a rerun replaces its seed's value), no std for a
single seed, and val beside test."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e_helpers import Orch, orch_env, requires_tmux


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        yield env


def _md_row(markdown: str, label: str) -> list[str]:
    (line,) = [line for line in markdown.splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.rstrip(" |").split(" | ")[1:]]


@requires_tmux
def test_seeds_that_fail_configs_that_always_fail_a_rerun_and_a_single_seed(live: Orch) -> None:
    quick = {"sim_mem_gib": 1, "sim_seconds": 0.3, "sim_ramp_s": 0.1}
    live.write_suite("good", {"good": {**quick, "sim_fail": "error", "sim_fail_seeds": [4]}}, mem_gib=1)
    live.write_suite("bad", {"bad": {**quick, "sim_fail": "error"}}, mem_gib=1)
    live.write_suite("one", {"one": quick}, mem_gib=1)
    live.submit("good", "1:glue_rte,2:glue_rte,3:glue_rte,4:glue_rte")
    live.submit("bad", "1:glue_rte,2:glue_rte")
    live.submit("one", "1:glue_rte")
    live.submit("good", "1:glue_rte", "--force")  # seed 1 again: the same setting, bit-identical

    # nothing ran yet: a table for a paper is refused, or printed marked partial when asked
    refused = live.run("results", "--format", "markdown", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "still queued or running" in refused.stderr and "--partial" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    partial = live.run("results", "--format", "latex", "--partial").stdout
    assert partial.startswith("partial: ") and "$^{\\diamond}$" in partial

    live.start_daemon()
    states = live.wait_all_done(120)
    assert sorted(states.values()).count("failed") == 3  # seed 4 of good, both seeds of bad

    rows = {row["config"]: row for row in live.json("results")}
    good, bad, one = rows["good"], rows["bad"], rows["one"]
    # n counts distinct seeds: the forced rerun replaced seed 1's value, it did not add one
    assert (good["n"], good["seeds"], good["pooled"]) == (3, [1, 2, 3], False)
    assert good["denominator"] == {"submitted": 4, "succeeded": 3, "no_metric": 0, "failed": 1, "cancelled": 0,
                                   "running": 0, "queued": 0, "runs": 5, "pruned": 0}
    assert good["n_text"] == "3 of 4 (seed 4 failed)"
    assert good["accounted"].startswith("3 of 4; seed 4 (job ")
    assert "failed: RuntimeError: simulated failure in the training loop" in good["accounted"]
    assert [s["status"] for s in good["seed_states"]] == ["counted", "counted", "counted", "failed"]
    assert good["failed_runs"] is True and "¶" in good["marks"]
    jobs_of_seed_1 = sorted(j.id for j in live.jobs(suite="good") if j.seed == 1)
    assert [r["job"] for r in good["runs"] if r["seed"] == 1] == [jobs_of_seed_1[-1]]
    # val beside test, from result.json, and the step that chose the weights
    assert good["val_mean"] is not None and good["val_n"] == 3
    assert all(r["val"] is not None and r["best_step"] is not None for r in good["runs"])
    # a setting none of whose runs succeeded still has its row
    assert (bad["n"], bad["mean"], bad["std"], bad["n_text"]) == (0, None, None, "0 of 2 (seeds 1, 2 failed)")
    # one seed: a mean, no std
    assert (one["n"], one["std"], one["n_text"]) == (1, None, "1")

    markdown = live.run("results", "--format", "markdown").stdout
    good_row = _md_row(markdown, "good/good")
    assert good_row[1] == f"{good['val_mean']:.4f} ± {good['val_std']:.4f}"  # the val column the docs promise
    assert good_row[2] == "3 of 4 (seed 4 failed)"  # the row shows n and the failed seed
    assert "¶" in good_row[0]
    assert _md_row(markdown, "bad/bad")[:3] == ["— ¶ \\*", "—", "0 of 2 (seeds 1, 2 failed)"]
    assert _md_row(markdown, "one/one")[0].startswith(f"{one['mean']:.4f} ± —")
    assert "** " not in _md_row(markdown, "one/one")[0]  # a single seed is never bold
    assert "RuntimeError: simulated failure" in markdown  # the error, in the notes
    assert "¶ some seeds failed" in markdown
    assert "sample standard deviation (n − 1)" in markdown and "best evaluation on the validation split" in markdown
    for text in (markdown, live.run("results").stdout, live.run("results", "--format", "latex").stdout):
        assert "± 0.0000" not in text and "$\\pm$ 0.0000" not in text

    parsed = {r["config"]: r for r in csv.DictReader(io.StringIO(live.run("results", "--csv").stdout))}
    assert (parsed["good"]["submitted"], parsed["good"]["failed"], parsed["good"]["n_seeds"]) == ("4", "1", "3")
    assert parsed["good"]["val_mean"] != "" and parsed["bad"]["mean"] == "" and parsed["one"]["std"] == ""
