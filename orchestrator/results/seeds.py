"""What became of each seed of a results row, and the row's denominator. Pure: no I/O.

A row counts one value per seed: the latest succeeded run of the seed that reported the metric
(a `--force` rerun replaces, never adds to, its seed's value). Every other submitted run is
accounted for: a seed with no such run says what its newest run became (failed, cancelled,
still queued or running, or succeeded without the metric); a seed whose later run failed, was
cancelled or has not finished keeps its counted value and says that too. `deciding_run` is
that rule, in one place. With `pooled`, every succeeded run that
reported the metric counts, and n counts runs; the denominator still counts distinct seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from orchestrator.lifecycle import JobState

MAX_SEEDS_NAMED = 6  # seeds named in a short denominator before "+N more"


class SeedStatus(str, Enum):
    """What a seed contributes to its row, in the order a denominator names them."""

    COUNTED = "counted"  # a succeeded run reported the metric: its value counts
    NO_METRIC = "no_metric"  # succeeded, but no run of the seed reported the metric
    FAILED = "failed"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # early stopping stopped its setting: kept out of the mean, marked
    RUNNING = "running"
    QUEUED = "queued"


_BY_STATE: dict[str, SeedStatus] = {
    JobState.FAILED: SeedStatus.FAILED, JobState.CANCELLED: SeedStatus.CANCELLED, JobState.PRUNED: SeedStatus.PRUNED,
    JobState.RUNNING: SeedStatus.RUNNING, JobState.QUEUED: SeedStatus.QUEUED}
PENDING = (JobState.QUEUED, JobState.RUNNING)
_WORDS = {SeedStatus.NO_METRIC: "reported no {metric}", SeedStatus.FAILED: "failed",
          SeedStatus.CANCELLED: "cancelled", SeedStatus.PRUNED: "pruned",
          SeedStatus.RUNNING: "running", SeedStatus.QUEUED: "queued"}
LOST = (SeedStatus.FAILED, SeedStatus.CANCELLED)  # missing for good by mishap (¶); pruned has ‡


@dataclass(frozen=True)
class SeedRunInput:
    """One job of a seed, as the seed rules need it."""

    seed: int
    job: int | None
    state: JobState
    has_value: bool  # succeeded and reported the row's metric
    why: str = ""  # a failed or cancelled job's error; a succeeded job's missing-metric reason
    nonfinite: str = ""  # the metric's value where it was a number but not one to count ("nan")
    diverged: str = ""  # why the divergence rule flagged its loss (an uncounted run's note says it)


@dataclass(frozen=True)
class SeedState:
    """A seed's status in its row, the job that decided it, and why (its error)."""

    seed: int
    status: SeedStatus
    job: int | None
    why: str = ""
    nonfinite: str = ""  # NO_METRIC: the value it reported in place of one to count ("nan")


@dataclass(frozen=True)
class Denominator:
    """How many seeds of a row were submitted and what became of them (n = `counted`)."""

    submitted: int
    counted: int = 0
    no_metric: int = 0
    failed: int = 0
    cancelled: int = 0
    running: int = 0
    queued: int = 0
    runs: int = 0  # jobs submitted (a rerun of a seed is a second job)
    pruned: int = 0  # seeds early stopping stopped

    def as_dict(self) -> dict[str, int]:
        return {"submitted": self.submitted, "succeeded": self.counted, "no_metric": self.no_metric,
                "failed": self.failed, "cancelled": self.cancelled, "running": self.running,
                "queued": self.queued, "runs": self.runs, "pruned": self.pruned}


T = TypeVar("T", bound=SeedRunInput)


def counted_runs(runs: Sequence[T], pooled: bool) -> list[T]:
    """The runs whose values count: the latest per seed with a value, or every one when pooled.
    In seed order, then job order."""
    if pooled:
        return [r for r in sorted(runs, key=lambda r: (r.seed, _job_key(r.job))) if r.has_value]
    deciders = (deciding_run(jobs) for jobs in _by_seed(runs).values())
    return [run for run in deciders if run.has_value]


def deciding_run(jobs: Sequence[T]) -> T:
    """The one run that decides what a seed's row says of it (every view: the table's n and
    notes, `--json`'s seed_states, the per-run lines): its latest run with a value, else its
    newest run, whatever became of it (a rerun that failed decides over an earlier run that
    succeeded without the metric). `jobs`: one seed's runs, in job order."""
    valued = [r for r in jobs if r.has_value]
    return valued[-1] if valued else jobs[-1]


