"""Runs trained in a fused group (`share_base: fused`) are not bit-equal to runs of their own:
`orch results` marks them `⊕` in every format (table legend, Markdown, LaTeX, CSV, JSON, the
per-run lines of Sweep.results), from what their result.json said and orch stored."""

from __future__ import annotations

import csv
import io
import json

from orchestrator.attempts.reported import reading_from_record, reading_of
from orchestrator.results.aggregate import ResultRow, aggregate
from orchestrator.results.formats import legend_lines, to_csv, to_records
from orchestrator.results.grids import to_latex, to_markdown
from orchestrator.results.run_lines import run_lines


def _rows() -> list[ResultRow]:
    return [
        ResultRow("E1", "fused", "glue_rte", 1, {"accuracy": 0.5}, job=1, fused=4),
        ResultRow("E1", "fused", "glue_rte", 2, {"accuracy": 0.6}, job=2),
        ResultRow("E1", "solo", "glue_rte", 1, {"accuracy": 0.7}, job=3),
        ResultRow("E1", "solo", "glue_rte", 2, {"accuracy": 0.8}, job=4),
    ]


def test_a_fused_run_is_marked_in_every_format_and_a_solo_row_is_not() -> None:
    summaries = aggregate(_rows())
    fused, solo = sorted(summaries, key=lambda s: s.config)
    assert [r.job for r in fused.fused_runs] == [1] and solo.fused_runs == ()
    legend = legend_lines(summaries)
    assert any(line.startswith("⊕ some runs trained in a fused group (share_base: fused; groups of up to 4 members)")
               for line in legend)
    assert any(line.endswith("not bit-equal to a run of their own, the base ran over the group's larger batch")
               for line in legend)
    alone = aggregate([ResultRow("E1", "fused", "glue_rte", 1, {"accuracy": 0.5}, job=1, fused=1)])
    assert legend_lines(alone) == [
        "⊕ some runs trained in a fused group (share_base: fused; each alone in its group): trained by the fused "
        "code path, not shown bit-equal to a run of its own"
    ]  # not "groups of up to 1 members", nor a larger batch that there never was
    markdown = to_markdown(summaries)
    assert "0.5500 ± 0.0707 ⊕" in markdown and "0.7500 ± 0.0707** |" in markdown
    assert r"$^{\oplus}$" in to_latex(summaries)
    parsed = {row["config"]: row for row in csv.DictReader(io.StringIO(to_csv(summaries)))}
    assert (parsed["fused"]["fused_runs"], parsed["solo"]["fused_runs"]) == ("1", "0")
    record = {r["config"]: r for r in to_records(summaries)}
    assert record["fused"]["marks"] == ["⊕"] and record["solo"]["marks"] == []
    assert [r["fused_members"] for r in record["fused"]["runs"]] == [4, None]
    lines = {line.job: line for line in run_lines(_rows(), summaries)}
    assert lines[1].marks == ("⊕",) and "trained in a group of up to 4 members" in lines[1].why
    assert lines[2].marks == () and lines[2].row_marks == ("⊕",)
    mixed = aggregate([*_rows(), ResultRow("E1", "late", "glue_rte", 1, {"accuracy": 0.5}, job=5, fused=1)])
    assert any(line.startswith("⊕ some runs trained in a fused group (share_base: fused; groups of up to 4 members, "
                               "some runs alone in theirs)") for line in legend_lines(mixed))
    alone_lines = run_lines([ResultRow("E1", "late", "glue_rte", 1, {"accuracy": 0.5}, job=5, fused=1)], mixed)
    # not "a group of up to 1 members"
    assert alone_lines[0].why.startswith("trained alone in a fused process (share_base: fused)")
    unsaid = aggregate([ResultRow("E1", "f", "glue_rte", 1, {"accuracy": 0.5}, job=1, fused=0)])
    assert any("group size not reported" in line for line in legend_lines(unsaid))


def test_the_reading_keeps_what_result_json_said_of_fusing() -> None:
    fused = reading_of({"status": "succeeded", "test": {"accuracy": 0.5}, "share_base": "fused",
                        "fused_members_max": 3}, None)
    assert fused.fused_members == 3
    stored = reading_from_record(json.dumps(fused.to_record()))
    assert stored is not None and stored.fused_members == 3
    assert reading_of({"share_base": "sequential"}, None).fused_members is None
    assert reading_of({"share_base": "fused", "fused_members_max": "3"}, None).fused_members == 0  # junk: not said
    assert reading_of({"share_base": "fused", "fused_members_max": 99}, None).fused_members == 0
    old = {**fused.to_record()}
    del old["fused_members"]  # stored before fused runs were
    assert reading_from_record(json.dumps(old)).fused_members is None  # type: ignore[union-attr]
