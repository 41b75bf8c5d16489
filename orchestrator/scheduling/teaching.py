"""Which queued jobs start early to teach a memory prediction. Pure: the daemon's scheduling pass
and the packing benchmark both ask it.

Longest-first order leaves short jobs for the end. A LoRA job's prediction is untaught until a
run of its model and data reports their prompt lengths (before that: the estimate at
`max_seq_len`, or the declared figure); short tasks of a model not yet run on them (RTE, MRPC
of the 3B model while its long tasks run) then keep that figure until the end of the sweep, where
a figure too low or too high packs their cards badly while the rest of the machine drains. So,
as a job with no run-time estimate counts as longest (running it teaches the estimate for its
kind), the first queued job of each untaught group (its model and data) counts as longest too:
once it has run, every config of that model and data is predicted at the prompt lengths it
reported. One job per group, none while a job of the group runs, and none for a group of one.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable

from orchestrator.store.peak_source import PredictionSource, SourceKind

# Sources that measured nothing on this machine: only a run of the job's model and data teaches them.
_UNTAUGHT = (SourceKind.DECLARED, SourceKind.NONE, SourceKind.ESTIMATE)


def untaught(source: PredictionSource, length_learned: bool) -> bool:
    """Whether a prediction rests on nothing learned: the declared figure, nothing at all, or the
    estimate, while no run of the job's model and data has reported its prompt lengths
    (`length_learned`; the estimate at `max_seq_len` overstates short prompts many times).
    A peak measured, running, borrowed from a neighbour or raised by an OOM is taught."""
    return source.kind in _UNTAUGHT and not length_learned


def teaching_jobs(kinds: Iterable[tuple[int, Hashable | None, int]], learning: Container[Hashable]) -> set[int]:
    """Each kind of queued job (jobs alike but for their place in the queue) as (its first job's
    id, its group or None when its prediction is taught already, how many jobs of it are queued),
    in queue order, and the groups a running attempt teaches now -> the job ids that count as
    longest: the first of each untaught group that no running attempt teaches and that has
    another job queued to teach (a group of one job gains nothing by running early)."""
    first: dict[Hashable, int] = {}
    queued: dict[Hashable, int] = {}
    for job_id, group, count in kinds:
        if group is None or group in learning:
            continue
        first.setdefault(group, job_id)
        queued[group] = queued.get(group, 0) + count
    return {job_id for group, job_id in first.items() if queued[group] > 1}
