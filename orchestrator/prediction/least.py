"""The least a queued job could need: what a start on trial must have room for
(orchestrator.scheduling.packing.trial). Pure: values in, values out.

A prediction is an upper bound with a margin. Its lower counterpart here has none: the shape's
own peak where an attempt of it completed or passed step K (the most of those), else what its
memory family's points on its task bound from below (orchestrator.prediction.families
.least_member_mib). A shape an OOM has struck has no such figure: it starts at its prediction.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.prediction.job_facts import ShapeFacts
from orchestrator.prediction.learned import Knowledge
from orchestrator.store.rows import ShapeMemory


def least_mib(facts: ShapeFacts, shapes: Mapping[str, ShapeMemory], knowledge: Knowledge) -> int | None:
    """The least the shape of `facts` could need; None: nothing bounds it from below, or an OOM
    struck it (a trial that ran out of memory there too: never a second)."""
    measured = shapes.get(facts.shape_key)
    if measured is not None and (measured.oom_floor_mib or measured.disproved_mib):
        return None
    running = knowledge.running.get(facts.shape_key)
    completed = measured.peak_mib if measured is not None and measured.peak_mib else 0
    own = max(completed, running.peak_mib if running is not None else 0)
    if own:
        return own
    return knowledge.family_least(facts.family) if facts.family is not None else None
