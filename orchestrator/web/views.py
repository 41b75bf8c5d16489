"""Each page's fragment from the store: the reads (through store.web_queries) and the
rendering (pages), shared by the live app and the report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.actions.presence import daemon_alive
from orchestrator.api.curves import curve_points, stitch
from orchestrator.api.frames import pruned_step
from orchestrator.api.jobs import earlier_attempt, headline_metric
from orchestrator.attempts.log_sequences import plain_text
from orchestrator.attempts.next_step import pruned_reason
from orchestrator.attempts.provenance_reads import read_provenance
from orchestrator.attempts.reported import nonfinite_metrics, nonfinite_said
from orchestrator.attempts.rundir_reads import read_log_tail, read_result
from orchestrator.errors import JobNotFound, UsageError
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.results.collect import (
    RunReader,
    Setting,
    finite_metrics,
    job_metrics,
    job_settings,
)
from orchestrator.results.trials import trial_rows
from orchestrator.store.db import Store, now_s
from orchestrator.store.gpu_samples import gpu_sample_series
from orchestrator.store.history import HistoryPoint
from orchestrator.store.job_facts import job_facts
from orchestrator.store.queries import JobHistory, get_attempts, job_history, state_counts
from orchestrator.store.queue import job_by_id
from orchestrator.store.rows import Job
from orchestrator.store.search import final_values, searched_suites, suite_search_jobs
from orchestrator.store.web_queries import (
    JobsFilter,
    attempt_spans,
    job_configs,
    jobs_page,
    oom_marks,
    overview,
    sweep_time_range,
)
from orchestrator.web import pages
from orchestrator.web.curves import PALETTE, PrunedAt, Run, chart_spec, curves_of, read_curves
from orchestrator.web.log_text import log_tail
from orchestrator.web.memory_chart import memory_charts
from orchestrator.web.results_view import result_table
from orchestrator.web.templating import render
from orchestrator.web.trials_plot import key_plots

# the job page reads this much of the log's end (redraws are many bytes), and shows its last lines
WEB_LOG_TAIL_BYTES = 256 * 1024
WEB_LOG_TAIL_LINES = 200

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
    configs = job_configs(store, {j for s in samples for j in s.held_by_job})
    labels = {job_id: f"job {job_id} · {config}" for job_id, config in configs.items()}
    return pages.memory_fragment(memory_charts(samples, ooms, labels, configs=configs))


def final_metrics(history: JobHistory) -> tuple[dict[str, float] | None, str]:
    """The succeeded attempt's test metrics (as `orch results` reads them), or why there are none."""
    done = [a for a in history.attempts if a.outcome is AttemptOutcome.SUCCEEDED]
    if not done:
        return None, "none yet: only a succeeded attempt has final metrics"
    # as the script reported them, each once (`eval_loss`, not also its alias `loss`)
    return reported_metrics(job_metrics(read_result(Path(done[-1].run_dir)), done[-1].output_metrics or None,
                                        aliases=False))


def reported_metrics(test: dict[str, Any] | None) -> tuple[dict[str, float] | None, str]:
    """A succeeded attempt's finite test metrics, or why it has none: its only metrics were not
    finite (named as `orch results` notes name them), or it reported none. Pure."""
    numbers = finite_metrics(test) if test is not None else {}
    if numbers:
        return numbers, ""
    nonfinite = nonfinite_metrics(test or {})
    if nonfinite:
        said = ", ".join(nonfinite_said("test", name, value) for name, value in nonfinite.items())
        return None, f"the succeeded attempt reported {said}: not counted"
    return None, "the succeeded attempt reported no metrics (result.json or a printed JSON line)"


def job_view(store: Store, job_id: int) -> str:
    """Raises JobNotFound for an unknown id."""
    history = job_history(store, job_id)
    by_attempt: dict[int, list[HistoryPoint]] = {}
    for point in curve_points(store, jobs=[job_id]):
        by_attempt.setdefault(point.attempt, []).append(point)
    runs = []
    for i, a in enumerate(history.attempts):
        outcome = a.outcome.value if a.outcome else "running"
        points = by_attempt.get(a.n)
        curves = curves_of(points) if points else read_curves(a.run_dir)  # kept before histories were
        marks = [min(p.step for p in points)] if points and a.resumed_from_attempt is not None else []
        runs.append(Run(f"attempt-{a.n}", f"attempt {a.n} · level {a.level} · {outcome}", f"attempt {a.n}", curves,
                        PALETTE[i % len(PALETTE)], [6, 3] if i % 2 else [], marks,
                        {"attempt": str(a.n), "level": str(a.level), "outcome": outcome,
                         "resumed": f"from attempt {a.resumed_from_attempt}" if a.resumed_from_attempt else ""}))
    spec = chart_spec(runs, key=f"job-{job_id}", with_bands=False, empty="no metric reported yet (progress.jsonl, "
                      "printed Trainer logs, tqdm or JSON lines)", columns=("attempt", "level", "outcome", "resumed"))
    last = history.attempts[-1] if history.attempts else None
    metrics, note = final_metrics(history)
    # stored at each attempt's end; a running attempt's read as it is now
    provenance = {a.n: a.provenance or (read_provenance(Path(a.run_dir), None) or {} if a.outcome is None else {})
                  for a in history.attempts}
    return pages.job_fragment(history, spec, job_log_tail(last.run_dir) if last else "", last.n if last else None,
                              metrics, note, {n: p for n, p in provenance.items() if p})


