"""What one scheduling pass knows beyond a shape's own completed attempts: the peaks of its
running attempts, its neighbours' peaks (other levels, other tasks) and measured throughput.

Built once per pass from rows already read; the choices themselves are the pure functions of
`orchestrator.prediction.shapes` and `orchestrator.prediction.throughput`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.prediction.families import (
    FamilyFit,
    FamilyFloor,
    FamilyPoint,
    fit_family,
    floors_bound,
    least_member_mib,
    predict_member,
)
from orchestrator.prediction.shapes import (
    RunningPeak,
    Transfer,
    fold_running,
    level_transfer,
    parse_shape_key,
    provisional_step_reached,
    task_transfer,
)
from orchestrator.prediction.throughput import MIN_CURVE_STEPS, curves_by_gpu
from orchestrator.store.rows import Attempt, FamilyTag, Job, ShapeMemory


def attempt_step(attempt: Attempt) -> int | None:
    """The last step a live attempt reported (progress_json), None before its first."""
    step = attempt.progress.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def attempt_peak_so_far(attempt: Attempt) -> int:
    """The most its process tree held (NVML), or the worker's own report if that is larger."""
    peak = attempt.peak_mib
    reported = attempt.progress.get("peak_mem_mib")
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) and 0 < reported < 1 << 24:
        peak = max(peak, int(reported))
    return peak


def eval_every_steps(job: Job) -> int | None:
    value = job.config.get("eval_every_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def running_peaks(
    live: Iterable[Attempt], jobs: Mapping[int, Job], key_of: Callable[[Job, Attempt], str],
    past_step_k: bool = True,
) -> dict[str, RunningPeak]:
    """Shape key -> peak so far of its live attempts that passed step K (and their first
    evaluation); with `past_step_k=False`, of those that have not yet. `key_of(job, attempt)` is
    the attempt's shape key."""
    folded: list[tuple[str, int, int]] = []
    for attempt in live:
        job = jobs.get(attempt.job_id)
        if job is None:
            continue
        step = attempt_step(attempt)
        if provisional_step_reached(step, eval_every_steps(job)) != past_step_k:
            continue
        peak = attempt_peak_so_far(attempt)
        if peak > 0:
            folded.append((key_of(job, attempt), peak, step or 0))
    return fold_running(folded)


def held_peaks(
    live: Iterable[Attempt], jobs: Mapping[int, Job], key_of: Callable[[Job, Attempt], str]
) -> dict[str, RunningPeak]:
    """Shape key -> the most a live attempt of it holds before step K. Not yet a measurement,
    but a floor: once its first step ends its reservation, the next job of an under-declared
    shape must not be placed at the declared figure beside an attempt already holding more."""
    return running_peaks(live, jobs, key_of, past_step_k=False)


def unproven_trials(
    live: Iterable[Attempt], jobs: Mapping[int, Job], key_of: Callable[[Job, Attempt], str]
) -> set[str]:
    """Shape keys of live attempts started on trial that have not passed step K yet: until one
    has, the least its shape could need is not shown to be enough, and no other starts on trial."""
    found = set()
    for attempt in live:
        job = jobs.get(attempt.job_id)
        if job is not None and attempt.trial_fence_mib is not None and not provisional_step_reached(
                attempt_step(attempt), eval_every_steps(job)):
            found.add(key_of(job, attempt))
    return found


