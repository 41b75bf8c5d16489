"""Marks that never lie: every results cell with a run that went through a ladder rung changing
numerics carries †, in every format, whatever the precision and dropout, with the rungs named in
its legend; a bolded cell is never without its mark; runs at exact levels (bit-equal numbers) are
not marked. Pure formats first, then the daemon's own record of each attempt's rungs (sim GPUs,
tmux, SQLite) read back by `orch results`."""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Any

import pytest

from orchestrator.results.aggregate import ResultRow, aggregate
from orchestrator.results.collect import inexact_of
from orchestrator.results.formats import render_rows, to_csv, to_records
from orchestrator.results.grids import to_latex, to_markdown
from orchestrator.store.queries import ResultJob
from tests.e2e_helpers import Orch, requires_tmux

HALVED = {"gradient_checkpointing": True, "logits_to_keep": 1, "batch_size": 2, "gradient_accumulation_steps": 4}
CKPT = {"gradient_checkpointing": True, "logits_to_keep": 1}


def _rows(dropout: float = 0.0) -> list[ResultRow]:
    """`half`: both seeds at the halved batch (not mixed: one level), the best on rte;
    `ckpt`: both at the checkpointing level, exact; `plain`: level 0."""
    return [
        ResultRow("E1", "half", "glue_rte", 1, {"accuracy": 0.9}, job=1, attempt=3, level=2, step="halve_batch",
                  changes=HALVED, inexact=("halve_batch",), lora_dropout=dropout),
        ResultRow("E1", "half", "glue_rte", 2, {"accuracy": 0.92}, job=2, attempt=3, level=2, step="halve_batch",
                  changes=HALVED, inexact=("halve_batch",), lora_dropout=dropout),
        ResultRow("E1", "ckpt", "glue_rte", 1, {"accuracy": 0.7}, job=3, attempt=2, level=1, step="checkpointing",
                  changes=CKPT, lora_dropout=dropout),
        ResultRow("E1", "ckpt", "glue_rte", 2, {"accuracy": 0.72}, job=4, attempt=1, level=0, lora_dropout=dropout),
    ]  # fmt: skip


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_a_row_all_of_whose_runs_went_through_an_inexact_rung_is_marked_everywhere(dropout: float) -> None:
    summaries = aggregate(_rows(dropout))
    half, ckpt = summaries
    assert not half.mixed_levels and half.inexact_rungs == ("halve_batch",)  # one level, still marked
    assert ckpt.mixed_levels and ckpt.inexact_rungs == ()  # exact levels: bit-equal, no mark

    markdown = to_markdown(summaries)
    assert "| half | **0.9100 ± 0.0141** † | 2 |" in markdown  # bold, and never without its mark
    assert "| ckpt | 0.7100 ± 0.0141 | 2 |" in markdown
    assert "† some runs went through a ladder rung that changes numerics (halve\\_batch)" in markdown

    latex = to_latex(summaries)
    assert "half & \\textbf{0.9100 $\\pm$ 0.0141}$^{\\dagger}$ & 2 \\\\" in latex
    assert "ckpt & 0.7100 $\\pm$ 0.0141 & 2 \\\\" in latex
    assert "$^\\dagger$ some runs went through a ladder rung that changes numerics (halve\\_batch)" in latex

    text = {row[1]: row for row in render_rows(summaries)}
    assert text["half"][5] == "0.9100 ± 0.0141 †" and text["half"][9] == "2 †"
    assert text["ckpt"][5] == "0.7100 ± 0.0141" and text["ckpt"][9] == "0,1"

    records = {r["config"]: r for r in to_records(summaries)}
    assert records["half"]["marks"] == ["†"] and records["half"]["inexact_rungs"] == ["halve_batch"]
    assert [run["inexact_rungs"] for run in records["half"]["runs"]] == [["halve_batch"]] * 2
    assert records["ckpt"]["marks"] == [] and records["ckpt"]["inexact_rungs"] == []
    assert records["half"]["dropout_differs"] is (dropout > 0)

    parsed = {r["config"]: r for r in csv.DictReader(io.StringIO(to_csv(summaries)))}
    assert (parsed["half"]["inexact_rungs"], parsed["half"]["run_levels"], parsed["half"]["run_inexact_rungs"]) == (
        "halve_batch", "2 2", "1:halve_batch; 2:halve_batch")  # fmt: skip
    assert (parsed["ckpt"]["inexact_rungs"], parsed["ckpt"]["run_levels"], parsed["ckpt"]["run_inexact_rungs"]) == (
        "", "1 0", "1:-; 2:-")  # fmt: skip


