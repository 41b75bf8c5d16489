"""One results model behind every view: a study like a reviewer's (3 configs × 2 tasks × 4 seeds, a
forced rerun, a cancelled seed, an OOM that reached half batch, a diverging run, a failed seed)
gives the same numbers, n and marks in `orch results --json`, `Sweep.summary()`, the web's results
page and the report, and the counted rows of `Sweep.results()` average to the CLI's mean. Jobs are
submitted through the CLI and ended in the store: most attempts with their numbers stored at
their end (as the daemon stores them), one config's from before readings were stored (their
run dirs are read)."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import Sweep
from orchestrator.attempts.reported import reading_of
from orchestrator.lifecycle import JobState
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptEnd, finish_attempt
from orchestrator.store.queries import get_attempts
from tests.conftest import OrchRunner
from tests.store_reads import read_jobs

CONFIGS = ("c1", "c2", "c3")
TASKS = ("glue_rte", "glue_mrpc")
SEEDS = (1, 2, 3, 4)
DIVERGED = "final loss 5.2e+09 above 10 × its minimum 24.4"


def _plans(root: Path) -> Path:
    plans = root / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "study").mkdir(parents=True)
    for i, name in enumerate(CONFIGS):
        config = {"model": "tiny-llama", "batch_size": 8, "learning_rate": 1e-4 * (i + 1)}
        (plans / "configs" / "study" / f"{name}.yaml").write_text(json.dumps(config))
    (plans / "suites" / "study.yaml").write_text(
        json.dumps({"worker": "sim", "mem_gib": 1, "configs": list(CONFIGS)})
    )
    return plans


def _result(config: str, task: str, seed: int, shift: float = 0.0) -> dict[str, Any]:
    jitter = 0.003 * (
        (seed * (CONFIGS.index(config) + 2)) % 3
    )  # settings differ by more than a constant
    base = (
        0.5 + 0.05 * CONFIGS.index(config) + 0.011 * seed + 0.1 * TASKS.index(task) + jitter + shift
    )
    test = {"accuracy": round(base, 4), "f1": round(base - 0.02, 4)}
    val = {k: round(v + 0.03 - 0.004 * seed, 4) for k, v in test.items()}
    return {"status": "ok", "best_step": 10 * seed, "metrics": {"test": test, "val": val}}


def _attempt(
    store: Store,
    job_id: int,
    n: int,
    run_dir: Path,
    *,
    level: int = 0,
    step: str = "as configured",
    inexact: list[str] | None = None,
) -> None:
    with store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, "
            "overrides_json, predicted_peak_mib, prediction_source, reserved_mib, inexact_rungs_json) "
            "VALUES (?, ?, ?, ?, 0, 'GPU-0', ?, 1.0, '{}', 100, 'declared', 0, ?)",
            [job_id, n, level, step, str(run_dir), json.dumps(inexact or [])],
        )


def _end(
    store: Store,
    job_id: int,
    run_dir: Path,
    outcome: str,
    state: JobState,
    result: dict[str, Any] | None,
    *,
    n: int = 1,
    stored: bool = True,
    diverged: str | None = None,
    reason: str = "",
    **where: Any,
) -> None:
    """An attempt of the job that ended with `outcome`: its numbers stored at its end (as the
    daemon does), or with `stored` off, as an attempt that ended before readings were stored."""
    run_dir.mkdir(parents=True)
    if result is not None:
        (run_dir / "result.json").write_text(json.dumps(result))
    _attempt(store, job_id, n, run_dir, **where)
    attempt = get_attempts(store, job_id)[-1]
    reported = reading_of(result, None).to_record() if stored else None
    assert finish_attempt(
        store,
        attempt,
        AttemptEnd(
            outcome, reason, 0, None, 100, state, {}, "ended", diverged=diverged, reported=reported
        ),
    )
    with store.write():
        store.execute(
            "UPDATE jobs SET state = ?, reason = ?, attempt_count = ? WHERE id = ?",
            [state.value, reason or None, n, job_id],
        )


@pytest.fixture
def study(
    orch_inproc: OrchRunner, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> OrchRunner:
    monkeypatch.setenv("ORCH_PLANS", str(_plans(tmp_path)))
    pairs = " ".join(f"{seed}:{task}" for task in TASKS for seed in SEEDS)
    assert orch_inproc("submit", "--suite", "study", "--pairs", pairs).rc == 0
    assert orch_inproc("submit", "--suite", "study", "--pairs", "1:glue_rte", "--force").rc == 0
    runs = tmp_path / "runs"
    with Store(db_path) as store:
        for job in read_jobs(store):
            key = (job.config_name, job.data, job.seed)
            run_dir = runs / str(job.id)
            result = _result(*key)
            if job.id > len(CONFIGS) * len(TASKS) * len(
                SEEDS
            ):  # the forced reruns of seed 1 on glue_rte
                _end(
                    store,
                    job.id,
                    run_dir,
                    "succeeded",
                    JobState.SUCCEEDED,
                    _result(*key, shift=0.07),
                )
            elif key == ("c2", "glue_rte", 3):
                _end(
                    store,
                    job.id,
                    run_dir,
                    "cancelled",
                    JobState.CANCELLED,
                    None,
                    reason="cancelled by hand",
                )
            elif key == (
                "c3",
                "glue_rte",
                2,
            ):  # an OOM at level 0, then half batch × double accumulation
                _end(store, job.id, runs / f"{job.id}-1", "oom", JobState.QUEUED, None)
                _end(
                    store,
                    job.id,
                    run_dir,
                    "succeeded",
                    JobState.SUCCEEDED,
                    result,
                    n=2,
                    level=2,
                    step="halve_batch",
                    inexact=["halve_batch"],
                )
            elif key == ("c2", "glue_mrpc", 4):
                _end(
                    store,
                    job.id,
                    run_dir,
                    "succeeded",
                    JobState.SUCCEEDED,
                    result,
                    diverged=DIVERGED,
                )
            elif key == ("c3", "glue_mrpc", 1):
                _end(
                    store,
                    job.id,
                    run_dir,
                    "failed",
                    JobState.FAILED,
                    {
                        "status": "failed",
                        "error": "RuntimeError: CUDA error: device-side assert\nTraceback",
                    },
                    reason="exit 1",
                )
            else:  # c1 on glue_mrpc ended before readings were stored: read from its run dirs
                _end(
                    store,
                    job.id,
                    run_dir,
                    "succeeded",
                    JobState.SUCCEEDED,
                    result,
                    stored=not (job.config_name == "c1" and job.data == "glue_mrpc"),
                )
    return orch_inproc


def _cli(run: OrchRunner, *args: str) -> list[dict[str, Any]]:
    result = run("results", "--json", *args)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def _pivot_cells(page: str) -> dict[str, list[str]]:
    """Each pivot row's cells, as text, by config label."""
    rows = {}
    for label, body in re.findall(
        r'<tr class="pivot-row" data-config="([^"]*)">(.*?)</tr>', page, re.S
    ):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
        rows[html.unescape(label)] = [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells
        ]
    return rows


