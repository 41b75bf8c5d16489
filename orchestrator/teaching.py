"""Which queued jobs start early to teach a memory prediction. Pure: the daemon's scheduling pass
and the packing benchmark both ask it.

Longest-first order runs short jobs last. A short job whose memory nothing has taught yet (its
prediction is the suite's declared figure, or the estimate at `max_seq_len` before a run of its
model and data reported its prompts) then keeps the figure it was declared with until the end of
the sweep, where a declared figure that is too low sends it to a card it does not fit three to,
and one too high leaves memory unused, while the rest of the machine drains. So, as a job with no
run-time estimate counts as longest (running it early teaches the estimate for its kind), the
first queued job of each such group counts as longest too: once it has run (its peak at step K,
its prompt lengths at the end) every job of the group is predicted from what it measured. One
job per group, and none while a job of the group runs: the rest wait in their usual place.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable

from orchestrator.prediction_source import PredictionSource, SourceKind

# Sources that rest on nothing measured on this machine.
_UNTAUGHT = (SourceKind.DECLARED, SourceKind.NONE)


def untaught(source: PredictionSource, length_learned: bool) -> bool:
    """Whether a prediction rests on nothing learned: the declared figure, nothing at all, or the
    estimate while no run of the job's model and data has reported its prompt lengths
    (`length_learned`; the estimate at `max_seq_len` overstates short prompts many times)."""
    if source.kind in _UNTAUGHT:
        return True
    return source.kind is SourceKind.ESTIMATE and not length_learned


def teaching_jobs(queue: Iterable[tuple[int, Hashable | None]], learning: Container[Hashable]) -> set[int]:
    """(job id, its group or None when its prediction is taught already), in queue order, and the
    groups a running attempt is teaching now -> the job ids that count as longest: the first of
    each untaught group that no running attempt teaches and that has another job queued to
    teach (a group of one job learns nothing useful by running it early)."""
    first: dict[Hashable, int] = {}
    more: set[Hashable] = set()
    for job_id, group in queue:
        if group is None or group in learning:
            continue
        if group in first:
            more.add(group)
        else:
            first[group] = job_id
    return {job_id for group, job_id in first.items() if group in more}
