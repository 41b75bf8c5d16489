"""`orch results` as text people paste (CSV, Markdown, LaTeX) and as traceable JSON: every cell
names each seed's job, attempt and ladder level, and a cell with a run that went through a rung
changing numerics is marked."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from orchestrator.results.aggregate import ResultRow, aggregate
from orchestrator.results.formats import to_csv, to_records
from orchestrator.results.grids import latex_escape, to_latex, to_markdown
from orchestrator.store import Store
from tests.conftest import OrchRunner
from tests.store_reads import read_jobs

HALVED = {"gradient_checkpointing": True, "batch_size": 2, "gradient_accumulation_steps": 2}


def rows() -> list[ResultRow]:
    return [
        ResultRow("E1", "r8", "glue_rte", 87, {"accuracy": 0.8288}, job=1, attempt=1, level=0, step="as configured"),
        ResultRow("E1", "r8", "glue_rte", 127, {"accuracy": 0.8}, job=2, attempt=3, level=2, step="halve_batch",
                  changes=HALVED, inexact=("halve_batch",)),
        ResultRow("E1", "r16", "glue_rte", 87, {"accuracy": 0.9}, job=3, attempt=1, level=0),
        ResultRow("E1", "r16", "glue_rte", 127, {"accuracy": 0.7}, job=4, attempt=1, level=0),
        ResultRow("E1", "r8", "glue_cola", 87, {"mcc": 0.4}, job=5, attempt=1, level=0),
        ResultRow("E1", "r16", "glue_cola", 87, {"mcc": 0.5}, job=6, attempt=1, level=0),
    ]


def test_markdown_is_configs_by_tasks_with_best_in_bold_and_mixed_levels_marked() -> None:
    text = to_markdown(aggregate(rows()))
    lines = text.splitlines()
    # suite order (the order of submission), each task column followed by its n
    assert lines[0] == "| config | glue\\_rte (accuracy) | n | glue\\_cola (mcc) | n |"
    assert lines[1] == "|---|---:|---:|---:|---:|"
    by_config = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:4]}
    # r8 on rte: mean 0.8144, seeds at levels 0 and 2 -> best (0.8144 > 0.8) and marked
    assert by_config["r8"][:2] == ["**0.8144 ± 0.0204** †", "2"]
    assert by_config["r16"][:2] == ["0.8000 ± 0.1414", "2"]
    # one seed each on cola: no std (never ± 0.0000) and no bold, whatever the mean
    assert by_config["r16"][2:] == ["0.5000 ± —", "1"] and by_config["r8"][2:] == ["0.4000 ± —", "1"]
    assert "changes numerics (halve\\_batch)" in text and "± 0.0000" not in text
    assert "bold: per column, the best test mean among rows with n ≥ 2 (no val reported: chosen on test)" in text


def test_latex_escapes_names_bolds_the_best_and_marks_mixed_levels() -> None:
    text = to_latex(aggregate(rows()))
    assert text.startswith("\\begin{tabular}{lrrrr}\n\\hline\n")
    assert "config & glue\\_rte (accuracy) & $n$ & glue\\_cola (mcc) & $n$ \\\\" in text
    assert "r8 & \\textbf{0.8144 $\\pm$ 0.0204}$^{\\dagger}$ & 2 & 0.4000 $\\pm$ -- & 1 \\\\" in text
    assert "r16 & 0.8000 $\\pm$ 0.1414 & 2 & 0.5000 $\\pm$ -- & 1 \\\\" in text
    assert "\\end{tabular}" in text and "changes numerics (halve\\_batch): their values are equivalent" in text
    assert "orch" not in text and "--json" not in text  # a legend for a paper: no command-line text
    assert latex_escape("a_b&c%d$e#f{g}") == "a\\_b\\&c\\%d\\$e\\#f\\{g\\}"


def test_csv_has_no_float_noise_and_says_which_levels() -> None:
    parsed = list(csv.DictReader(io.StringIO(to_csv(aggregate([
        ResultRow("E1", "a", "glue_rte", 1, {"accuracy": 0.1 + 0.7288}, level=0),  # 0.8287999999999999
        ResultRow("E1", "a", "glue_rte", 2, {"accuracy": 0.8288}, level=1, changes={"gradient_checkpointing": True}),
    ])))))
    assert parsed[0]["mean"] == "0.8288" and parsed[0]["std"] == "0.0"
    assert parsed[0]["levels"] == "0 1" and parsed[0]["mixed_levels"] == "true"
    # checkpointing is exact: mixed levels, bit-equal numbers, no mark
    assert (
        parsed[0]["inexact_rungs"],
        parsed[0]["run_levels"],
        parsed[0]["run_inexact_rungs"],
    ) == ("", "0 1", "1:-; 2:-")


def test_json_traces_every_seed_to_its_attempt_and_level() -> None:
    (rte,) = [r for r in to_records(aggregate(rows())) if r["config"] == "r8" and r["task"] == "glue_rte"]
    assert rte["mixed_levels"] is True
    assert rte["runs"][1] == {
        "seed": 127, "value": 0.8, "job": 2, "attempt": 3, "level": 2, "step": "halve_batch",
        "changes": HALVED, "run_alone": False,
        "changed": "gradient_checkpointing=true, batch_size=2, gradient_accumulation_steps=2", "test_is_val": False,
        "val": None, "best_step": None, "inexact_rungs": ["halve_batch"],
        "diverged": None, "code": None, "libraries": None, "fused_members": None,
    }
    assert rte["inexact_rungs"] == ["halve_batch"] and rte["marks"] == ["†"]
    assert rte["runs"][0]["changed"] == "nothing"
    (same,) = [r for r in to_records(aggregate(rows())) if r["config"] == "r16" and r["task"] == "glue_rte"]
    assert same["mixed_levels"] is False


def _succeeded(store: Store, job_id: int, run_dir: Path, level: int, overrides: dict, accuracy: float) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"status": "ok", "metrics": {"test": {"accuracy": accuracy}}}))
    with store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, ended_at, "
            "outcome, overrides_json, predicted_peak_mib, prediction_source, reserved_mib) "
            "VALUES (?, ?, ?, 'step', 0, 'GPU-0', ?, 1.0, 2.0, 'succeeded', ?, 100, 'declared', 0)",
            [job_id, level + 1, level, str(run_dir), json.dumps(overrides)],
        )
        store.execute("UPDATE jobs SET state = 'succeeded', level = ? WHERE id = ?", [level, job_id])


@pytest.fixture
def finished_db(orch_inproc: OrchRunner, db_path: Path, tmp_path: Path) -> Path:
    assert orch_inproc("submit", "--suite", "demo", "--pairs", "87:glue_rte 127:glue_rte").rc == 0
    with Store(db_path) as store:
        jobs = read_jobs(store)
        for job in jobs:
            mixed = job.config_name == jobs[0].config_name and job.seed == 127
            _succeeded(store, job.id, tmp_path / "runs" / str(job.id), 2 if mixed else 0,
                       HALVED if mixed else {}, 0.8 + job.id / 100)
    return db_path


@pytest.mark.parametrize(
    ("fmt", "needle"),
    [("markdown", "| config |"), ("latex", "\\begin{tabular}"), ("csv", "suite,config,task,metric,mean,std")],
)
def test_orch_results_formats(orch_inproc: OrchRunner, finished_db: Path, fmt: str, needle: str) -> None:
    result = orch_inproc("results", "--format", fmt)
    assert result.rc == 0, result.stderr
    assert needle in result.stdout
    assert result.stdout.endswith("\n") and not result.stdout.endswith("\n\n")  # piped or to a file: one line end
    if fmt != "csv":
        assert "†" in result.stdout or "dagger" in result.stdout


def test_orch_results_json_and_table(orch_inproc: OrchRunner, finished_db: Path) -> None:
    payload = json.loads(orch_inproc("results", "--json").stdout)
    marked = [cell for cell in payload if cell["marks"] == ["†"]]
    assert len(marked) == 1
    levels = {run["seed"]: run["level"] for run in marked[0]["runs"]}
    assert levels == {87: 0, 127: 2}
    assert all(run["job"] and run["attempt"] for cell in payload for run in cell["runs"])
    table = orch_inproc("results")
    assert "0,2 †" in table.stdout and "changes numerics (step)" in table.stdout  # recorded before rungs were
    both = orch_inproc("results", "--json", "--format", "csv")
    assert both.rc == 2


def test_a_diverged_run_and_mixed_code_are_marked_in_every_format() -> None:
    why = "final loss 9.2e+08 above the first steps' 0.7"
    summaries = aggregate(
        [
            ResultRow(
                "E1",
                "wild",
                "glue_rte",
                1,
                {"accuracy": 0.5},
                job=1,
                diverged=why,
                code="1a2b3c4d5e6f",
                libraries="torch 2.5",
            ),
            ResultRow(
                "E1",
                "wild",
                "glue_rte",
                2,
                {"accuracy": 0.6},
                job=2,
                code="1a2b3c4d5e6f+dirty",
                libraries="torch 2.5",
            ),
            ResultRow(
                "E1",
                "calm",
                "glue_rte",
                1,
                {"accuracy": 0.7},
                job=3,
                code="1a2b3c4d5e6f",
                libraries="torch 2.5",
            ),
            ResultRow(
                "E1", "calm", "glue_rte", 2, {"accuracy": 0.8}, job=4, code="1a2b3c4d5e6f"
            ),  # libraries unknown
        ]
    )
    calm, wild = sorted(summaries, key=lambda s: s.config)
    assert (calm.diverged, calm.mixed_provenance) == ((), False)
    assert [r.seed for r in wild.diverged] == [1] and wild.mixed_provenance
    assert f"seed 1 (job 1): loss diverged, {why}: counted, marked" in wild.notes
    assert "runs differ in code (`orch results --json` lists each run's)" in wild.notes
    markdown = to_markdown(summaries)
    assert "0.5500 ± 0.0707 ♯ ‖ \\*" in markdown and "♯ a run's loss diverged" in markdown
    assert "‖ runs ran different code" in markdown
    assert "0.7500 ± 0.0707** |" in markdown  # the calm row carries no mark
    latex = to_latex(summaries)
    assert r"$^{\sharp \| *}$" in latex and r"$^\sharp$ a run's loss diverged" in latex
    parsed = {row["config"]: row for row in csv.DictReader(io.StringIO(to_csv(summaries)))}
    assert (parsed["wild"]["diverged"], parsed["wild"]["mixed_provenance"]) == ("1", "true")
    assert (parsed["calm"]["diverged"], parsed["calm"]["mixed_provenance"]) == ("0", "false")
    record = {r["config"]: r for r in to_records(summaries)}["wild"]
    assert record["diverged"] == 1 and record["marks"] == ["♯", "‖", "*"]
    assert record["runs"][0]["diverged"] == why and record["runs"][1]["code"] == "1a2b3c4d5e6f+dirty"
    assert record["provenance"] == {"code": ["1a2b3c4d5e6f", "1a2b3c4d5e6f+dirty"], "libraries": ["torch 2.5"]}


def test_the_score_line_explains_val_only_where_the_table_has_a_val_column() -> None:
    from orchestrator.results.formats import SCORE_LINE, score_line

    assert score_line(True) == SCORE_LINE and "validation split" in score_line(True)
    assert "val" not in score_line(False) and score_line(False).startswith("mean ± std over seeds")


def test_every_legend_line_escapes_to_plain_ascii_latex() -> None:
    # pdflatex stopped at a raw ≤ in the † legend (and − in the score line)
    from orchestrator.results.formats import LEGEND, POOLED_LINE, SCORE_LINE, score_line

    for text in (*LEGEND.values(), SCORE_LINE, POOLED_LINE):
        escaped = latex_escape(text)
        assert escaped.isascii(), [ch for ch in escaped if not ch.isascii()]
    assert "over runs" in score_line(True, pooled=True) and "over seeds" not in score_line(True, pooled=True)
    assert "over seeds" in score_line(True)


def test_a_column_of_a_script_without_tasks_is_titled_by_its_metric_alone() -> None:
    # the markdown and LaTeX heads read " (accuracy)", the notes "a ·  (accuracy): ..."
    from orchestrator.results.formats import column_title

    assert column_title("", "accuracy") == "accuracy" and column_title("rte", "accuracy") == "rte (accuracy)"
    summaries = [dataclasses.replace(s, task="") for s in aggregate(rows())]
    head = to_markdown(summaries).splitlines()[0]
    assert "| accuracy |" in head.replace("  ", " ") and " (accuracy)" not in head, head


def test_the_no_metrics_count_is_of_the_rows_shown_and_the_runs_that_count(
    orch_inproc: OrchRunner, finished_db: Path, tmp_path: Path
) -> None:
    (tmp_path / "runs" / "1" / "result.json").write_text(json.dumps({"status": "ok", "metrics": {}}))
    with Store(finished_db) as store:
        config = next(job.config_name for job in read_jobs(store) if job.id == 1)
        other = next(job.config_name for job in read_jobs(store) if job.config_name != config)
    assert "1 succeeded job(s) had no test metrics" in orch_inproc("results").stderr
    assert "had no test metrics" not in orch_inproc("results", "--where", f"config={other}").stderr
    # seed 2's first run reported nothing; its rerun, job 3, counts
    from orchestrator.results.table import no_metric_jobs

    rows = [ResultRow("E", "c", "toy", 1, {"accuracy": 0.5}, job=1),
            ResultRow("E", "c", "toy", 2, {}, job=2, no_metrics="none"),
            ResultRow("E", "c", "toy", 2, {"accuracy": 0.6}, job=3),
            ResultRow("E", "c", "toy", 3, {}, job=4, no_metrics="none")]  # fmt: skip
    assert no_metric_jobs(rows, aggregate(rows)) == 1
