"""Each page's fragment from the store: the reads (through store.web_queries) and the
rendering (pages), shared by the live app and the report."""

from __future__ import annotations

from pathlib import Path

from orchestrator.actions.presence import daemon_alive
from orchestrator.attempts.rundir_reads import read_log_tail, read_result
from orchestrator.errors import JobNotFound
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.results.collect import RunReader, finite_metrics, job_metrics
from orchestrator.store.db import Store, now_s
from orchestrator.store.gpu_samples import gpu_sample_series
from orchestrator.store.queries import JobHistory, job_history, state_counts
from orchestrator.store.web_queries import (
    JobsFilter,
    attempt_spans,
    job_labels,
    jobs_page,
    oom_marks,
    overview,
    sweep_time_range,
)
from orchestrator.web import pages
from orchestrator.web.curves import PALETTE, Run, chart_spec, read_curves
from orchestrator.web.memory_chart import memory_charts
from orchestrator.web.results_view import result_table

WEB_LOG_TAIL_BYTES = 32 * 1024

TIMELINE_LIMIT = 5000


def overview_view(store: Store) -> str:
    return pages.overview_fragment(overview(store), now_s(), daemon_alive(store) is not None)


def timeline_view(store: Store, from_s: float | None = None, to_s: float | None = None, *, link: bool = True) -> str:
    now = now_s()
    whole = sweep_time_range(store)
    if whole.start_s is None:
        return pages.empty_timeline()
    spans, total = attempt_spans(store, from_s=from_s, to_s=to_s, limit=TIMELINE_LIMIT)
    live = any(s.ended_at is None for s in spans)
    t0 = from_s if from_s is not None else whole.start_s
    t1 = to_s if to_s is not None else max(whole.end_s or whole.start_s, now if live else 0.0)
    gpus = [g.index for g in overview(store, waiting_limit=0, retries_limit=0).gpus]
    return pages.timeline_fragment(spans, total, t0, t1, now, zoomed=from_s is not None or to_s is not None,
                                   gpus=gpus, link=link)


def memory_view(store: Store) -> str:
    samples = gpu_sample_series(store)
    since = min((s.ts for s in samples), default=None)
    ooms = oom_marks(store, since)
    labels = job_labels(store, {j for s in samples for j in s.held_by_job})
    return pages.memory_fragment(memory_charts(samples, ooms, labels))


def final_metrics(history: JobHistory) -> tuple[dict[str, float] | None, str]:
    """The succeeded attempt's test metrics (as `orch results` reads them), or why there are none."""
    done = [a for a in history.attempts if a.outcome is AttemptOutcome.SUCCEEDED]
    if not done:
        return None, "none yet: only a succeeded attempt has final metrics"
    test = job_metrics(read_result(Path(done[-1].run_dir)), done[-1].output_metrics or None)
    numbers = finite_metrics(test) if test is not None else {}
    return (numbers, "") if numbers else (None, "the succeeded attempt reported no metrics (result.json or a printed JSON line)")


def job_view(store: Store, job_id: int) -> str:
    """Raises JobNotFound for an unknown id."""
    history = job_history(store, job_id)
    runs = [Run(f"attempt-{a.n}", f"attempt {a.n} · level {a.level} · {a.outcome.value if a.outcome else 'running'}",
                f"attempt {a.n}", read_curves(a.run_dir), PALETTE[i % len(PALETTE)], [6, 3] if i % 2 else [])
            for i, a in enumerate(history.attempts)]
    spec = chart_spec(runs, key=f"job-{job_id}", with_bands=False, empty="no curve reported in progress.jsonl yet")
    last = history.attempts[-1] if history.attempts else None
    metrics, note = final_metrics(history)
    return pages.job_fragment(history, spec, read_log_tail(last.run_dir, WEB_LOG_TAIL_BYTES) if last else "",
                              last.n if last else None, metrics, note)


def results_view(store: Store, cache: RunReader, csv_href: str) -> str:
    return pages.results_fragment(result_table(store, cache), csv_href)


def jobs_view(store: Store, f: JobsFilter) -> str:
    return pages.jobs_fragment(jobs_page(store, f), f, state_counts(store))


MAX_CURVE_RUNS = 40


def curve_runs(store: Store, job_ids: list[int]) -> tuple[list[Run], list[dict[str, object]], int]:
    """Each picked job's latest attempt as a run; seeds of one effective config share a group."""
    runs: list[Run] = []
    shown: list[dict[str, object]] = []
    missing = 0
    for job_id in job_ids[:MAX_CURVE_RUNS]:
        try:
            history = job_history(store, job_id, events_limit=0)
        except JobNotFound:
            history = None
        if history is None or not history.attempts:
            missing += 1
            continue
        job, last = history.job, history.attempts[-1]
        overrides = " ".join(f"{k}={v}" for k, v in sorted(job.overrides.items()))
        group = f"{job.suite}/{job.config_name}" + (f" [{overrides}]" if overrides else "") + f" · {job.data}"
        colour = PALETTE[len(runs) % len(PALETTE)]
        label = f"job {job.id} · {group} · seed {job.seed}"
        runs.append(Run(f"job-{job.id}", label, group, read_curves(last.run_dir), colour))
        shown.append({"job_id": job.id, "label": label, "colour": colour})
    return runs, shown, missing


def curves_view(store: Store, job_ids: list[int], config: str | None, *, smooth: float, log: bool, band: bool) -> str:
    page = jobs_page(store, JobsFilter(config=config) if config else JobsFilter(), limit=MAX_CURVE_RUNS if config else 0)
    picked = list(dict.fromkeys(job_ids + ([r.id for r in reversed(page.rows)] if config else [])))
    runs, shown, missing = curve_runs(store, picked)
    spec = chart_spec(runs, key="curves", smooth=smooth, log=log, band=band)
    return pages.curves_fragment(shown, spec, page.configs, config, picked, missing)
