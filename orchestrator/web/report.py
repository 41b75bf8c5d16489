"""`orch report`: one self-contained HTML file (inline CSS, SVG, uPlot and script, nothing
fetched) with the summary, jobs that failed, timeline, memory, curves and results of a sweep."""

from __future__ import annotations

from urllib.parse import quote

from orchestrator.attempts.provenance_reads import FIELDS as PROVENANCE_FIELDS
from orchestrator.results.collect import RunReader
from orchestrator.store.db import Store, now_s
from orchestrator.store.provenance import provenance_counts
from orchestrator.store.web_queries import JobsFilter, attempt_spans, jobs_page, sweep_counts
from orchestrator.web import pages, views
from orchestrator.web.curves import chart_spec
from orchestrator.web.results_view import result_table
from orchestrator.web.summary import occupancy
from orchestrator.web.templating import render

ALL_ATTEMPTS = 10**9  # the report's figures count every attempt, not a page's latest few
REPORT_CURVE_RUNS = 40  # the latest succeeded jobs whose curves the report carries
# what the report says the succeeded runs ran with (not the code's folder: one per user's layout)
REPORT_PROVENANCE_FIELDS = tuple(name for name in PROVENANCE_FIELDS if name not in ("code_dir", "recorded_by"))


def render_report(store: Store, title: str = "orch sweep report") -> str:
    now = now_s()
    counts = sweep_counts(store)
    spans, _ = attempt_spans(store, limit=ALL_ATTEMPTS)
    table = result_table(store, RunReader())
    failed = jobs_page(store, JobsFilter(state="failed"), limit=200)
    done = jobs_page(store, JobsFilter(state="succeeded"), limit=REPORT_CURVE_RUNS)
    runs, _, _ = views.curve_runs(store, [r.id for r in reversed(done.rows)])
    body = render(
        "report.html",
        title=title,
        now_s=now,
        db_name=store.path.name,
        counts=counts,
        occ=occupancy(spans, now),
        count_order=pages.COUNT_ORDER,
        failed=failed,
        timeline=views.timeline_view(store, link=False),
        memory=views.memory_view(store),
        curves=chart_spec(runs, key="report-curves", band=True, columns=views.CURVE_COLUMNS),
        curve_jobs=len(runs),
        succeeded=counts.by_state.get("succeeded", 0),
        results=pages.results_fragment(table, "data:text/csv;charset=utf-8," + quote(table.csv)),
        provenance=provenance_counts(store, REPORT_PROVENANCE_FIELDS),
    )
    return pages.layout(title, "report", body, nav=False, inline=True)