def job_log_tail(run_dir: str) -> str:
    """The end of the attempt's log with its `\r` redraws collapsed (a tqdm bar is one line at
    its last state), so that the result or the traceback shows, and its terminal sequences left
    out as `orch logs` leaves them out, colours too (a page would show `\x1b[32m`)."""
    raw = read_log_tail(run_dir, WEB_LOG_TAIL_BYTES)
    return log_tail(plain_text(raw), WEB_LOG_TAIL_LINES, cut_at_start=len(raw.encode()) >= WEB_LOG_TAIL_BYTES)


def attempt_run_dir(store: Store, job_id: int, n: int | None) -> str:
    """The run dir of the job's attempt `n` (its last when None). Raises JobNotFound for an
    unknown job, UsageError for an attempt it has not had."""
    if job_by_id(store, job_id) is None:
        raise JobNotFound(f"no job {job_id}")
    attempts = get_attempts(store, job_id)
    chosen = attempts[-1:] if n is None else [a for a in attempts if a.n == n]
    if not chosen:
        raise UsageError(f"job {job_id} has no attempt {n}" if n is not None else f"job {job_id} has not started yet")
    return chosen[0].run_dir


def results_view(store: Store, cache: RunReader, csv_href: str) -> str:
    return pages.results_fragment(result_table(store, cache), csv_href)


def jobs_view(store: Store, f: JobsFilter) -> str:
    page = jobs_page(store, f)
    facts = job_facts(store, [r.id for r in page.rows], now_s())
    tasks = {r.id: r.data for r in page.rows}
    latest = {r.id: r.attempts for r in page.rows}
    shown = {job: (headline_metric(fact.last_values, tasks.get(job, "")), fact.run_s,
                   earlier_attempt(fact.attempt, latest.get(job)))
             for job, fact in facts.items()}
    return pages.jobs_fragment(page, f, state_counts(store), shown)


MAX_CURVE_RUNS = 40


CURVE_COLUMNS = ("job", "config", "setting", "seed", "task")
# What `/curves?by=` may name besides a config key: the job's own fields.
BY_JOB_FIELD: dict[str, Callable[[Job], object]] = {
    "config": lambda job: job.config_name,
    "task": lambda job: job.data,
    "seed": lambda job: job.seed,
    "setting": lambda job: " ".join(f"{k}={v}" for k, v in sorted(job.overrides.items())) or "-",
}


def colour_key(job: Job, by: str) -> str:
    """The value a job is coloured by: a job field (config, task, seed, setting) or a config key."""
    field = BY_JOB_FIELD.get(by)
    return str(field(job)) if field is not None else str(job.config.get(by, "-"))


def curve_runs(
    store: Store, job_ids: list[int], by: str | None = None
) -> tuple[list[Run], list[dict[str, object]], int]:
    """Each picked job's curve, its attempts stitched by step (a resumed job reads whole; where
    a later attempt took over is marked). A band pools the seeds of one effective setting and
    task, as a row of `orch results` does; with `by`, jobs with one value of that key (a config
    key or a job field) share a colour, and their bands stay apart by setting."""
    runs: list[Run] = []
    shown: list[dict[str, object]] = []
    missing = 0
    picked = job_ids[:MAX_CURVE_RUNS]
    stitched, takeovers = stitch(curve_points(store, jobs=picked)) if picked else ([], [])
    points: dict[int, list[HistoryPoint]] = {}
    for point in stitched:
        points.setdefault(point.job, []).append(point)
    marks: dict[int, list[float]] = {}
    for takeover in takeovers:
        marks.setdefault(takeover.job, []).append(takeover.step)
    histories: list[JobHistory] = []
    for job_id in picked:
        try:
            history = job_history(store, job_id, events_limit=0)
        except JobNotFound:
            history = None
        if history is None or not history.attempts:
            missing += 1
            continue
        histories.append(history)
    bands = band_names([h.job for h in histories],
                       job_settings(store, {h.job.suite for h in histories}, [h.job.id for h in histories]))
    colours: dict[str, str] = {}
    for history in histories:
        job, last = history.job, history.attempts[-1]
        overrides = " ".join(f"{k}={v}" for k, v in sorted(job.overrides.items()))
        group = bands[job.id] if by is None else f"{by}={colour_key(job, by)}"
        colour = colours.setdefault(group, PALETTE[len(colours) % len(PALETTE)]) if by is not None \
            else PALETTE[len(runs) % len(PALETTE)]
        label = f"job {job.id} · {group} · seed {job.seed}"
        own = points.get(job.id)
        cells = {"job": str(job.id), "config": job.config_name, "setting": overrides, "seed": str(job.seed),
                 "task": job.data}
        if by is not None and by not in cells:
            cells[by] = colour_key(job, by)
        runs.append(Run(f"job-{job.id}", label, bands[job.id], curves_of(own) if own else read_curves(last.run_dir),
                        colour, marks=marks.get(job.id, []), cells=cells, href=f"/job/{job.id}", seed=job.seed,
                        job=job.id, succeeded=job.state is JobState.SUCCEEDED, pruned=pruned_at(job)))
        shown.append({"job_id": job.id, "label": label, "colour": colour})
    return runs, shown, missing


