"""Choosing a setting without looking at test: bold and `--select val` follow the mean on the
validation split (never a single seed; the lowest loss), the chosen row reports its test mean;
`--metric`, `--where`, suite order, tables refused while runs are going, and the web page and the
report saying the same. Jobs are submitted through the CLI and ended in the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.store import Store
from tests.conftest import OrchRunner
from tests.store_reads import read_jobs

# (config, task, seed) -> (test accuracy, val accuracy); r16 is best on val, r8 on test
VALUES = {
    ("r8", "glue_rte", 1): (0.60, 0.70),
    ("r8", "glue_rte", 2): (0.62, 0.72),
    ("r8", "glue_rte", 3): (0.64, 0.74),
    ("r16", "glue_rte", 1): (0.50, 0.80),
    ("r16", "glue_rte", 2): (0.52, 0.82),
    ("r16", "glue_rte", 3): (0.54, 0.84),
    ("r64", "glue_rte", 1): (0.99, 0.99),
    ("r8", "glue_mrpc", 1): (0.5, 0.5),
}
ENDED = {("r64", "glue_rte", 2): "cancelled", ("r64", "glue_rte", 3): "running", ("r16", "glue_mrpc", 1): "failed",
         ("r64", "glue_mrpc", 1): "queued"}


def _plans(root: Path) -> Path:
    plans = root / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "sweep").mkdir(parents=True)
    for name in ("r8", "r16", "r64"):  # the suite's order, not the names' string order
        config = {"model": "tiny-llama", "batch_size": 4, "learning_rate": 3e-4, "lora_r": int(name[1:])}
        (plans / "configs" / "sweep" / f"{name}.yaml").write_text(json.dumps(config))
    (plans / "suites" / "sweep.yaml").write_text(json.dumps({"worker": "sim", "mem_gib": 1,
                                                             "configs": ["r8", "r16", "r64"]}))
    return plans


def _end(store: Store, job_id: int, run_dir: Path, state: str, result: dict | None = None, reason: str = "") -> None:
    with store.write():
        if result is not None:
            run_dir.mkdir(parents=True)
            (run_dir / "result.json").write_text(json.dumps(result))
            store.execute(
                "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, "
                "ended_at, outcome, overrides_json, predicted_peak_mib, prediction_source, reserved_mib) "
                "VALUES (?, 1, 0, 'as configured', 0, 'GPU-0', ?, 1.0, 2.0, ?, '{}', 100, 'declared', 0)",
                [job_id, str(run_dir), state],
            )
        store.execute("UPDATE jobs SET state = ?, reason = ? WHERE id = ?", [state, reason or None, job_id])


@pytest.fixture
def sweep(orch_inproc: OrchRunner, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OrchRunner:
    monkeypatch.setenv("ORCH_PLANS", str(_plans(tmp_path)))
    assert orch_inproc("submit", "--suite", "sweep", "--pairs", "1:glue_rte 2:glue_rte 3:glue_rte 1:glue_mrpc").rc == 0
    assert orch_inproc("submit", "--suite", "sweep", "--pairs", "1:glue_rte", "--force").rc == 0
    with Store(db_path) as store:
        for job in read_jobs(store):
            key, run_dir = (job.config_name, job.data, job.seed), tmp_path / "runs" / str(job.id)
            if job.id > 12:  # the forced reruns of seed 1: r8's fails after its first run succeeded
                _end(store, job.id, run_dir, "failed" if job.config_name == "r8" else "cancelled",
                     {"status": "failed", "error": "ValueError: loss \x1b[31mis nan\nTraceback ..."})
            elif key in VALUES:
                test, val = VALUES[key]
                _end(store, job.id, run_dir, "succeeded", {"status": "ok", "best_step": 40 + job.seed, "metrics": {
                    "test": {"accuracy": test, "loss": 1 - test}, "val": {"accuracy": val, "loss": 1 - val}}})
            elif ENDED[key] in ("failed", "cancelled"):
                _end(store, job.id, run_dir, ENDED[key], reason="exit 1: CUDA error: an illegal memory access")
            else:
                _end(store, job.id, run_dir, ENDED[key])
    return orch_inproc


def _rows(run: OrchRunner, *args: str) -> dict[tuple[str, str], dict]:
    result = run("results", "--json", *args)
    assert result.rc == 0, result.stderr
    return {(row["config"], row["task"]): row for row in json.loads(result.stdout)}


def test_every_seed_is_accounted_for_in_suite_order(sweep: OrchRunner) -> None:
    rows = _rows(sweep)
    assert list(rows) == [("r8", "glue_rte"), ("r8", "glue_mrpc"), ("r16", "glue_rte"), ("r16", "glue_mrpc"),
                          ("r64", "glue_rte"), ("r64", "glue_mrpc")]  # r8, r16, r64: the suite's order
    r64 = rows[("r64", "glue_rte")]
    assert r64["n_text"] == "1 of 3 (seed 2 cancelled; seed 3 running)"
    assert (r64["unfinished"], r64["failed_runs"], r64["std"]) == (True, True, None)
    assert "¶" in r64["marks"] and "◇" in r64["marks"]
    # seed 1 of r64 was counted; its forced rerun was cancelled: the row says so
    assert any("a later run" in note and "was cancelled" in note for note in r64["notes"])
    r8 = rows[("r8", "glue_rte")]
    assert (r8["n"], r8["n_text"], r8["failed_runs"]) == (3, "3", True)  # seed 1 counts its succeeded run
    # the worker's own error, its first line, without the terminal escape it carried
    assert any(note.endswith("failed (ValueError: loss  [31mis nan); job 1 counted") for note in r8["notes"])
    failed = rows[("r16", "glue_mrpc")]
    assert failed["accounted"] == "0 of 1; seed 1 (job 8) failed: exit 1: CUDA error: an illegal memory access"
    assert rows[("r64", "glue_mrpc")]["seed_states"] == [{"seed": 1, "status": "queued", "job": 12, "why": ""}]
    assert [r["best_step"] for r in r8["runs"]] == [41, 42, 43]
    assert (r8["val_mean"], r8["val_n"]) == (pytest.approx(0.72), 3)


def test_bold_and_select_follow_val_and_the_direction_of_the_metric(sweep: OrchRunner) -> None:
    refused = sweep("results", "--format", "markdown")
    assert refused.rc == 2 and refused.stdout == "" and "--partial" in refused.stderr
    markdown = sweep("results", "--format", "markdown", "--partial").stdout
    assert markdown.startswith("partial: ")
    lines = {line.split(" | ")[0].lstrip("| "): line for line in markdown.splitlines() if line.startswith("| r")}
    assert "**0.5200 ± 0.0200**" in lines["r16"]  # best val (0.82), reported with its test mean
    assert "**" not in lines["r8"]  # best test mean: choosing on it would be selection on test
    assert "**" not in lines["r64"]  # 0.99 from a single seed
    assert "best mean on the validation split" in markdown

    chosen = _rows(sweep, "--select", "val")
    assert list(chosen) == [("r16", "glue_rte")] and chosen[("r16", "glue_rte")]["chosen_by"] == "val"
    assert chosen[("r16", "glue_rte")]["mean"] == pytest.approx(0.52)
    said = sweep("results", "--select", "val", "--csv")
    assert "glue_mrpc (f1): no setting with n ≥ 2 reported val f1: none selected" in said.stderr

    # a loss: the lowest val loss is r16's, the highest r8's
    losses = _rows(sweep, "--metric", "loss")
    assert {row["metric"] for row in losses.values()} == {"loss"}
    assert losses[("r16", "glue_rte")]["chosen_by"] == "val" and losses[("r8", "glue_rte")]["chosen_by"] is None
    latex = sweep("results", "--format", "latex", "--partial", "--metric", "loss").stdout
    assert "r16 & \\textbf{0.4800 $\\pm$ 0.0200}" in latex and "lowest is best for loss" in latex


def test_where_keeps_whole_settings_and_names_a_bad_key(sweep: OrchRunner) -> None:
    assert [key for key in _rows(sweep, "--where", "config=r16")] == [("r16", "glue_rte"), ("r16", "glue_mrpc")]
    assert {c for c, _ in _rows(sweep, "--where", "lora_r=64")} == {"r64"}
    assert len(_rows(sweep, "--where", "learning_rate=3e-4", "--where", "task=glue_rte")) == 3  # 0.0003 as a number
    for bad, needle in ((("--where", "nope=1"), "no run has a setting 'nope'"), (("--where", "lora_r"), "KEY=VALUE")):
        result = sweep("results", *bad)
        assert result.rc == 2 and result.stdout == "" and needle in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_web_page_and_report_show_denominators_val_and_the_val_choice(sweep: OrchRunner, db_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from orchestrator.results.collect import RunReader
    from orchestrator.web.pages import results_fragment
    from orchestrator.web.report import render_report
    from orchestrator.web.results_view import pivot, result_table

    with Store(db_path) as store:
        table = result_table(store, RunReader())
        report = render_report(store)
    best = [(row.label, cell.mean) for row in pivot(table.summaries).rows for cell in row.cells if cell and cell.best]
    assert best == [("r16", pytest.approx(0.52))]
    page = results_fragment(table, "/results.csv")
    for html in (page, report):
        assert "1 of 3 (seed 2 cancelled; seed 3 running)" in html
        assert "val mean ± std" in html and "0.8200 ± 0.0200" in html  # r16's val beside its test
        assert "41 42 43" in html  # best steps
        assert "partial: " in html and "◇ some runs are still queued or running" in html
        assert "± 0.0000" not in html


def test_select_val_with_nothing_to_choose_on_says_so_not_no_results(sweep: OrchRunner) -> None:
    # glue_mrpc: single seeds only, so no setting has a validation mean to choose on
    said = sweep("results", "--where", "task=glue_mrpc", "--select", "val")
    assert said.rc == 0 and "no results yet" not in said.stdout
    assert said.stdout.startswith("no setting reports a validation metric (on n ≥ 2 seeds) to choose on"), said.stdout
    assert "no results yet" in sweep("results", "--where", "task=nope").stdout


def test_a_row_with_a_diverged_run_is_never_the_choice_and_every_format_says_why() -> None:
    # pure: summaries from values, no daemon. `wild` has the best val mean, but orch flagged one
    # of its counted runs as diverged (♯): a figure must not single it out
    import csv
    import io

    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.formats import to_csv, to_records
    from orchestrator.results.grids import to_latex, to_markdown
    from orchestrator.results.selection import choice_notes, choose, is_chosen

    why = "final loss 9.2e+08 above the first steps' 0.7"

    def row(job: int, config: str, seed: int, test: float, val: float, diverged: str | None = None) -> ResultRow:
        return ResultRow("E1", config, "glue_rte", seed, {"accuracy": test}, job=job,
                         val_metrics={"accuracy": val}, diverged=diverged)

    rows = [row(1, "wild", 1, 0.90, 0.95, why), row(2, "wild", 2, 0.92, 0.97),
            row(3, "calm", 1, 0.70, 0.80), row(4, "calm", 2, 0.72, 0.82), row(5, "solo", 1, 0.99, 0.99)]
    summaries = aggregate(rows)
    wild, calm, _solo = summaries
    choices = choose(summaries, 4)
    assert is_chosen(calm, choices) and not is_chosen(wild, choices)
    note = ("glue_rte (accuracy): wild has the best val mean but a counted run's loss diverged (♯): not chosen; "
            "calm chosen")
    assert choice_notes(choices) == [note]
    markdown = to_markdown(summaries)
    lines = {line.split("|")[1].strip(): line for line in markdown.splitlines() if line.startswith("| ")}
    assert "**0.7100 ± 0.0141**" in lines["calm"] and "**" not in lines["wild"] and "♯" in lines["wild"]
    assert note.replace("_", "\\_") in markdown  # under the grid, with the legend (Markdown-escaped)
    assert "among rows with n ≥ 2 and no diverged run (♯)" in markdown
    latex = to_latex(summaries).splitlines()
    assert any(line.startswith("calm & \\textbf{0.7100") for line in latex)
    assert not any(line.startswith("wild") and "textbf" in line for line in latex)
    parsed = {r["config"]: r["chosen_by"] for r in csv.DictReader(io.StringIO(to_csv(summaries, _by(choices))))}
    assert parsed == {"wild": "", "calm": "val", "solo": ""}
    assert {r["config"]: r["chosen_by"] for r in to_records(summaries, _by(choices))} == {
        "wild": None, "calm": "val", "solo": None}

    # with no other row of two seeds, nothing is bold, and the note says why
    lone = aggregate([r for r in rows if r.config != "calm"])
    lone_choices = choose(lone, 4)
    assert not any(is_chosen(s, lone_choices) for s in lone)
    assert choice_notes(lone_choices) == [note.replace("calm chosen", "none chosen")]
    assert "**" not in to_markdown(lone).split("\n\n")[0]  # the grid: no bold cell


def _by(choices: dict) -> dict[int, str]:
    from orchestrator.results.selection import chosen_by

    return chosen_by(choices)


def test_a_val_mean_from_one_run_never_chooses_and_the_note_says_so() -> None:
    # `partial` has three test values but val from seed 1 only (0.99); `full` has val from all three
    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.selection import Basis, choice_notes, choose, is_chosen

    def row(job: int, config: str, seed: int, test: float, val: float | None) -> ResultRow:
        return ResultRow("E1", config, "glue_rte", seed, {"accuracy": test}, job=job,
                         val_metrics={} if val is None else {"accuracy": val})

    rows = [row(1, "partial", 1, 0.51, 0.99), row(2, "partial", 2, 0.52, None), row(3, "partial", 3, 0.50, None),
            row(4, "full", 1, 0.70, 0.80), row(5, "full", 2, 0.71, 0.81), row(6, "full", 3, 0.72, 0.82)]
    partial, full = aggregate(rows)
    assert partial.val_n == 1 and full.val_n == 3
    choices = choose([partial, full], 4)
    assert is_chosen(full, choices) and not is_chosen(partial, choices)
    assert choice_notes(choices) == ["glue_rte (accuracy): partial has the best val mean but from one run: "
                                     "not chosen on it; full chosen"]
    # with no val over two runs anywhere, the choice is on test, as where no row reports val
    alone = aggregate([r for r in rows if r.config == "partial"] + [row(7, "other", s, 0.6, None) for s in (1, 2)])
    [(basis, chosen)] = [(c.basis, c.chosen) for c in choose(alone, 4).values()]
    assert basis is Basis.TEST and chosen == frozenset({id(alone[1])})