@dataclass
class Knowledge:
    """Every shape's completed and running peaks, indexed for the neighbour look-ups."""

    shapes: Mapping[str, ShapeMemory]
    running: Mapping[str, RunningPeak]
    held: Mapping[str, RunningPeak] = field(default_factory=dict)  # before step K: floors only
    # shape key -> where it sits in its family: learned shapes (the store) and live attempts'
    tags: Mapping[str, FamilyTag] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)  # shape key -> completed or running peak
    _by_base: dict[str, dict[str, int]] = field(default_factory=dict)  # base -> task -> peak
    _points: dict[str, list[FamilyPoint]] = field(default_factory=dict)  # family key -> its points
    _floors: dict[str, list[FamilyFloor]] = field(default_factory=dict)
    _fits: dict[str, FamilyFit | None] = field(default_factory=dict)
    _oomed: set[str] = field(default_factory=set)  # families an OOM struck

    def __post_init__(self) -> None:
        self.peaks = {k: m.peak_mib for k, m in self.shapes.items() if m.peak_mib}
        for key, run in self.running.items():
            self.peaks[key] = max(self.peaks.get(key, 0), run.peak_mib)
        for key, peak in self.peaks.items():
            parts = parse_shape_key(key)
            if parts is not None:
                self._by_base.setdefault(parts.base, {})[parts.task] = peak
        for key, tag in self.tags.items():
            if peak := self.peaks.get(key, 0):
                completed = (m := self.shapes.get(key)) is not None and m.peak_mib is not None
                self._points.setdefault(tag.family_key, []).append(
                    FamilyPoint(tag.batch_size, tag.tokens, tag.task, peak, running=not completed))
            floor = m.oom_floor_mib if (m := self.shapes.get(key)) is not None else None
            if floor:
                self._oomed.add(tag.family_key)
            held = self.held.get(key)
            floor = max(floor or 0, held.peak_mib if held is not None else 0)
            if floor:
                self._floors.setdefault(tag.family_key, []).append(
                    FamilyFloor(tag.batch_size, tag.tokens, tag.task, floor))

    def family_fit(self, family_key: str) -> FamilyFit | None:
        if family_key not in self._fits:
            self._fits[family_key] = fit_family(self._points.get(family_key, ()), self._floors.get(family_key, ()))
        return self._fits[family_key]

    def same_model(self, family_key: str) -> list[list[FamilyPoint]]:
        """The points of every other family of the same model (a family key ends in `|model`):
        how tasks compare there sizes a member on a task its own family has not run."""
        model = family_key.rsplit("|", 1)[-1]
        return [points for key, points in self._points.items() if key != family_key and key.rsplit("|", 1)[-1] == model]

    def family_measured(self, family_key: str) -> bool:
        """Whether any member of the family has a completed peak or a running one past step K."""
        return bool(self._points.get(family_key))

    def family_floors(self, family_key: str) -> list[FamilyFloor]:
        return self._floors.get(family_key, [])

    def family_prediction(
        self, tag: FamilyTag, prompt_tokens: Callable[[str], int | None] | None = None
    ) -> tuple[int, FamilyFit] | None:
        """The family fit's prediction for a member (OOM floors of the family bound it below);
        `prompt_tokens(task)`: a task's learned longest prompt, where the worker reports it."""
        fit = self.family_fit(tag.family_key)
        if fit is None:
            return None
        predicted = predict_member(fit, tag.batch_size, tag.tokens, tag.task, self.family_floors(tag.family_key),
                                   prompt_tokens, self.same_model(tag.family_key))
        return None if predicted is None else (predicted[0], fit)

    def family_least(self, tag: FamilyTag) -> int | None:
        """The least a member could need by its family's points on its task (a lower bound)."""
        return least_member_mib(self._points.get(tag.family_key, ()), self.family_floors(tag.family_key),
                                tag.batch_size, tag.tokens, tag.task)

    def disproven_bound(self, tag: FamilyTag) -> int | None:
        """While the family has measured nothing but an OOM has struck it: the most any of its
        members at this batch or a smaller one held (a lower bound). None: no OOM yet."""
        if self.family_measured(tag.family_key) or tag.family_key not in self._oomed:
            return None
        return floors_bound(self.family_floors(tag.family_key), tag.batch_size) or 0

    def transfer(
        self, key: str, estimate_ratio: Mapping[int, float] | None, prompt_tokens: Callable[[str], int | None],
        lower_levels: Mapping[int, str] | None = None,
    ) -> Transfer | None:
        """A neighbour's peak for a shape with none of its own: the shape the job had at a lower
        ladder level (`lower_levels`: level -> its shape key), else the same received config on
        other tasks scaled by learned prompt lengths."""
        parts = parse_shape_key(key)
        if parts is None:
            return None
        by_level = {level: self.peaks[k] for level, k in (lower_levels or {}).items() if k != key and k in self.peaks}
        found = level_transfer(max(by_level, default=-1) + 1, by_level, estimate_ratio)
        if found is not None:
            return found
        others = {
            task: (peak, prompt_tokens(task))
            for task, peak in self._by_base.get(parts.base, {}).items()
            if task != parts.task
        }
        return task_transfer(prompt_tokens(parts.task), others) if others else None


def throughput_curves(
    rows: Iterable[Any], index_of_uuid: Mapping[str, int]
) -> dict[str, dict[int, dict[int, float]]]:
    """Throughput rows -> shape key -> GPU index -> relative curve (GPUs without their own solo
    reading use the shape's curve pooled over every GPU). A reading on fewer than
    MIN_CURVE_STEPS optimizer steps is left out."""
    curves = curves_by_gpu((r.shape_key, r.gpu_uuid, r.tenants, r.samples_per_s) for r in rows
                           if r.steps >= MIN_CURVE_STEPS)
    out: dict[str, dict[int, dict[int, float]]] = {}
    for shape, per_gpu in curves.items():
        pooled = per_gpu.get("*", {})
        out[shape] = {index: per_gpu.get(uuid) or pooled for uuid, index in index_of_uuid.items()}
    return out
