"""What a fused member's end teaches about memory (`share_base: fused`), pure.

A fused process trains up to `fused_members` jobs of one base over one batch, so the peak a
member reports is its whole group's: the base once plus every member's own activations and
adapter state. The rule: a member that trained alone in its process (group size 1) teaches its
shape's peak as any job does; one that trained in a group of k >= 2 teaches the record of its
shape at group size k (`<shape>|fused<k>`), never the shape's own, so a job run alone is never
placed by a group's peak. The group size is the largest the member trained in, as its
result.json says (`fused_members_max`), else what the daemon saw: the live attempts naming its
process in their share.json when it ended, itself included.

Speed: a fused member's samples/s and run time are a group's step shared out, not its shape's
alone, so neither teaches the shape's throughput curves or the run-time table.
"""

from __future__ import annotations

from typing import Any

from orchestrator.plans.model import ShareBase
from orchestrator.plans.worker_output import FUSED_MEMBERS_RANGE
from orchestrator.prediction.fused_groups import group_shape_key

__all__ = ["MAX_MEMBERS", "group_shape_key", "group_size", "reported_group_size", "teaches_solo_speed"]

MAX_MEMBERS = FUSED_MEMBERS_RANGE[1]  # the largest group a fused process may train


def reported_group_size(result: dict[str, Any] | None) -> int | None:
    """`fused_members_max` of a fused member's result.json (1..16), else None."""
    value = (result or {}).get("fused_members_max")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MEMBERS:
        return None
    return value


def group_size(result: dict[str, Any] | None, seen_members: int | None) -> int:
    """The group size a fused member's peak belongs to: its report, else the daemon's count."""
    reported = reported_group_size(result)
    if reported is not None:
        return reported
    return max(1, min(MAX_MEMBERS, seen_members or 1))


def teaches_solo_speed(share_mode: str | None, job_fused: bool) -> bool:
    """Whether an attempt's samples/s may teach its shape's throughput: not a fused member's
    (share.json's mode `fused`), nor one of a `share_base: fused` job whose share.json is not
    read yet (it may train in a group)."""
    if share_mode == ShareBase.FUSED.value:
        return False
    return not (job_fused and share_mode is None)