def _cli_scores(run: OrchRunner) -> dict[tuple[str, str], str]:
    """`0.5488 ± 0.0275` by (config, task), as the CLI's terminal table shows it."""
    lines = run("results").stdout.splitlines()
    scores = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) > 5 and cells[0] == "study":
            scores[(cells[1], cells[2])] = " ".join(cells[4].split()[:3]).rstrip(" †¶◇♯‖")
    return scores


def _cell_text(record: dict[str, Any], score: str) -> str:
    """A pivot cell of the web page: the CLI's score, its n and the CLI's marks."""
    mean, std = record["mean"], record["std"]
    assert score == (
        "—" if mean is None else f"{mean:.4f} ± " + ("—" if std is None else f"{std:.4f}")
    ) or (abs(float(score.split()[0]) - mean) <= 5e-5)  # the JSON's mean, shown to 4 digits
    return f"{score} · n {record['n_text']}" + (
        f" {''.join(record['marks'])}" if record["marks"] else ""
    )


def test_the_study_reads_the_same_in_the_cli_the_notebook_the_web_and_the_report(
    study: OrchRunner, db_path: Path
) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("starlette", reason="needs the web extra")
    from orchestrator.results.collect import RunReader
    from orchestrator.web.pages import results_fragment
    from orchestrator.web.report import render_report
    from orchestrator.web.results_view import result_table

    cli = _cli(study)
    rows = {(r["config"], r["task"]): r for r in cli}
    assert len(cli) == 6
    # what the study did, as the CLI accounts for it
    rte1, rte2, rte3 = rows[("c1", "glue_rte")], rows[("c2", "glue_rte")], rows[("c3", "glue_rte")]
    assert (rte1["n"], rte1["n_text"]) == (4, "4") and any(
        "seed 1 ran twice" in n for n in rte1["notes"]
    )
    assert rte1["mean"] == pytest.approx(
        sum(_result("c1", "glue_rte", s)["metrics"]["test"]["accuracy"] for s in SEEDS) / 4
        + 0.07 / 4,
        abs=1e-4,
    )  # the rerun's, not both
    assert (rte2["n"], rte2["n_text"]) == (3, "3 of 4 (seed 3 cancelled)") and "¶" in rte2["marks"]
    assert "†" in rte3["marks"] and rte3["inexact_rungs"] == ["halve_batch"] and rte3["n"] == 4
    assert "♯" in rows[("c2", "glue_mrpc")]["marks"] and rows[("c2", "glue_mrpc")]["diverged"] == 1
    failed = rows[("c3", "glue_mrpc")]
    assert (
        failed["n_text"] == "3 of 4 (seed 1 failed)"
        and "RuntimeError: CUDA error" in failed["accounted"]
    )
    assert (
        rows[("c1", "glue_mrpc")]["n"] == 4 and rows[("c1", "glue_mrpc")]["metric"] == "f1"
    )  # from run dirs

    # the notebook: summary() is the CLI's records, in a frame too
    sweep = Sweep(db_path)
    assert sweep.summary(as_frame=False) == [{**r, "setting": r["overrides_label"]} for r in cli]
    frame = sweep.summary()
    assert frame["n"].tolist() == [r["n"] for r in cli] and frame["n_text"].tolist() == [
        r["n_text"] for r in cli
    ]
    assert frame["mean"].tolist() == [r["mean"] for r in cli] and frame["marks"].tolist() == [
        r["marks"] for r in cli
    ]

    # results(): one row per run; the counted test rows of a row's metric are its n values and mean
    results = sweep.results()
    assert set(results["state"]) == {"succeeded", "failed", "cancelled"}
    for record in cli:
        mine = results[
            (results["config"] == record["config"])
            & (results["task"] == record["task"])
            & (results["metric"] == record["metric"])
            & (results["split"] == "test")
        ]
        counted = mine[mine["counted"]]
        assert len(counted) == record["n"] and sorted(counted["seed"]) == record["seeds"]
        assert round(counted["value"].mean(), 10) == record["mean"]
        vals = results[
            (results["config"] == record["config"])
            & (results["task"] == record["task"])
            & (results["metric"] == record["metric"])
            & (results["split"] == "val")
            & results["counted"]
        ]
        assert round(vals["value"].mean(), 10) == record["val_mean"]
    lost = results[results["state"].isin(["failed", "cancelled"])]
    assert lost["value"].isna().all() and not lost["counted"].any() and set(lost["marks"]) == {"¶"}
    replaced = results[
        (results["config"] == "c1")
        & (results["seed"] == 1)
        & (results["task"] == "glue_rte")
        & (results["split"] == "test")
        & (results["metric"] == "accuracy")
    ]
    assert replaced["counted"].tolist() == [False, True] and "ran again" in replaced["why"].iloc[0]
    half = results[
        (results["config"] == "c3") & (results["seed"] == 2) & (results["task"] == "glue_rte")
    ]
    assert (
        set(half["marks"]) == {"†"}
        and set(half["level"]) == {2}
        and set(half["inexact_rungs"]) == {"halve_batch"}
    )

    # the web's results page and the report: the same cells
    with Store(db_path) as store:
        page = results_fragment(result_table(store, RunReader()), "/results.csv")
        report = render_report(store)
    scores = _cli_scores(study)
    assert len(scores) == 6
    for shown in (page, report):
        cells = _pivot_cells(shown)
        for record in cli:
            expected = _cell_text(record, scores[(record["config"], record["task"])])
            assert expected in cells[record["config"]], (expected, cells)


