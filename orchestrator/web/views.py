"""Each page's fragment from the store: the reads (through store.web_queries) and the
rendering (pages), shared by the live app and the report."""

from __future__ import annotations

from orchestrator.daemon_state import daemon_alive
from orchestrator.runfiles import loss_curve, read_log_tail
from orchestrator.store.db import Store, now_s
from orchestrator.store.gpu_samples import gpu_sample_series
from orchestrator.store.queries import job_history
from orchestrator.store.web_queries import attempt_spans, overview, sweep_time_range
from orchestrator.web import pages
from orchestrator.web.results_view import MetricsCache, result_table

WEB_LOG_TAIL_BYTES = 32 * 1024

TIMELINE_LIMIT = 5000


def overview_view(store: Store) -> str:
    return pages.overview_fragment(overview(store), now_s(), daemon_alive(store) is not None)


def timeline_view(store: Store, from_s: float | None = None, to_s: float | None = None, *, link: bool = True) -> str:
    now = now_s()
    whole = sweep_time_range(store)
    if whole.start_s is None:
        return '<p class="empty" data-attempts="0">no attempt has started yet</p>'
    spans, total = attempt_spans(store, from_s=from_s, to_s=to_s, limit=TIMELINE_LIMIT)
    live = any(s.ended_at is None for s in spans)
    t0 = from_s if from_s is not None else whole.start_s
    t1 = to_s if to_s is not None else max(whole.end_s or whole.start_s, now if live else 0.0)
    gpus = [g.index for g in overview(store, waiting_limit=0, retries_limit=0).gpus]
    return pages.timeline_fragment(spans, total, t0, t1, now, zoomed=from_s is not None or to_s is not None,
                                   gpus=gpus, link=link)


def memory_view(store: Store) -> str:
    return pages.memory_fragment(gpu_sample_series(store))


def job_view(store: Store, job_id: int) -> str:
    """Raises JobNotFound for an unknown id."""
    history = job_history(store, job_id)
    curves = [(f"attempt {a.n}", loss_curve(a.run_dir)) for a in history.attempts]
    last = history.attempts[-1] if history.attempts else None
    return pages.job_fragment(history, curves, read_log_tail(last.run_dir, WEB_LOG_TAIL_BYTES) if last else "", last.n if last else None)


def results_view(store: Store, cache: MetricsCache, csv_href: str) -> str:
    return pages.results_fragment(result_table(store, cache), csv_href)
