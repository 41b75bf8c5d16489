"""Fused groups on a card while one `pack` call places jobs (`share_base: fused`), pure.

The daemon counts one fused process per group and card, taking `cap` members: the first member
takes a plan slot and its full prediction (the base and its own needs); the next ones, up to the
cap, join it without a slot, for their own needs only: the prediction less the base's resident
memory, as a running member's share.json says. Without that figure a joining job is placed by its
full prediction (never below what is known). Members past the cap start another process: a slot
and the full prediction again (the daemon counts ceil(members / cap) processes).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.scheduling.packing.types import QueuedJob, RunningAttempt


@dataclass
class GroupOnCard:
    members: int = 0
    base_mib: int | None = None  # the base's resident memory in its process, when a member said
    cap: int = 1  # the cap its latest member was counted with

    def has_room(self, cap: int) -> bool:
        """A member can join a process of the group without starting another."""
        return cap > 1 and self.members % cap != 0

    @property
    def room(self) -> int:
        """How many more members its last process takes (at its cap)."""
        return (self.cap - self.members % self.cap) % self.cap if self.cap > 1 else 0

    def add(self, cap: int, base_mib: int | None = None) -> bool:
        """Count one more member; True when it opens a process (a plan slot)."""
        opens = not self.has_room(cap)
        self.members += 1
        self.cap = cap
        if base_mib:
            self.base_mib = max(self.base_mib or 0, base_mib)
        return opens


def add_running(groups: dict[str, GroupOnCard], attempt: RunningAttempt) -> bool:
    """Count a running attempt into its card's groups; True when it takes a plan slot (any
    attempt outside a fused group does)."""
    if attempt.fuse_group is None:
        return True
    return groups.setdefault(attempt.fuse_group, GroupOnCard()).add(attempt.fuse_cap, attempt.base_mib)


def group_room(groups: dict[str, GroupOnCard]) -> int:
    """Members the card's fused groups still take without a plan slot."""
    return sum(group.room for group in groups.values())


def joining(job: QueuedJob, groups: dict[str, GroupOnCard]) -> GroupOnCard | None:
    """The group on the card the job would join (a process of it with room), else None."""
    if job.fuse_group is None:
        return None
    group = groups.get(job.fuse_group)
    return group if group is not None and group.has_room(job.fuse_cap) else None


def own_mib(job: QueuedJob, groups: dict[str, GroupOnCard]) -> int:
    """What the job needs on the card: its prediction less the base where it joins a group
    whose base's resident memory is known; its whole prediction otherwise."""
    group = joining(job, groups)
    if group is None or not group.base_mib:
        return job.predicted_peak_mib
    return max(0, job.predicted_peak_mib - group.base_mib)


def place_member(job: QueuedJob, groups: dict[str, GroupOnCard]) -> bool:
    """Count a placed job into its group; True when it takes a plan slot."""
    if job.fuse_group is None:
        return True
    return groups.setdefault(job.fuse_group, GroupOnCard()).add(job.fuse_cap)
