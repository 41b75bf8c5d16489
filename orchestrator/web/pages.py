"""HTML of each page: a layout around a fragment the live script swaps in place. Pure: typed
rows in, escaped HTML out."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from orchestrator.lifecycle import JobState
from orchestrator.runfiles import LossPoint
from orchestrator.store.gpu_samples import GpuSample
from orchestrator.store.queries import JobHistory
from orchestrator.store.web_queries import AttemptSpan, Overview
from orchestrator.web.assets import CSS, JS
from orchestrator.web.charts import (
    MEMORY_COLOURS,
    clock,
    dots_svg,
    loss_svg,
    memory_legend,
    memory_svg,
    mib,
    stamp,
    timeline_legend,
    timeline_svg,
)
from orchestrator.web.results_view import ResultTable

PAGES = (("overview", "/", "Overview"), ("timeline", "/timeline", "Timeline"),
         ("memory", "/memory", "Memory"), ("results", "/results", "Results"))
COUNT_ORDER = ("queued", "running", "succeeded", "failed", "cancelled")


# Nothing is loaded from anywhere: inline style and script, SVG in the page; a live page may
# talk to its own server only (the report to nothing at all).
CSP_LIVE = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src data:"
CSP_STATIC = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


# What each live page redraws for (fields of store.web_queries.ChangeMarker). The timeline
# follows memory samples too, a clock every few seconds, so running bars grow.
WATCH = {
    "overview": ("events", "progress", "samples"),
    "timeline": ("events", "samples"),
    "memory": ("samples",),
    "job": ("events", "progress"),
    "results": ("events",),
}


def layout(
    title: str, active: str, body: str, *, fragment_url: str | None = None, watch: tuple[str, ...] = (), nav: bool = True
) -> str:
    links = "".join(
        f'<a href="{href}"{" class=active" if key == active else ""}>{label}</a>' for key, href, label in PAGES
    ) if nav else ""
    live = f' data-fragment="{escape(fragment_url)}" data-watch="{escape(" ".join(watch))}"' if fragment_url else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP_LIVE if fragment_url else CSP_STATIC}">'
        f"<title>{escape(title)} · orch</title><style>{CSS}</style></head>"
        f'<body data-page="{escape(active)}"><header><span class="brand">orch</span>{links}</header>'
        f'<main><div id="live"{live}>{body}</div><p id="action-result" class="muted"></p></main>'
        f'<div id="selection"></div><script>{JS}</script></body></html>'
    )


def counts_html(counts: dict[str, int]) -> str:
    return '<div class="counts">' + "".join(
        f'<span class="state-{k}" data-count="{k}"><b>{counts.get(k, 0)}</b> {k}</span>' for k in COUNT_ORDER
    ) + "</div>"


def _membar(total: int, ours: int, foreign: int) -> str:
    total = max(total, 1)
    return (f'<div class="membar" title="ours {mib(ours)}, foreign {mib(foreign)}, free {mib(total - ours - foreign)}">'
            f'<i style="width:{100 * ours / total:.1f}%;background:{MEMORY_COLOURS["ours"]}"></i>'
            f'<i style="width:{100 * foreign / total:.1f}%;background:{MEMORY_COLOURS["foreign"]}"></i></div>')


def overview_fragment(ov: Overview, now_s: float, daemon_alive: bool) -> str:
    age = f", last tick {now_s - ov.heartbeat_at:.0f} s ago" if ov.heartbeat_at else ""
    parts = [counts_html(ov.counts),
             f'<p class="muted">daemon {"running" if daemon_alive else "not running"}{age}</p>',
             "<h2>GPUs</h2>"]
    if ov.gpus:
        parts.append('<table class="gpus"><thead><tr><th>GPU</th><th>name</th><th>memory</th><th class=num>ours</th>'
                     '<th class=num>foreign</th><th class=num>free</th><th class=num>jobs / slots</th></tr></thead><tbody>')
        for g in ov.gpus:
            parts.append(f'<tr data-gpu="{g.index}"><td>{g.index}</td><td>{escape(g.name)}</td>'
                         f"<td>{_membar(g.total_mib, g.orch_mib, g.foreign_mib)}</td><td class=num>{mib(g.orch_mib)}</td>"
                         f"<td class=num>{mib(g.foreign_mib)}</td><td class=num>{mib(g.free_mib)}</td>"
                         f"<td class=num>{g.running} / {g.slots}</td></tr>")
        parts.append("</tbody></table>")
    else:
        parts.append('<p class="empty">no GPU readings yet (start the daemon)</p>')
    parts.append(f"<h2>Running ({len(ov.running)})</h2>")
    if ov.running:
        parts.append('<table class="running"><thead><tr><th>job</th><th>suite / config</th><th>seed</th><th>data</th>'
                     '<th>GPU</th><th class=num>attempt</th><th class=num>level</th><th class=num>step</th>'
                     '<th class=num>loss</th><th class=num>held / predicted</th><th class=num>elapsed</th></tr></thead><tbody>')
        for r in ov.running:
            step = f"{r.step}/{r.total}" if r.step is not None and r.total else ("-" if r.step is None else str(r.step))
            loss = "-" if r.loss is None else f"{r.loss:.4g}"
            parts.append(f'<tr class="running-job" data-job="{r.job_id}"><td><a href="/job/{r.job_id}">{r.job_id}</a></td>'
                         f"<td>{escape(r.suite)} / {escape(r.config)}</td><td>{r.seed}</td><td>{escape(r.data)}</td>"
                         f"<td>{r.gpu}</td><td class=num>{r.attempt}</td><td class=num>{r.level}</td><td class=num>{step}</td>"
                         f"<td class=num>{loss}</td><td class=num>{mib(r.held_mib)} / {mib(r.predicted_mib)}</td>"
                         f"<td class=num>{max(0.0, now_s - r.started_at):.0f} s</td></tr>")
        parts.append("</tbody></table>")
    else:
        parts.append('<p class="empty">nothing running</p>')
    parts.append(f"<h2>Waiting ({ov.waiting_total})</h2>")
    if ov.waiting:
        parts.append('<table class="waiting"><thead><tr><th>job</th><th>suite / config</th><th>seed</th><th>data</th>'
                     "<th>why it waits</th></tr></thead><tbody>")
        for w in ov.waiting:
            parts.append(f'<tr class="waiting-job" data-job="{w.job_id}"><td><a href="/job/{w.job_id}">{w.job_id}</a></td>'
                         f"<td>{escape(w.suite)} / {escape(w.config)}</td><td>{w.seed}</td><td>{escape(w.data)}</td>"
                         f"<td>{escape(w.reason or '-')}</td></tr>")
        parts.append("</tbody></table>")
        if ov.waiting_total > len(ov.waiting):
            parts.append(f'<p class="muted">and {ov.waiting_total - len(ov.waiting)} more</p>')
    if ov.retries:
        parts.append("<h2>Retries</h2><ul class=retries>" + "".join(
            f'<li>{clock(e.ts)} <a href="/job/{e.job_id}">job {e.job_id}</a>: {escape(e.message)}</li>' for e in ov.retries
        ) + "</ul>")
    if ov.paused:
        parts.append("<h2>Paused suites</h2><ul class=paused>" + "".join(
            f'<li>{escape(p.suite)}: {escape(p.reason)} <button data-action="/api/suites/{quote(p.suite, safe="")}/resume">'
            "resume</button></li>" for p in ov.paused
        ) + "</ul>")
    return "".join(parts)


def timeline_fragment(
    spans: list[AttemptSpan], total: int, t0: float, t1: float, now_s: float, *, zoomed: bool, gpus: list[int], link: bool = True
) -> str:
    shown = f"showing the latest {len(spans)} of {total} attempts in this range; zoom in to see the rest" \
        if total > len(spans) else f"{total} attempt(s)"
    reset = ' · <a href="/timeline">show the whole sweep</a>' if zoomed and link else ""
    hint = " · drag across the chart to zoom" if link else ""
    return (f'<p class="muted" data-attempts="{total}">{stamp(t0)} → {stamp(t1)} UTC · {shown}{hint}{reset}</p>'
            + timeline_legend() + timeline_svg(spans, t0, t1, now_s, gpus=gpus, link=link))


def memory_fragment(samples: list[GpuSample]) -> str:
    return memory_legend() + memory_svg(samples)


def job_fragment(history: JobHistory, curves: list[tuple[str, list[LossPoint]]], log: str, log_attempt: int | None) -> str:
    job, state = history.job, history.job.state.value
    parts = [f'<h2>Job {job.id}: {escape(job.suite)} / {escape(job.config_name)} · seed {job.seed} · {escape(job.data)}</h2>',
             f'<p><b class="state-{escape(state)}" data-state="{escape(state)}">{escape(state)}</b> · '
             f"level {job.level} · attempt {job.attempt_count} of at most {job.max_attempts}"
             + (f" · {escape(job.reason)}" if job.reason else "")
             + (f" · waits: {escape(job.wait_reason)}" if job.wait_reason and job.state is JobState.QUEUED else "") + "</p>",
             f'<p><button data-action="/api/jobs/{job.id}/cancel">cancel</button> '
             f'<button data-action="/api/jobs/{job.id}/retry">retry</button></p>',
             "<h2>Attempts and ladder changes</h2>"]
    if history.attempts:
        parts.append('<table class="attempts"><thead><tr><th>#</th><th>GPU</th><th>level</th><th>changes</th><th>outcome</th>'
                     '<th class=num>peak / predicted</th><th>started</th><th>ended</th><th>reason</th></tr></thead><tbody>')
        for a in history.attempts:
            changes = ", ".join(f"{k}: {v}" for k, v in a.changes.items()) or "-"
            step = f" ({escape(a.level_step)})" if a.level_step else ""
            parts.append(f'<tr class="attempt-row"><td>{a.n}</td><td>{a.gpu_index}</td><td>{a.level}{step}</td><td>{escape(changes)}</td>'
                         f"<td>{escape(a.outcome.value if a.outcome else 'running')}</td><td class=num>{mib(a.peak_mib)} / "
                         f"{mib(a.predicted_peak_mib)} "
                         f'<span class="muted">({escape(a.prediction_source)})</span></td><td>{stamp(a.started_at)}</td>'
                         f"<td>{stamp(a.ended_at)}</td><td>{escape(a.reason or '')}</td></tr>")
        parts.append("</tbody></table>")
    else:
        parts.append('<p class="empty">no attempt yet</p>')
    parts.append("<h2>Loss</h2>" + loss_svg(curves))
    parts.append("<h2>Events</h2><table class=events><tbody>" + "".join(
        f"<tr><td>{stamp(e.ts)}</td><td>{escape(e.kind)}</td><td>{escape(e.message)}</td></tr>" for e in history.events
    ) + "</tbody></table>")
    if log_attempt is not None:
        parts.append(f"<h2>Log tail (attempt {log_attempt})</h2><pre class=log>{escape(log) or '(empty)'}</pre>")
    return "".join(parts)


def results_fragment(table: ResultTable, csv_href: str) -> str:
    if not table.lines:
        return '<p class="empty">no results yet (only succeeded jobs with test metrics count)</p>'
    values = [v for line in table.lines for _, v in line.values]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    parts = [f'<p><a class="csv" href="{escape(csv_href)}" download="results.csv">download CSV</a> · '
             "click a column to sort · points are seeds, the bar is mean ± std</p>",
             '<table class="results sortable"><thead><tr><th data-sort>suite</th><th data-sort>config</th>'
             '<th data-sort>task</th><th data-sort>metric</th><th data-sort class=num>mean</th><th data-sort class=num>± std</th>'
             f'<th data-sort class=num>seeds</th><th>{lo:.3f} … {hi:.3f}</th></tr></thead><tbody>']
    for line in table.lines:
        mean = "-" if line.mean is None else f"{line.mean:.4f}"
        marks = f" {line.marks}" if line.marks else ""
        parts.append(f'<tr class="result"><td>{escape(line.suite)}</td><td>{escape(line.label or line.config)}</td><td>{escape(line.task)}</td>'
                     f'<td>{escape(line.metric)}{escape(marks)}</td><td class=num data-v="{line.mean if line.mean is not None else "NaN"}">{mean}</td>'
                     f'<td class=num data-v="{line.std}">{line.std:.4f}</td><td class=num data-v="{line.n_seeds}">{line.n_seeds}</td>'
                     f"<td>{dots_svg(line.values, line.mean, line.std, lo, hi)}</td></tr>")
    parts.append("</tbody></table>")
    parts += [f'<p class="muted">{escape(text)}</p>' for text in table.legend]
    noted = [f"<li>{escape(line.label)} · {escape(line.task)}: {escape(note)}</li>" for line in table.lines for note in line.notes]
    if noted:
        parts.append('<ul class="muted">' + "".join(noted) + "</ul>")
    if table.missing:
        parts.append(f'<p class="muted">{table.missing} succeeded job(s) had no test metrics in result.json</p>')
    return "".join(parts)
