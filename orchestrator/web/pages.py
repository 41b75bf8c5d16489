"""HTML of each page: a layout around a fragment the live script swaps in place, rendered
from the Jinja2 templates in templates/ (autoescaped). Pure: typed rows in, HTML out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from orchestrator.attempts.provenance_reads import FIELDS as PROVENANCE_FIELDS
from orchestrator.lifecycle import JobState
from orchestrator.store.queries import JobHistory
from orchestrator.store.web_queries import AttemptSpan, JobsFilter, JobsPage, Overview
from orchestrator.web.assets import static_text
from orchestrator.web.charts import MEMORY_COLOURS, OUTCOME_COLOURS, dot_plot, timeline_layout
from orchestrator.web.memory_chart import GpuMemoryChart
from orchestrator.web.results_view import ResultLine, ResultTable, pivot
from orchestrator.web.templating import render

PAGES = (("overview", "/", "Overview"), ("jobs", "/jobs", "Jobs"), ("timeline", "/timeline", "Timeline"),
         ("memory", "/memory", "Memory"), ("curves", "/curves", "Curves"), ("results", "/results", "Results"),
         ("trials", "/trials", "Trials"))
COUNT_ORDER = tuple(state.value for state in JobState)

# Which actions a job's state allows (as orchestrator.actions.user_actions decides; test_web_unit checks both agree).
ACTIONS_BY_STATE: dict[JobState, tuple[str, ...]] = {
    JobState.QUEUED: ("cancel",),
    JobState.RUNNING: ("cancel", "retry"),
    JobState.FAILED: ("retry",),
    JobState.CANCELLED: ("retry",),
    JobState.PRUNED: ("retry",),
    JobState.SUCCEEDED: (),
}

# A live page loads its script and styles from its own server only (the report inlines them
# and loads nothing); inline style attributes draw the memory bars.
CSP_LIVE = "default-src 'none'; style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'; img-src data:"
CSP_STATIC = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


# What each live page redraws for (fields of store.web_queries.ChangeMarker). The timeline
# follows memory samples too, a clock every few seconds, so running bars grow.
WATCH = {
    "overview": ("events", "progress", "samples"),
    "jobs": ("events",),
    "timeline": ("events", "samples"),
    "memory": ("samples",),
    "job": ("events", "progress"),
    "results": ("events",),
    "trials": ("events",),
    "curves": (),
    "action": (),
}


def inline_assets() -> dict[str, Markup]:
    """The report's script and styles, inlined (`</` can never close the element early)."""
    def safe(text: str) -> Markup:
        return Markup(text.replace("</", "<\\/"))

    return {"css": safe(static_text("orch.css")), "uplot_css": safe(static_text("uPlot.min.css")),
            "uplot_js": safe(static_text("uPlot.iife.min.js")),
            "js": safe(static_text("charts.js") + "\n" + static_text("orch.js"))}


def layout(
    title: str,
    active: str,
    body: str,
    *,
    fragment_url: str | None = None,
    watch: tuple[str, ...] = (),
    nav: bool = True,
    inline: bool = False,
) -> str:
    return render("base.html", title=title, active=active, body=Markup(body), fragment_url=fragment_url, watch=watch,
                  nav=nav, pages=PAGES, inline=inline_assets() if inline else None,
                  csp=Markup(CSP_STATIC if inline else CSP_LIVE))  # our constant: quotes kept as written


def overview_fragment(ov: Overview, now_s: float, daemon_alive: bool) -> str:
    return render("overview.html", ov=ov, now_s=now_s, daemon_alive=daemon_alive, count_order=COUNT_ORDER,
                  colours=MEMORY_COLOURS)


def timeline_fragment(
    spans: list[AttemptSpan],
    total: int,
    t0: float,
    t1: float,
    now_s: float,
    *,
    zoomed: bool,
    gpus: list[int],
    link: bool = True,
) -> str:
    return render(
        "timeline.html",
        layout=timeline_layout(spans, t0, t1, now_s, gpus=gpus),
        total=total,
        shown=len(spans),
        zoomed=zoomed,
        link=link,
        outcome_colours=OUTCOME_COLOURS,
    )


def empty_timeline() -> str:
    return render("timeline.html", layout=None, total=0, shown=0, zoomed=False, link=False, outcome_colours={})


def memory_fragment(charts: Sequence[GpuMemoryChart]) -> str:
    return render("memory.html", charts=charts)


def job_fragment(
    history: JobHistory, curves: dict[str, Any], log: str, log_attempt: int | None, metrics: dict[str, float] | None,
    metrics_note: str, provenance: dict[int, dict[str, str]] | None = None,
) -> str:
    return render("job.html", history=history, curves=curves, log=log, log_attempt=log_attempt,
                  actions=ACTIONS_BY_STATE.get(history.job.state, ()), metrics=metrics or {}, metrics_note=metrics_note,
                  provenance=provenance or {}, provenance_fields=PROVENANCE_FIELDS)


def results_fragment(table: ResultTable, csv_href: str) -> str:
    values = [v for line in table.lines for _, v in line.values]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)

    def dot(line: ResultLine) -> Any:
        return dot_plot(line.values, line.mean, line.std or 0.0, lo, hi)

    return render(
        "results.html",
        table=table,
        csv_href=csv_href,
        pivot=pivot(table.summaries, choices=table.choices or None),
        lo=lo,
        hi=hi,
        dot=dot,
    )


def jobs_fragment(page: JobsPage, f: JobsFilter, by_state: dict[str, int],
                  facts: Mapping[int, tuple[tuple[str, float] | None, float | None, int | None]] | None = None) -> str:
    """`facts`: per job, its headline metric (key, value), run time (api.jobs, store.job_facts) and
    the earlier attempt that reported the value (None when the latest did)."""
    filters = [("state", "state", [s.value for s in JobState], f.state), ("suite", "suite", page.suites, f.suite),
               ("config", "config", page.configs, f.config), ("data", "data", page.datas, f.data)]
    return render(
        "jobs.html",
        page=page,
        filters=filters,
        by_state=by_state,
        count_order=COUNT_ORDER,
        facts=facts or {},
    )


def curves_fragment(runs: list[dict[str, Any]], spec: dict[str, Any], configs: list[str], config: str | None,
                    picked: list[int], missing: int, keys: Sequence[str] = (), by: str | None = None,
                    notes: Sequence[str] = ()) -> str:
    return render("curves.html", runs=runs, spec=spec, configs=configs, config=config, picked=picked, missing=missing,
                  keys=keys, by=by, notes=notes)


def action_page(heading: str, message: str, status: int, job_id: int | None) -> str:
    return render("action.html", heading=heading, message=message, status=status, job_id=job_id)
