"""A queued job's predicted peak at its ladder level: its shape's own memory, its neighbours'
(other levels, other tasks, its memory family), the estimate or the declared figure, raised to
what OOMs at or below its level support (`orchestrator.prediction.carried`). Recomputed only when
what it rests on changed (`ShapeFacts.depends`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from orchestrator.prediction.carried import LevelEvidence, with_evidence
from orchestrator.prediction.job_facts import (
    JobShapeCache,
    ShapeFacts,
    job_family_tag,
    job_levels,
    job_shape_key,
    model_info_of,
    peft_spec_of,
    resolve_paths,
    shape_facts,
)
from orchestrator.prediction.ladder import Level
from orchestrator.prediction.learned import Knowledge
from orchestrator.prediction.memory import (
    Prediction,
    at_learned_length,
    estimate_peak_mib,
    max_seq_len_of,
    predict_peak_mib,
    prompt_length_key,
)
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import Job, ShapeMemory


def predict(
    shapes: dict[str, ShapeMemory], job: Job, level: Level, cache: JobShapeCache,
    prompt_lengths: Mapping[str, int] | None = None,
    knowledge: Knowledge | None = None,
) -> tuple[int, PredictionSource]:
    return predict_for(shape_facts(job, level, cache), job, level, shapes, prompt_lengths or {}, cache, knowledge)


def predict_for(
    facts: ShapeFacts, job: Job, level: Level, shapes: Mapping[str, ShapeMemory],
    prompt_lengths: Mapping[str, int], cache: JobShapeCache, knowledge: Knowledge | None,
) -> tuple[int, PredictionSource]:
    """The job's prediction, recomputed only when its shape's measured memory, running peak or
    learned prompt length changed since the last time; a shape with none of its own (which
    borrows a neighbour's peak) once per pass."""
    key = facts.shape_key
    measured = shapes.get(key)
    learned = prompt_lengths.get(facts.length_key) if job.worker == "lora" else None
    running = knowledge.running.get(key) if knowledge is not None else None
    held = knowledge.held.get(key) if knowledge is not None else None
    borrows = knowledge is not None and (measured is None or measured.peak_mib is None) and running is None
    below = tuple(shapes.get(k) for k in facts.level_keys)  # OOM evidence at this level and those before
    carries = any(m is not None and (m.oom_floor_mib or m.disproved_mib) for m in below)
    depends = (measured, learned, running, held, below)
    if facts.depends == depends and (not (borrows or carries) or facts.computed_for is knowledge):
        return facts.prediction
    config = facts.config
    estimated: int | None = None
    sized: Mapping[str, Any] = config
    if job.worker == "lora":
        sized = at_learned_length(config, learned)  # `config` itself when nothing applies
        estimated = estimate_peak_mib(sized, model_info_of(config, cache), peft_spec_of(config, cache))
    transfer = None
    if borrows and knowledge is not None:
        transfer = knowledge.transfer(
            key, _level_ratios(facts.job, level, cache, estimated, prompt_lengths),
            lambda task: prompt_lengths.get(prompt_length_key(config, task)),
            {lower.index: job_shape_key(facts.job, lower) for lower in job_levels(facts.job, cache)[: level.index]},
        )
    family, disproven = (None, None)
    if borrows and knowledge is not None:
        family, disproven = _family_inputs(facts, knowledge, (
            lambda task: prompt_lengths.get(prompt_length_key(config, task))) if job.worker == "lora" else None)
    prediction = predict_peak_mib(measured, estimated, job.declared_mib, running=running, transfer=transfer, held=held,
                                  family=family, disproven_mib=disproven)
    if carries:
        evidence = [LevelEvidence(i, m.oom_floor_mib, m.disproved_mib) for i, m in enumerate(below) if m is not None]
        prediction = with_evidence(prediction, evidence, level.index,
                                   _rung_saving(facts.job, cache, knowledge, prompt_lengths))
    result = (prediction.mib, prediction.source)
    if prediction.source.kind is SourceKind.ESTIMATE and sized is not config:
        result = (prediction.mib, replace(prediction.source, tokens=max_seq_len_of(sized)))
    facts.depends, facts.prediction, facts.computed_for = depends, result, knowledge
    return result


def _family_inputs(facts: ShapeFacts, knowledge: Knowledge, prompt_tokens: Callable[[str], int | None] | None,
                   ) -> tuple[Prediction | None, int | None]:
    """The family fit's prediction for a shape with no peak of its own, and (while the family
    has measured nothing) the bound an OOM in it set. `prompt_tokens`: learned prompt lengths
    by task (LoRA jobs), which scale other tasks' points."""
    tag = facts.family
    if tag is None:
        return None, None
    found = knowledge.family_prediction(tag, prompt_tokens)
    if found is None:
        return None, knowledge.disproven_bound(tag)
    mib, fit = found
    return Prediction(mib, PredictionSource(SourceKind.FAMILY, points=len(fit.points), error=fit.error_fraction)), None


def _rung_saving(job: Job, cache: JobShapeCache, knowledge: Knowledge | None,
                 prompt_lengths: Mapping[str, int]) -> Callable[[int], float | None]:
    """Memory at level r over memory at level r-1 for the job: the job's memory families at both
    levels where both measured something, else (LoRA jobs) the estimate at both, else unknown."""
    levels = job_levels(job, cache)

    def at(index: int) -> int | None:
        config = resolve_paths({**job.config, **levels[index].overrides}, job.config_path)
        sized = at_learned_length(config, prompt_lengths.get(prompt_length_key(config, job.data)))
        return estimate_peak_mib(sized, model_info_of(config, cache), peft_spec_of(config, cache))

    def saving(rung: int) -> float | None:
        if not 0 < rung < len(levels):
            return None
        if knowledge is not None:
            tags = (job_family_tag(job, levels[rung - 1]), job_family_tag(job, levels[rung]))
            found = [knowledge.family_prediction(tag) if tag is not None else None for tag in tags]
            if found[0] is not None and found[1] is not None and found[0][0] > 0:
                return found[1][0] / found[0][0]
        if job.worker == "lora" and (before := at(rung - 1)) and (after := at(rung)):
            return after / before
        return None

    return saving


def _level_ratios(
    job: Job, level: Level, cache: JobShapeCache, estimated: int | None,
    prompt_lengths: Mapping[str, int] | None,
) -> dict[int, float] | None:
    """Estimate at `level` / estimate at each lower level (LoRA jobs): how much the rungs between
    save, applied to a peak measured at the lower level."""
    if estimated is None or level.index == 0:
        return None
    ratios: dict[int, float] = {}
    for lower in job_levels(job, cache)[: level.index]:
        config = resolve_paths({**job.config, **lower.overrides}, job.config_path)
        sized = at_learned_length(config, (prompt_lengths or {}).get(prompt_length_key(config, job.data)))
        at_lower = estimate_peak_mib(sized, model_info_of(config, cache), peft_spec_of(config, cache))
        if at_lower:
            ratios[lower.index] = estimated / at_lower
    return ratios