def test_a_table_needs_no_run_dir_once_readings_are_stored(
    study: OrchRunner, db_path: Path, tmp_path: Path
) -> None:
    from orchestrator.results.collect import collect_rows

    with Store(db_path) as store:
        assert (
            collect_rows(store).from_run_dirs == 4
        )  # c1 on glue_mrpc ended before readings were stored
    before = _cli(study)
    with Store(db_path) as store:
        assert collect_rows(store).from_run_dirs == 0  # read once, then stored with their attempts
    for result_json in (tmp_path / "runs").rglob("result.json"):
        result_json.unlink()
    assert _cli(study) == before  # no table reopens a run dir


def test_markdown_shows_val_one_bold_per_column_and_the_legend_says_what_the_numbers_are(
    study: OrchRunner,
) -> None:
    markdown = study("results", "--format", "markdown").stdout
    header = next(line for line in markdown.splitlines() if line.startswith("| config |"))
    assert header.count("| val |") == 2  # both columns' rows report val
    body = [line for line in markdown.splitlines() if line.startswith("| c")]
    for column in (1, 4):  # each task's value cell: one bold row
        assert sum("**" in line.split(" | ")[column] for line in body) == 1
    assert "sample standard deviation (n − 1)" in markdown
    assert "best evaluation on the validation split" in markdown
    assert "a tie at the shown precision goes to" in markdown
    assert (
        "bit-equal in bf16" in markdown
    )  # † is used: its legend says where exact rungs are bit-equal