def band_names(jobs: list[Job], settings: dict[int, Setting]) -> dict[int, str]:
    """Each job's band: its suite / config [overrides] · task, the overrides as results show them
    (without the keys the suite calls not science), with the setting's digest added where jobs of
    one such name ran different settings (a config file edited between submits, a changed command
    or environment), so that the runs of a band are exactly those one results row pools."""
    named: dict[int, str] = {}
    for job in jobs:
        setting = settings.get(job.id)
        shown = setting.overrides if setting is not None else job.overrides
        overrides = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        named[job.id] = f"{job.suite}/{job.config_name}" + (f" [{overrides}]" if overrides else "") \
            + (f" · {job.data}" if job.data else "")  # a script without tasks: no empty part
    digests = {job: setting.digest for job, setting in settings.items()}
    kinds: dict[str, set[str]] = {}
    for job in jobs:
        kinds.setdefault(named[job.id], set()).add(digests.get(job.id, ""))
    return {job: name + (f" · setting {digests.get(job, '?')}" if len(kinds[name]) > 1 else "")
            for job, name in named.items()}


def pruned_at(job: Job) -> PrunedAt | None:
    """Where early stopping stopped a pruned job (its record's step; None for any other job)."""
    if job.state is not JobState.PRUNED:
        return None
    step = pruned_step(job)  # a record written by orch, read as untrusted all the same
    return PrunedAt(None if step is None else float(step), pruned_reason(job))


def curves_view(store: Store, job_ids: list[int], config: str | None, *, smooth: float, log: bool, band: bool,
                by: str | None = None, metric: str | None = None) -> str:
    """`by`: what colours the runs (a job field or a config key; one that names neither is
    said on the page, and the runs coloured by config and task); `metric`: the one drawn
    first (`&metric=eval_accuracy`), else the loss."""
    page = jobs_page(
        store,
        JobsFilter(config=config) if config else JobsFilter(),
        limit=MAX_CURVE_RUNS if config else 0,
    )
    picked = list(dict.fromkeys(job_ids + ([r.id for r in reversed(page.rows)] if config else [])))
    keys = sorted({k for run in picked_configs(store, picked) for k in run})
    notes = []
    if by is not None and by not in BY_JOB_FIELD and by not in keys:
        notes.append(f"colour by {by!r} names nothing: neither config, task, seed, setting nor a "
                     "config key of the picked runs; coloured by config and task")
        by = None
    runs, shown, missing = curve_runs(store, picked, by)
    columns = CURVE_COLUMNS + ((by,) if by is not None and by not in CURVE_COLUMNS else ())
    spec = chart_spec(runs, key="curves", metric=metric or "loss", smooth=smooth, log=log, band=band,
                      columns=columns)
    if metric is not None and runs and metric not in spec["metrics"]:
        shown_first = (spec["metrics"] or ["loss"])[0]
        notes.append(f"no picked run reported {metric!r}: showing {shown_first}")
    by_options = [f for f in BY_JOB_FIELD if f not in keys] + keys
    return pages.curves_fragment(shown, spec, page.configs, config, picked, missing, by_options, by,
                                 notes)


def picked_configs(store: Store, job_ids: list[int]) -> list[dict[str, object]]:
    """The merged configs of the picked jobs (their keys are what /curves may group by)."""
    configs = []
    for job_id in job_ids[:MAX_CURVE_RUNS]:
        try:
            configs.append(job_history(store, job_id, events_limit=0).job.config)
        except JobNotFound:
            continue
    return configs


def trials_view(store: Store) -> str:
    """Each search's trials best first by its metric, and the metric against each searched key."""
    searches = []
    for suite in searched_suites(store):
        jobs = suite_search_jobs(store, suite)
        spec = jobs[-1].search.get("spec", {})
        metric, mode = str(spec.get("metric") or ""), str(spec.get("mode") or "max")
        if not metric:
            continue
        rows = trial_rows(jobs, final_values(store, [j.id for j in jobs], metric), mode)
        space = spec.get("space", [])
        keys = [str(d.get("key")) for d in space]
        log_keys = {str(d.get("key")) for d in space if "log_uniform" in d}
        best = rows[0] if rows and rows[0].value is not None else None
        searches.append({"suite": suite, "method": spec.get("method"), "metric": metric, "mode": mode, "rows": rows,
                         "searched": keys, "best": best, "plots": key_plots(rows, keys, log_keys, metric)})
    return render("trials.html", searches=searches)
