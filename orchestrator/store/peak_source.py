"""Where a predicted peak came from, as a value: a kind plus its details (the step of a running
peak, the level or task a peak was borrowed from, a cap). Rendered to text in one place, for
the attempt's stored `prediction_source` and for messages, without parentheses of its own (a
message puts it in parentheses: `predicted 17.9 GiB (measured: level 0 peak)`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class SourceKind(str, Enum):
    MEASURED = "measured"  # completed attempts of the shape
    RUNNING = "running"  # running attempts of the shape past step K
    LEVEL = "level"  # a peak measured at a lower ladder level of the same task
    TASK = "task"  # a peak of the same level on another task, scaled by prompt length
    ESTIMATE = "estimate"  # from the model's size, rank, batch, sequence length
    DECLARED = "declared"  # the suite's mem_gib
    NONE = "none"  # nothing known: 0 MiB
    OOM_FLOOR = "OOM floor"  # an earlier OOM raised the figure above every other source
    FAMILY = "family"  # the fit over the memory family's measured members (other batch sizes)


@dataclass(frozen=True)
class PredictionSource:
    kind: SourceKind
    step: int | None = None  # RUNNING: the furthest step of the running attempts
    level: int | None = None  # LEVEL: the lower level whose peak is borrowed; OOM_FLOOR: whose floor
    task: str | None = None  # TASK: the task whose peak is borrowed
    task_tokens: int | None = None  # TASK: that task's longest prompt
    tokens: int | None = None  # TASK: this task's longest prompt; ESTIMATE: the learned length used
    capped: bool = False  # lowered to the largest card's usable memory
    points: int | None = None  # FAMILY: measured members behind the fit
    error: float | None = None  # FAMILY: the fit's largest relative residual
    # MEASURED: how much of the figure is margin over a peak measured to completion (the card's
    # headroom covers it: orchestrator.scheduling.packing.cards.headroom_beside_mib); 0: none such.
    # Not rendered
    margin_mib: int = 0

    def margin_within_headroom_mib(self, shared_base: bool) -> int:
        """The margin a job's prediction gives to the card's headroom: none for a job trained by a
        warm shared-base process, whose memory is counted apart from the job's own peak."""
        return 0 if shared_base else self.margin_mib

    def render(self) -> str:
        """The text shown and stored (attempts.prediction_source)."""
        kind = self.kind
        if kind is SourceKind.RUNNING:
            text = f"measured: running, step {self.step}"
        elif kind is SourceKind.LEVEL or kind is SourceKind.TASK:
            text = f"measured: {self.borrowed()}"
        elif kind is SourceKind.FAMILY:
            members = "member" if self.points == 1 else "members"
            text = f"family fit: {self.points} {members}, error {100 * (self.error or 0.0):.0f} %"
        elif kind is SourceKind.OOM_FLOOR and self.level is not None:
            text = f"OOM floor of level {self.level}"
        elif kind is SourceKind.ESTIMATE and self.tokens is not None:
            text = f"estimate at {self.tokens} tokens"
        else:
            text = kind.value
        return f"{text}, capped at the largest card" if self.capped else text

    def borrowed(self) -> str:
        """A borrowed peak's origin: 'level J peak', 'TASK peak at N tokens, scaled to M'."""
        if self.kind is SourceKind.LEVEL:
            return f"level {self.level} peak"
        if self.kind is SourceKind.TASK:
            return f"{self.task} peak at {self.task_tokens} tokens, scaled to {self.tokens}"
        return self.kind.value

    def with_cap(self) -> PredictionSource:
        return replace(self, capped=True)

    def __str__(self) -> str:
        return self.render()