def seed_states(runs: Iterable[SeedRunInput]) -> list[SeedState]:
    """One state per distinct seed, by seed: what its deciding run (`deciding_run`) became."""
    states = []
    for seed, jobs in _by_seed(runs).items():
        decider = deciding_run(jobs)
        if decider.has_value:
            states.append(SeedState(seed, SeedStatus.COUNTED, decider.job))
            continue
        status = (SeedStatus.NO_METRIC if decider.state is JobState.SUCCEEDED
                  else _BY_STATE.get(decider.state, SeedStatus.FAILED))
        states.append(SeedState(seed, status, decider.job, decider.why, decider.nonfinite))
    return states


def seed_text(seed: int, job: int | None) -> str:
    """How a note names a seed's run: `seed 2 (job 14)`, `seed 2` where the job is not known."""
    return f"seed {seed}" + (f" (job {job})" if job is not None else "")


def _by_seed(runs: Iterable[T]) -> dict[int, list[T]]:
    """Each seed's runs in job order, by seed."""
    by_seed: dict[int, list[T]] = {}
    for run in sorted(runs, key=lambda r: (r.seed, _job_key(r.job))):
        by_seed.setdefault(run.seed, []).append(run)
    return by_seed


def denominator(states: Sequence[SeedState], runs: int) -> Denominator:
    count = {status: sum(1 for s in states if s.status is status) for status in SeedStatus}
    return Denominator(len(states), count[SeedStatus.COUNTED], count[SeedStatus.NO_METRIC], count[SeedStatus.FAILED],
                       count[SeedStatus.CANCELLED], count[SeedStatus.RUNNING], count[SeedStatus.QUEUED], runs,
                       count[SeedStatus.PRUNED])


def _runs_text(n: int, states: Sequence[SeedState], pooled: bool) -> str:
    """` (5 runs)` where pooled values outnumber the distinct seeds counted; "" otherwise."""
    counted = sum(1 for s in states if s.status is SeedStatus.COUNTED)
    return f" ({n} runs)" if pooled and n != counted else ""


def short_denominator(n: int, states: Sequence[SeedState], metric: str, pooled: bool = False) -> str:
    """`3` when every submitted seed counts, else `3 of 4 (seed 4 failed)` or `2 of 4 (2 pruned)`:
    what an n column shows.
    Seeds are counted once however many of their runs count (`n`, said as `(5 runs)` when pooled)."""
    missing = [s for s in states if s.status is not SeedStatus.COUNTED]
    seeds_counted = len(states) - len(missing)
    if not missing:
        return f"{seeds_counted}{_runs_text(n, states, pooled)}"
    parts = []
    for status in SeedStatus:
        said: dict[str, list[int]] = {}
        for s in missing:
            if s.status is status:
                said.setdefault(_short_said(s, metric), []).append(s.seed)
        if said and status is SeedStatus.PRUNED:  # a setting's seeds are pruned together: counted
            parts.append(f"{sum(map(len, said.values()))} pruned")
            continue
        parts += [f"{_seeds_named(seeds)} {words}" for words, seeds in said.items()]
    return f"{seeds_counted} of {len(states)} ({'; '.join(parts)}){_runs_text(n, states, pooled)}"


def full_denominator(n: int, states: Sequence[SeedState], metric: str, pooled: bool = False) -> str:
    """`3 of 4; seed 4 failed: RuntimeError: …`: every seed not counted, with its error."""
    seeds_counted = sum(1 for s in states if s.status is SeedStatus.COUNTED)
    text = f"{seeds_counted} of {len(states)}{_runs_text(n, states, pooled)}"
    for s in states:
        if s.status is not SeedStatus.COUNTED:
            where = seed_text(s.seed, s.job)
            if s.status is SeedStatus.NO_METRIC:  # why: missing_said's phrase, said after `reported`
                text += f"; {where} reported {s.why or f'no {metric}'}"
            else:
                text += f"; {where} {_WORDS[s.status].format(metric=metric)}" + (f": {s.why}" if s.why else "")
    return text


def _short_said(state: SeedState, metric: str) -> str:
    """What an n column says of a seed not counted: `failed`, `reported no f1`, or the value it
    reported in place of one to count (`reported accuracy nan`), as the notes name it."""
    if state.nonfinite == "too large":
        return f"reported a {metric} too large to average"
    if state.nonfinite:
        return f"reported {metric} {state.nonfinite}"
    return _WORDS[state.status].format(metric=metric)


