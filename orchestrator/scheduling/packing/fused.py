"""Fused groups on a card while one `pack` call places jobs (`share_base: fused`), pure.

The daemon counts one fused process per group and card, taking `cap` members: the first member
takes a plan slot and its full prediction (the base and its own needs); the next ones, up to the
cap, join it without a slot, for their own needs only: the prediction less the base's resident
memory, as a running member's share.json says (the weights alone: the context is left in, the
more cautious figure). Without that figure, by its prediction less the base's weights and CUDA
context as the memory estimate counts them, never below a quarter of its prediction (where the
model's shape is known: a joiner brings neither, and a sweep's first jobs all start before any
share.json is written); else by its full prediction (never below what is known). Members past
the cap start another process: a slot and the full prediction again. The cap of a process is the
smallest of its members' and the joiner's (the warm process takes a job only below every one of
them), so after a group OOM has lowered a suite's cap a process started under the old one takes
no member of the new one once it has as many. Each placement names the process it was counted in
(`placed_process`): the daemon hands the name to the attempt, whose client joins only that one.

What was learned per group size overrides that split where it exists. A process is counted at
the lesser of what its members were placed at, together (and the base, once the member that
opened it, placed with the base, has ended), and what the card counts of it: what
it holds now plus what the card still reserves for its members (those ramping up and those
placed in this call). What it holds is the snapshot's reading of its process where a member's
share.json names it; else, once a member has stepped (the card then counts it by what it holds,
not by its placement), the base's resident memory, the least the process can hold; else nothing.
A job joining it so that it has k members is placed for the process's learned peak at k less
that count, so the card counts the process at that peak at least. The peak at k is the largest
of the members' shapes' records at k (the joiner's included: any of them may be the shape whose
group needed the most). It replaces the figure above only when every member's shape was measured
at k (a measured peak overrides a declared one on the solo path too); an OOM floor at k, or a
record of some members' shapes only, may only raise it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.prediction.fused_groups import GroupPeak
from orchestrator.scheduling.packing.types import QueuedJob, RunningAttempt

Peaks = tuple[GroupPeak, ...]  # one member shape's process peaks per group size
# a joiner placed by the estimate's base (no share.json yet) is placed for at least this share of
# its prediction
ESTIMATED_SPLIT_FLOOR = 0.25


@dataclass
class GroupOnCard:
    base_mib: int | None = None  # the base's resident memory in its process, when a member said
    # its last process (the one a member joins): how many members it has, and the smallest cap
    # they were counted with (the most members it takes)
    last_members: int = 0
    cap: int = 1
    # of that process: what its members were placed at, together, what
    # the card still reserves for them, what the process holds now as the snapshot read it (the
    # least its members' readings say; None: not read), whether a member has stepped, and each
    # member's learned peaks per group size
    placed_mib: int = 0
    owed_mib: int = 0
    process_mib: int | None = None
    stepped: bool = False
    peaks: list[Peaks] = field(default_factory=list)
    opener_counted: bool = False  # a member placed with the base (the one that opened it) is among them
    # the last process's name where its members are running ones that carry it (the id of the
    # attempt that opened it), or the job placed in this call that opened it
    last_process: int | None = None
    last_opener_job: int | None = None

    @property
    def counted_mib(self) -> int:
        """What its last process is counted at (module docstring): never more than the card counts
        of it, so that a joiner placed for the process's learned peak less this leaves that peak
        counted; nor more than its placements (where the members' processes are not the ones
        counted here, a reading may be of a larger one)."""
        stepped_mib = (self.base_mib or 0) if self.stepped else 0  # the least a process that stepped holds
        held_mib = self.process_mib if self.process_mib is not None else stepped_mib
        # the member that opened it (placed with the base) may have ended before the joiners:
        # their placements then leave out the base the process still holds
        placed_mib = self.placed_mib + (0 if self.opener_counted else (self.base_mib or 0))
        return min(placed_mib, self.owed_mib + held_mib)

    def has_room(self, cap: int) -> bool:
        """A member counted with `cap` can join the last process without starting another."""
        return 0 < self.last_members < min(cap, self.cap)

    @property
    def room(self) -> int:
        """How many more members its last process takes (at its cap)."""
        return max(0, self.cap - self.last_members) if self.last_members else 0

    def add(self, cap: int, placed_mib: int, owed_mib: int, peaks: Peaks = (), base_mib: int | None = None,
            process_mib: int | None = None, stepped: bool = False, opened: bool | None = None,
            process: int | None = None, placed_job: int | None = None) -> bool:
        """Count one more member, placed at `placed_mib`, for which the card still reserves
        `owed_mib`; True when it opens a process (a plan slot). `opened`: whether it was placed
        with the base (None: as counted here, when it opens the process). `process`: a running
        member's process name (it is in the last process only if that has its name; without
        one, where the last process has room); `placed_job`: a job placed in this call."""
        named = process is not None
        opens = (not self.last_members or process != self.last_process) if named else not self.has_room(cap)
        if opens:
            self.placed_mib, self.owed_mib, self.process_mib, self.stepped, self.peaks = 0, 0, None, False, []
            self.last_members, self.cap, self.opener_counted = 0, cap, False
            self.last_process, self.last_opener_job = process, placed_job
        self.opener_counted = self.opener_counted or (opens if opened is None else opened)
        self.last_members += 1
        self.cap = min(self.cap, cap)
        self.placed_mib += placed_mib
        self.owed_mib += owed_mib
        if process_mib is not None:
            self.process_mib = process_mib if self.process_mib is None else min(self.process_mib, process_mib)
        self.stepped = self.stepped or stepped
        self.peaks.append(peaks)
        if base_mib:
            self.base_mib = max(self.base_mib or 0, base_mib)
        return opens


def add_running(groups: dict[str, GroupOnCard], attempt: RunningAttempt, owed_mib: int) -> bool:
    """Count a running attempt, for which the card still reserves `owed_mib`, into its card's
    groups; True when it takes a plan slot (any attempt outside a fused group does). A member was
    placed at its prediction (the dispatcher hands a member's reservation as its prediction)."""
    if attempt.fuse_group is None:
        return True
    group = groups.setdefault(attempt.fuse_group, GroupOnCard())
    return group.add(attempt.fuse_cap, attempt.predicted_peak_mib, owed_mib, attempt.group_peaks, attempt.base_mib,
                     attempt.process_mib, attempt.reached_peak, attempt.opened_process, attempt.fuse_process)


def group_room(groups: dict[str, GroupOnCard]) -> int:
    """Members the card's fused groups still take without a plan slot."""
    return sum(group.room for group in groups.values())


def joining(job: QueuedJob, groups: dict[str, GroupOnCard]) -> GroupOnCard | None:
    """The group on the card the job would join (a process of it with room), else None."""
    if job.fuse_group is None:
        return None
    group = groups.get(job.fuse_group)
    return group if group is not None and group.has_room(job.fuse_cap) else None


def process_peak(members: Sequence[Peaks], size: int) -> GroupPeak | None:
    """A process's learned peak at `size` members from its members' records at that size: the
    largest; measured only where every member's shape was measured there; None where no
    member's shape has a record at that size."""
    at = [next((p for p in peaks if p.members == size), None) for peaks in members]
    known = [p for p in at if p is not None]
    if not known:
        return None
    return GroupPeak(size, max(p.mib for p in known), all(p is not None and p.measured for p in at))


def own_mib(job: QueuedJob, groups: dict[str, GroupOnCard]) -> int:
    """What the job needs on the card: where it joins a group, the process's learned peak at its
    new size less what the process is counted at (module docstring), else its prediction less
    the base where the base's resident memory is known (a member's share.json, else the
    estimate's weights and CUDA context); its whole prediction otherwise."""
    group = joining(job, groups)
    if group is None:
        return job.predicted_peak_mib
    if group.base_mib:
        split_mib = max(0, job.predicted_peak_mib - group.base_mib)
    elif job.estimated_base_mib:
        # a figure near the base's own size (a declared one, say) says little of the job's own
        # needs: never below a share of it
        split_mib = max(job.predicted_peak_mib - job.estimated_base_mib,
                        math.ceil(job.predicted_peak_mib * ESTIMATED_SPLIT_FLOOR))
    else:
        split_mib = job.predicted_peak_mib
    learned = process_peak([*group.peaks, job.group_peaks], len(group.peaks) + 1)
    if learned is None:
        return split_mib
    by_record_mib = max(0, learned.mib - group.counted_mib)
    return by_record_mib if learned.measured else max(split_mib, by_record_mib)


def place_member(job: QueuedJob, groups: dict[str, GroupOnCard], placed_mib: int) -> bool:
    """Count a job placed at `placed_mib` (all of it reserved on the card) into its group; True
    when it takes a plan slot."""
    if job.fuse_group is None:
        return True
    return groups.setdefault(job.fuse_group, GroupOnCard()).add(job.fuse_cap, placed_mib, placed_mib,
                                                                 job.group_peaks, placed_job=job.job_id)


@dataclass(frozen=True)
class ProcessChoice:
    """The fused process a placed job trains in, as the card counted it: one it opens, or the
    last one of its group there, named (a running one) or by the job placed in this call that
    opened it. Neither name: a process of running members placed before processes were named."""

    opens: bool
    process: int | None = None
    with_job: int | None = None


def placed_process(job: QueuedJob, groups: dict[str, GroupOnCard]) -> ProcessChoice | None:
    """After `place_member`: the process the job was counted in; None for a job outside any
    fused group."""
    group = groups.get(job.fuse_group) if job.fuse_group is not None else None
    if group is None:
        return None
    if group.last_opener_job == job.job_id:
        return ProcessChoice(True)
    return ProcessChoice(False, group.last_process, group.last_opener_job)


def balanced(ordered: list[QueuedJob]) -> list[QueuedJob]:
    """The packing order with the fused jobs of one group and priority that have no expected run
    time (the packer keeps those in queue order) rearranged, in the places they held, into runs
    of `cap` (`in_runs_by_stack_then_work`). A card fills its processes of a group in placement order,
    and a process's tick is host-bound: it launches the base's kernels once and each stack of its
    members' adapters once (members of one adapter shape and micro-batch stack together), so a
    process of one shape launches the fewest; where shapes must mix, like work per tick evens the
    processes. Jobs with a run time keep the longest-first order, and a job that teaches a
    prediction its place (it runs first to teach it); both count in their runs, which so stay
    aligned with the processes (as long as no process of the group on the card had room before: a
    sweep's first wave)."""
    places: dict[tuple[str, int], list[int]] = {}
    for index, job in enumerate(ordered):
        if job.fuse_group is not None and job.fuse_cap > 1:
            places.setdefault((job.fuse_group, job.priority), []).append(index)
    arranged = list(ordered)
    for indices in places.values():
        jobs = [ordered[i] for i in indices]
        pinned = frozenset(n for n, job in enumerate(jobs) if job.teaches or job.expected_duration_s is not None)
        if len(pinned) == len(jobs):
            continue
        for index, job in zip(indices, in_runs_by_stack_then_work(jobs, min(j.fuse_cap for j in jobs), pinned),
                              strict=True):
            arranged[index] = job
    return arranged


def in_runs_by_stack_then_work(
    jobs: Sequence[QueuedJob], cap: int, pinned: frozenset[int] = frozenset()
) -> list[QueuedJob]:
    """The jobs dealt into runs of `cap` places (the last one shorter), each run one process. The
    jobs at the `pinned` places stay there, in their runs. Then, members that stack together
    (`QueuedJob.fuse_stack`) go together: a run's free places take first the jobs that stack with
    its pinned ones, then each stack (heaviest work first) fills whole runs of its own while it has
    a run's worth. The rest go heaviest first, each to the run with the least work so far that
    has room, one with a member it stacks with first (longest processing time first), and fill
    their runs' free places heaviest first and lightest first in turn: a job that reaches a warm
    process a moment before or after its neighbour in this order then swaps with one of like
    work. Ties keep their order; free jobs all of one work and none that stack keep theirs."""
    free = [job for n, job in enumerate(jobs) if n not in pinned]
    stacks: dict[str, list[QueuedJob]] = {}
    for job in free:
        if job.fuse_stack is not None:
            stacks.setdefault(job.fuse_stack, []).append(job)
    pinned_stacks = {jobs[n].fuse_stack for n in pinned} - {None}
    any_mates = any(len(members) > 1 or key in pinned_stacks for key, members in stacks.items())
    if len({j.fuse_work for j in free}) <= 1 and not any_mates:
        return list(jobs)
    rank = {j.job_id: n for n, j in enumerate(jobs)}
    count = -(-len(jobs) // cap)
    runs: list[list[QueuedJob]] = [[] for _ in range(count)]
    room = [min(cap, len(jobs) - n * cap) for n in range(count)]
    totals = [0.0] * count
    stacked: list[set[str]] = [set() for _ in range(count)]  # the stacks each run holds

    def put(job: QueuedJob, n: int, is_pinned: bool = False) -> None:
        if not is_pinned:
            runs[n].append(job)
        totals[n] += job.fuse_work
        room[n] -= 1
        if job.fuse_stack is not None:
            stacked[n].add(job.fuse_stack)

    for n in sorted(pinned):
        put(jobs[n], n // cap, is_pinned=True)
    for n in range(count):  # a pinned job's run: its stack-mates first
        for key in sorted(stacked[n]):
            mates = stacks.get(key, [])
            while mates and room[n] > 0:
                put(mates.pop(0), n)
    by_weight = sorted(stacks, key=lambda key: (-stacks[key][0].fuse_work, rank[stacks[key][0].job_id])
                       if stacks[key] else (0.0, 0))
    for key in by_weight:  # whole runs of one stack
        for n in range(count):
            if room[n] == cap and len(stacks[key]) >= cap:
                for _ in range(cap):
                    put(stacks[key].pop(0), n)
    placed = {j.job_id for run in runs for j in run}
    for job in sorted((j for j in free if j.job_id not in placed), key=lambda j: (-j.fuse_work, rank[j.job_id])):
        open_runs = [n for n in range(count) if room[n] > 0]
        with_mates = [n for n in open_runs if job.fuse_stack is not None and job.fuse_stack in stacked[n]]
        put(job, min(with_mates or open_runs, key=lambda n: (totals[n], n)))
    arranged: list[QueuedJob] = []
    for n, run in enumerate(runs):
        # dealt heaviest first; every other run lightest first
        heaviest_first = sorted(run, key=lambda j: (-j.fuse_work, rank[j.job_id]))
        dealt = iter(heaviest_first if n % 2 == 0 else sorted(run, key=lambda j: (j.fuse_work, rank[j.job_id])))
        for place in range(n * cap, min(len(jobs), (n + 1) * cap)):
            arranged.append(jobs[place] if place in pinned else next(dealt))
    return arranged
