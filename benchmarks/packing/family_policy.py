"""`orch` for a foreign script's sweep: no memory estimate (orch does not know the script), only
the declared figure, what running attempts show at step K, and the daemon's memory families.

The rules are the daemon's own (`orchestrator.prediction.families`,
`orchestrator.prediction.memory`, `orchestrator.scheduling.packing.pack`):
- a shape is what the script receives: ladder levels that change nothing the script receives
  (level 4, alone, after level 3) share one shape;
- a family is a config at one setting of checkpointing and data workers: its members differ in
  batch size (levels 1 and 2: the batch halves) and task; its fit predicts members never run,
  other tasks (no prompt lengths from a foreign script) bounded by the family's largest peak;
- an OOM in a family that has measured nothing retires the declared figure
  (`predict_peak_mib(disproven_mib=...)`);
- probe before stacking: while a family has measured nothing, one job of it per card until a
  running one reaches step K (`QueuedJob.probe_family`).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.packing.daemon_policy import StepKPolicy, model_of
from benchmarks.packing.simulator import Attempt, Outcome, Simulator, Start
from benchmarks.packing.trace import RUN_ALONE_LEVEL, TraceJob
from orchestrator.prediction.families import (
    FamilyFloor,
    FamilyPoint,
    fit_family,
    floors_bound,
    predict_member,
)
from orchestrator.prediction.memory import Prediction, predict_peak_mib
from orchestrator.store.peak_source import PredictionSource, SourceKind

_GUESSES = (SourceKind.DECLARED, SourceKind.NONE, SourceKind.OOM_FLOOR, SourceKind.RUNNING)


def received_level(level: int) -> int:
    """Level 4 (alone) sends the script what level 3 sent."""
    return min(level, RUN_ALONE_LEVEL - 1)


def family_of(job: TraceJob, level: int) -> tuple[str, bool, bool]:
    """(config, checkpointing, data workers): levels 1 and 2 differ only in batch size."""
    return (job.config, level >= 1, level < 3)


def batch_of(level: int) -> int:
    return 2 if level < 2 else 1  # the trace's configs run batch 2; level 2 halves it


@dataclass
class FamilyPolicy(StepKPolicy):
    name: str = "orch family"
    probing: bool = True
    families: bool = True
    # a member on a task its family has not run, from how the tasks compare in other families of
    # the model (orchestrator.prediction.families.across_families); False: the family's largest peak
    across: bool = True

    def shape_of(self, job: TraceJob, level: int) -> tuple[str, str, int]:
        return job.shape(received_level(level))

    def _members(self, family: tuple[str, bool, bool]) -> tuple[list[FamilyPoint], list[FamilyFloor]]:
        points, floors = [], []
        for j_level in range(RUN_ALONE_LEVEL):
            if family_of(self.trace.jobs[0], j_level)[1:] != family[1:]:
                continue
            for task in self._tasks:
                key = (family[0], task, j_level)
                memory, running = self.shapes.get(key), self.running.get(key)
                peak = memory.peak_mib if memory is not None and memory.peak_mib else None
                if peak is None and running is not None:
                    points.append(FamilyPoint(batch_of(j_level), None, task, running.peak_mib, running=True))
                elif peak is not None:
                    points.append(FamilyPoint(batch_of(j_level), None, task, peak))
                if memory is not None and memory.oom_floor_mib:
                    floors.append(FamilyFloor(batch_of(j_level), None, task, memory.oom_floor_mib))
        return points, floors

    def predict(self, job_index: int, level: int) -> Prediction:
        job = self.trace.jobs[job_index]
        key = self.shape_of(job, level)
        own, running = self.shapes.get(key), self.running.get(key)
        if not self.families or (own is not None and own.peak_mib) or running is not None:
            return super().predict(job_index, level)
        points, floors = self._members(family_of(job, level))
        fit = fit_family(points, floors)
        family = None
        disproven = None
        if fit is not None:
            found = predict_member(fit, batch_of(level), None, job.task, floors, None,
                                   self._same_model(family_of(job, level)) if self.across else ())
            if found is not None:
                family = Prediction(found[0], PredictionSource(SourceKind.FAMILY, points=len(points),
                                                               error=fit.error_fraction))
        elif floors:
            disproven = floors_bound(floors, batch_of(level)) or 0
        return predict_peak_mib(own, None, int(job.declared_mib), self.margin, held=self.held.get(key),
                                family=family, disproven_mib=disproven)

    def _same_model(self, family: tuple[str, bool, bool]) -> list[list[FamilyPoint]]:
        """The points of the other families of the job's model (the daemon's `Knowledge.same_model`):
        every other config's, at each setting of checkpointing and data workers."""
        model = model_of(family[0])
        if model not in self._by_model:  # what shapes and running peaks say now: cleared as they change
            found: dict[tuple[str, bool, bool], list[FamilyPoint]] = {}
            for config in self._configs:
                for setting in ((False, True), (True, True), (True, False)):
                    if model_of(config) == model and (points := self._members((config, *setting))[0]):
                        found[(config, *setting)] = points
            self._by_model[model] = found
        return [points for key, points in self._by_model[model].items() if key != family]

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        self._by_model.clear()  # running peaks are read again
        return super().decide(sim, now_s)

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        self._by_model.clear()  # a peak or an OOM floor is learned
        super().on_end(sim, attempt, outcome, now_s)

    def _measured(self, family: tuple[str, bool, bool]) -> bool:
        return bool(self._members(family)[0])

    def probe_of(self, job_index: int, level: int, prediction: Prediction) -> str | None:
        if not self.probing or prediction.source.kind not in _GUESSES:
            return None
        family = family_of(self.trace.jobs[job_index], level)
        return None if self._measured(family) else repr(family)

    def running_probe_of(self, attempt: Attempt) -> str | None:
        if not self.probing:
            return None
        family = family_of(attempt.job, attempt.start.level)
        return None if self._measured(family) else repr(family)

    def __post_init__(self) -> None:
        self._tasks = sorted({j.task for j in self.trace.jobs})
        self._configs = sorted({j.config for j in self.trace.jobs})
        self._by_model: dict[str, dict[tuple[str, bool, bool], list[FamilyPoint]]] = {}
        super().__post_init__()