def later_run_notes(runs: Sequence[SeedRunInput], states: Sequence[SeedState], pooled: bool,
                    job_text: Callable[[list[int | None]], str]) -> list[str]:
    """Sentences for seeds that ran more than once: which run counts, and the seed's other runs
    that failed, were cancelled or have not finished (after the counted one: the value may still
    change)."""
    notes = []
    counted_job = {s.seed: s.job for s in states if s.status is SeedStatus.COUNTED}
    for seed, jobs in _by_seed(runs).items():
        valued = [r for r in jobs if r.has_value]
        if len(valued) > 1:
            named = job_text([r.job for r in valued])
            if pooled:
                notes.append(f"seed {seed} ran {_times(len(valued))}{named}: every run counted (pooled)")
            else:
                notes.append(f"seed {seed} ran {_times(len(valued))}{named}: the latest"
                             + (f", job {counted_job[seed]}," if counted_job.get(seed) is not None else "")
                             + " counted")
        if seed not in counted_job:
            if len(jobs) > 1:  # no run of the seed counts: the runs besides the one its row names
                decider = deciding_run(jobs)
                notes.append(f"seed {seed} ran {_times(len(jobs))}{job_text([r.job for r in jobs])}: the "
                             f"latest, job {decider.job}, decides what its row says")
            continue
        last = counted_job[seed]
        for run in jobs:
            if run.state in (JobState.FAILED, JobState.CANCELLED, *PENDING):
                when = "a later" if _job_key(run.job) > _job_key(last) else "an earlier"
                verb = {JobState.FAILED: "failed", JobState.CANCELLED: "was cancelled"}.get(
                    run.state, "has not finished"
                )
                why = f" ({run.why})" if run.why and run.state is JobState.FAILED else ""
                notes.append(f"seed {seed}: {when} run, job {run.job}, {verb}{why}; job {last} counted")
    return notes


def uncounted_notes(runs: Sequence[SeedRunInput], counted_job: dict[int, int | None], pooled: bool) -> list[str]:
    """Sentences for succeeded runs that reported no value of the row's metric; where another run
    of the seed counts (a `--force` rerun), the sentence names it, so the seed never reads as lost."""
    notes = []
    for run in runs:
        if run.seed in counted_job and not pooled:
            when = "a later" if _job_key(run.job) > _job_key(counted_job[run.seed]) else "an earlier"
            notes.append(f"seed {run.seed}: {when} run, job {run.job}, reported {run.why}; "
                         f"job {counted_job[run.seed]} counted")
        else:
            where = seed_text(run.seed, run.job)
            diverged = f" (its loss diverged, {run.diverged})" if run.diverged else ""
            notes.append(f"{where} reported {run.why}{diverged}: not counted")
    return notes


def lost_runs(runs: Sequence[SeedRunInput], states: Sequence[SeedState]) -> bool:
    """Whether a seed is missing for good (failed, cancelled, no metric), or a run after a
    seed's counted one failed or was cancelled: the ¶ mark."""
    if any(s.status in (*LOST, SeedStatus.NO_METRIC) for s in states):
        return True
    counted_job = {s.seed: _job_key(s.job) for s in states if s.status is SeedStatus.COUNTED}
    return any(r.state in (JobState.FAILED, JobState.CANCELLED) and _job_key(r.job) > counted_job.get(r.seed, 1 << 62)
               for r in runs)


def pruned_notes(states: Sequence[SeedState]) -> list[str]:
    """`seeds 1, 2 (jobs 7, 8) pruned at step 12 (val_accuracy 0.52, ranked 7 of 9 at that step;
    asha): not counted`, one per distinct reason (a setting's seeds share theirs)."""
    by_why: dict[str, list[SeedState]] = {}
    for state in states:
        if state.status is SeedStatus.PRUNED:
            by_why.setdefault(state.why or "pruned by early stopping", []).append(state)
    notes = []
    for why, pruned in by_why.items():
        jobs = [s.job for s in pruned if s.job is not None]
        named = f" (job{'s' if len(jobs) > 1 else ''} {', '.join(map(str, jobs))})" if jobs else ""
        notes.append(f"{_seeds_named([s.seed for s in pruned])}{named} {why}: not counted")
    return notes


def _seeds_named(seeds: list[int]) -> str:
    shown = ", ".join(map(str, seeds[:MAX_SEEDS_NAMED]))
    more = f", +{len(seeds) - MAX_SEEDS_NAMED} more" if len(seeds) > MAX_SEEDS_NAMED else ""
    return f"seed{'s' if len(seeds) > 1 else ''} {shown}{more}"


def _times(count: int) -> str:
    return "twice" if count == 2 else f"{count} times"


def _job_key(job: int | None) -> int:
    return -1 if job is None else job