def test_the_legend_names_every_rung_once_and_a_suites_rung_name_cannot_break_the_table() -> None:
    rows = [*_rows(), ResultRow("E1", "own", "glue_rte", 1, {"accuracy": 0.5}, job=5, level=1, step="x|*y*",
                                inexact=("x|*y*",))]  # fmt: skip
    markdown = to_markdown(aggregate(rows))
    assert "(halve\\_batch, x\\|\\*y\\*)" in markdown
    assert markdown.count("changes numerics") == 1
    latex = to_latex(aggregate(rows))
    assert "(halve\\_batch, x\\textbar{}$^*$y$^*$)" in latex


def test_an_attempt_recorded_before_its_rungs_were_is_marked_by_what_its_level_changed() -> None:
    def run(level: int, step: str, overrides: dict[str, Any], recorded: tuple[str, ...] | None,
            worker: str = "lora") -> ResultJob:  # fmt: skip
        return ResultJob(1, "E1", "c", "glue_rte", 1, 1, level, step, overrides, False, "/r", None,
                         worker=worker, inexact_rungs=recorded)  # fmt: skip

    assert inexact_of(run(2, "halve_batch", HALVED, None)) == ("halve_batch",)
    assert inexact_of(run(1, "checkpointing", CKPT, None)) == ()
    # a researcher's own script may draw other dropout masks once logits_to_keep changes
    own = "python train.py --lr {learning_rate}"
    assert inexact_of(run(1, "checkpointing", CKPT, None, own)) == ("checkpointing",)
    assert inexact_of(run(1, "checkpointing", {"gradient_checkpointing": True}, None, own)) == ()
    assert inexact_of(run(1, "", {"learning_rate": 1e-4}, None)) == ("level 1",)
    # recorded: the ladder's word, a suite rung declared `exact: true` included
    assert inexact_of(run(1, "lower_lr", {"learning_rate": 1e-4}, ())) == ()
    assert inexact_of(run(0, "as_configured", {}, ("halve_batch",))) == ("halve_batch",)


# A script of one's own: out of memory unless checkpointing is on (config `needs: ckpt`) or
# the micro-batch is at most 2 (`needs: half`); its score is its last JSON line.
SCRIPT = """
import json, sys, yaml
config = yaml.safe_load(open(sys.argv[sys.argv.index("--cfg") + 1]))
fits = config.get("gradient_checkpointing") if config["needs"] == "ckpt" else config["batch_size"] <= 2
if not fits:
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"accuracy": config["score"] + config["seed"] / 100}))
"""


SIM_GPUS = "1x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


@requires_tmux
@pytest.mark.tmux
def test_the_daemon_records_each_attempts_inexact_rungs_and_results_mark_them(orch: Orch) -> None:
    script = orch.root / "own_train.py"
    script.write_text(SCRIPT)
    configs = {"half": {"needs": "half", "score": 0.9, "batch_size": 4}, "ckpt": {"needs": "ckpt", "score": 0.7}}
    orch.write_suite("own", configs, mem_gib=1, max_attempts=6, one_token_tasks=["glue*"],
                     ladder=["checkpointing", "halve_batch"], worker=f"{sys.executable} {script} --cfg {{config}}")
    orch.submit("own", "1:glue_rte 2:glue_rte")
    orch.start_daemon()
    assert set(orch.wait_all_done(120).values()) == {"succeeded"}

    payload = {row["config"]: row for row in json.loads(orch.run("results", "--json").stdout)}
    half, ckpt = payload["half"], payload["ckpt"]
    assert [run["level"] for run in half["runs"]] == [2, 2]  # checkpointing, then batch 2 × 2
    assert [run["inexact_rungs"] for run in half["runs"]] == [["halve_batch"]] * 2 and half["marks"] == ["†"]
    assert [run["level"] for run in ckpt["runs"]] == [1, 1]
    assert [run["inexact_rungs"] for run in ckpt["runs"]] == [[], []] and ckpt["marks"] == []
    markdown = orch.run("results", "--format", "markdown").stdout
    assert "| half | **0.9150 ± 0.0071** † | 2 |" in markdown and "| ckpt | 0.7150 ± 0.0071 | 2 |" in markdown
    assert "changes numerics (halve\\_batch)" in markdown
