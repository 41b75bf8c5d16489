"""`orch report`: one self-contained HTML file (inline CSS, SVG and script, nothing fetched)
with the summary, timeline, memory and results of a sweep."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from orchestrator.store.db import Store, now_s
from orchestrator.store.web_queries import SweepCounts, attempt_spans, sweep_counts
from orchestrator.web import pages, views
from orchestrator.web.charts import stamp
from orchestrator.web.results_view import MetricsCache, result_table
from orchestrator.web.summary import Occupancy, occupancy

ALL_ATTEMPTS = 10**9  # the report's figures count every attempt, not a page's latest few


def summary_html(counts: SweepCounts, occ: Occupancy) -> str:
    density = "-" if occ.packing_density is None else f"{occ.packing_density:.2f}"
    rows = [
        ("jobs", f'<span data-summary="jobs">{counts.jobs}</span>'),
        ("attempts", f'<span data-summary="attempts">{counts.attempts}</span>'),
        ("OOMs (GPU or host)", f'<span data-summary="ooms">{counts.ooms}</span>'),
        ("OOM'd jobs recovered (later succeeded)", f'<span data-summary="oom-recovered">{counts.oom_jobs_recovered}</span>'),
        ("GPU-hours busy (at least one attempt on the GPU)", f'<span data-summary="gpu-hours">{occ.gpu_hours:.3f}</span>'),
        ("attempt-hours", f'<span data-summary="attempt-hours">{occ.attempt_hours:.3f}</span>'),
        ("packing density (attempt-hours / GPU-hours busy)", f'<span data-summary="packing-density">{density}</span>'),
    ]
    outcomes = ", ".join(f"{escape(k)} {v}" for k, v in sorted(counts.by_outcome.items())) or "-"
    return (pages.counts_html(counts.by_state) + '<table class="summary"><tbody>'
            + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
            + f"<tr><td>attempt outcomes</td><td>{outcomes}</td></tr></tbody></table>")


def render_report(store: Store, title: str = "orch sweep report") -> str:
    now = now_s()
    counts = sweep_counts(store)
    spans, _ = attempt_spans(store, limit=ALL_ATTEMPTS)
    table = result_table(store, MetricsCache())
    csv_href = "data:text/csv;charset=utf-8," + quote(table.csv)
    body = "".join([
        f"<h1>{escape(title)}</h1><p class=muted>written {stamp(now)} UTC from {escape(store.path.name)}</p>",
        "<h2>Summary</h2>", summary_html(counts, occupancy(spans, now)),
        '<section id="timeline"><h2>Timeline</h2>', views.timeline_view(store, link=False), "</section>",
        '<section id="memory"><h2>Memory</h2>', views.memory_view(store), "</section>",
        '<section id="results"><h2>Results</h2>', pages.results_fragment(table, csv_href), "</section>",
    ])
    return pages.layout(title, "report", body, nav=False)