def test_ci_and_a_paired_comparison_through_scipy(
    study: OrchRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rows = {(r["config"], r["task"]): r for r in _cli(study, "--ci")}
    c2 = rows[("c2", "glue_rte")]
    values = [run["value"] for run in c2["runs"]]
    low, high = scipy_stats.t.interval(
        0.95, len(values) - 1, loc=c2["mean"], scale=scipy_stats.sem(values)
    )
    assert c2["ci95"] == [pytest.approx(low), pytest.approx(high)]
    assert "95% CI" in study("results", "--ci").stdout

    said = study("results", "--compare", "c1", "c2")
    assert said.rc == 0, said.stderr
    line = next(text for text in said.stdout.splitlines() if text.startswith("glue_rte (accuracy)"))
    # paired on the seeds both counted: seed 3 of c2 was cancelled
    assert "over 3 paired seed(s) (1 2 4)" in line and "seeds only in A: 3 (left out)" in line
    a = {run["seed"]: run["value"] for run in rows[("c1", "glue_rte")]["runs"]}
    b = {run["seed"]: run["value"] for run in c2["runs"]}
    expected = scipy_stats.ttest_rel([a[s] for s in (1, 2, 4)], [b[s] for s in (1, 2, 4)])
    assert f"t = {expected.statistic:.3f}, p = {expected.pvalue:.3g}" in line

    unknown = study("results", "--compare", "c1", "c9")
    assert unknown.rc == 2 and "no setting 'c9'" in unknown.stderr
    monkeypatch.setitem(sys.modules, "scipy", None)  # as where scipy is not installed
    missing = study("results", "--ci")
    assert (
        missing.rc == 2
        and "--ci and --compare need scipy: pip install 'orch[stats]'" in missing.stderr
    )
    assert len(missing.stderr.strip().splitlines()) == 1 and "Traceback" not in missing.stderr


def test_a_tie_at_the_shown_precision_bolds_one_row_and_a_choice_on_fewer_seeds_is_noted() -> None:
    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.grids import to_markdown
    from orchestrator.results.selection import choice_notes, choose, is_chosen

    def rows(config: str, vals: list[float], test: float) -> list[ResultRow]:
        return [
            ResultRow(
                "E",
                config,
                "toy",
                seed,
                {"accuracy": test + seed / 1000},
                job=seed,
                val_metrics={"accuracy": val},
            )
            for seed, val in enumerate(vals, 1)
        ]

    # a and b tie at 0.5000 on val; b is better unrounded; c has four seeds, a and b two
    summaries = aggregate(
        rows("a", [0.50001, 0.50001], 0.9)
        + rows("b", [0.50002, 0.50002], 0.1)
        + rows("c", [0.4, 0.4, 0.4, 0.4], 0.5)
    )
    choices = choose(summaries, 4)
    assert [s.config for s in summaries if is_chosen(s, choices)] == ["b"]
    assert choice_notes(choices) == [
        "toy (accuracy): the choice, b, has 2 seeds; its rivals up to 4"
    ]
    markdown = to_markdown(summaries)
    assert sum("**" in line for line in markdown.splitlines() if line.startswith("| ")) == 1
    assert "the choice, b, has 2 seeds" in markdown
    # an exact tie goes to more seeds, then to the first row
    tied = aggregate(rows("a", [0.5, 0.5], 0.9) + rows("b", [0.5, 0.5, 0.5], 0.1))
    assert [s.config for s in tied if is_chosen(s, choose(tied, 4))] == ["b"]


def test_the_web_footer_says_what_the_cli_says_of_runs_without_metrics() -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from orchestrator.web.pages import results_fragment
    from orchestrator.web.results_view import ResultTable

    page = results_fragment(ResultTable([], "", 2, []), "/results.csv")
    assert (
        "2 succeeded job(s) had no test metrics (result.json or printed)" in page
    )  # the CLI's stderr line


def test_after_a_forced_rerun_the_notes_name_the_run_that_counts_and_the_per_run_table_agrees() -> (
    None
):
    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.run_lines import run_lines

    # seed 2's first run reported no accuracy; `--force` reran seeds 1 and 2
    rows = [ResultRow("E", "c", "toy", 1, {"accuracy": 0.5}, job=1),
            ResultRow("E", "c", "toy", 2, {"loss": 0.3}, job=2, no_metrics=None),
            ResultRow("E", "c", "toy", 1, {"accuracy": 0.7}, job=3),
            ResultRow("E", "c", "toy", 2, {"accuracy": 0.6}, job=4)]  # fmt: skip
    (summary,) = aggregate(rows)
    assert (summary.n_text, summary.failed_runs) == ("2", False)
    assert "seed 2: an earlier run, job 2, reported no accuracy; job 4 counted" in summary.notes
    assert not any(note.endswith("not counted") for note in summary.notes)  # no seed reads as lost
    lines = [line for line in run_lines(rows, [summary]) if line.metric == "accuracy"]
    assert [(line.job, line.counted) for line in lines] == [
        (1, False),
        (3, True),
        (2, False),
        (4, True),
    ]
    assert lines[0].why == "seed 1 ran again: job 3 counted"
    assert lines[2].why.startswith("reported no accuracy")
    assert sum(line.value for line in lines if line.counted) / 2 == summary.mean


def test_a_reading_stored_at_an_attempts_end_reads_back_as_read() -> None:
    from orchestrator.attempts.reported import reading_from_record

    result = {
        "status": "ok",
        "best_step": 40,
        "test_is_val": True,
        "lora_dropout": 0.05,
        "error": "x\ny",
        "metrics": {
            "test": {"eval_accuracy": 0.8, "step": 3, "nan": float("nan")},
            "val": {"accuracy": 0.9},
        },
    }
    reading = reading_of(result, None)
    assert reading.metrics == {"accuracy": 0.8}  # each metric once, no bookkeeping, no NaN
    assert (reading.val_metrics, reading.best_step, reading.test_is_val, reading.error) == (
        {"accuracy": 0.9},
        40,
        True,
        "x",
    )
    assert reading_from_record(json.dumps(reading.to_record())) == reading
    printed = reading_of(None, '{"test_f1": 0.7}')  # a script that only printed its metrics
    assert printed.metrics == {"f1": 0.7} and printed.printed_splits
    for bad in (None, "", "[]", "{", json.dumps({"version": 99, "test": {"a": 1}})):
        assert reading_from_record(bad) is None  # read from the run dir instead


def test_a_pruned_seed_is_accounted_for_as_a_terminal_state_once_the_lifecycle_has_it() -> None:
    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.run_lines import run_lines

    pruned: Any = "pruned"  # a job row may carry the state by its value
    rows = [ResultRow("E", "c", "toy", 1, {"accuracy": 0.5}, job=1),
            ResultRow("E", "c", "toy", 2, {"accuracy": 0.7}, job=2),
            ResultRow("E", "c", "toy", 3, {}, job=3, state=pruned)]  # fmt: skip
    (summary,) = aggregate(rows)
    assert summary.n_text == "2 of 3 (1 pruned)" and not summary.failed_runs  # ‡, not ¶
    assert "seed 3 (job 3) pruned by early stopping: not counted" in summary.notes
    line = run_lines(rows, [summary])[-1]
    assert (line.state, line.counted, line.value, line.marks) == ("pruned", False, None, ("‡",))
