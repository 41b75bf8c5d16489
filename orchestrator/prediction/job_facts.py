"""What a queued job is at its ladder level: its levels, the config an attempt receives, its
memory shape key and its predicted peak. Computed once per job or per shape and cached between
scheduling passes (`JobShapeCache`); read by the scheduler and by the attempt's outcome."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.plans.keymap import KeyMap
from orchestrator.plans.ladder_spec import Ladder, load_ladder, logits_exact
from orchestrator.plans.template import OUR_WORKERS, parse_template
from orchestrator.prediction.families import family_of
from orchestrator.prediction.ladder import (
    HostSettings,
    Level,
    expand_levels,
    inexact_rungs,
    with_host_settings,
)
from orchestrator.prediction.memory import (
    ModelInfo,
    lookup_model_info,
    model_info_from_hf_config,
    prompt_length_key,
    shape_key,
)
from orchestrator.prediction.shapes import memory_config, memory_hash
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import Attempt, FamilyTag, Job

PATH_KEYS = ("peft", "model", "data_dir")  # relative paths in a config are relative to its file


@dataclass
class ShapeFacts:
    """What a prediction needs, shared by the queued jobs that differ only by seed."""

    config: dict[str, Any]  # the job's config with the level's overrides, paths resolved
    shape_key: str
    length_key: str
    job: Job  # a job of this shape (its ladder)
    depends: tuple[Any, ...] | None = None  # what `prediction` was made from
    prediction: tuple[int, PredictionSource] = (0, PredictionSource(SourceKind.NONE))
    computed_for: Any = None  # the pass's Knowledge, for a prediction borrowed from a neighbour
    family: FamilyTag | None = None  # where the shape sits in its memory family
    level_keys: tuple[str, ...] = ()  # the job's shape key at each level up to this one


@dataclass
class JobFacts:
    """A queued job's level and prediction inputs, valid while its level and host steps stay."""

    key: tuple[int, str]  # (level, host_steps_json)
    level: Level
    shape: ShapeFacts
    allowed: frozenset[int] | None
    gpus: int = 1  # a multi-GPU job's cards
    cpus: int | None = None  # cores the suite asks for
    declared_host_mib: int | None = None  # the config's host_mem_gib
    min_stack_gain: float | None = None  # the suite's least gain for sharing a card

    @property
    def pool_key(self) -> tuple[Any, ...]:
        """Equal for facts that are interchangeable: the scheduler keeps one of each, shared by jobs alike."""
        return (self.key, id(self.shape), id(self.level), self.allowed, self.gpus, self.cpus,
                self.declared_host_mib, self.min_stack_gain)

    @functools.cached_property
    def kind(self) -> tuple[Any, ...]:
        """Jobs with equal kinds (and priority, suite, config and task) differ for packing only by
        their place in the queue. The shape is compared by identity: seeds share one."""
        return (id(self.shape), self.level.index, self.level.run_alone, self.allowed, self.gpus, self.cpus,
                self.declared_host_mib, self.min_stack_gain)


@dataclass
class JobShapeCache:
    """Facts computed once per job or per shape and kept between passes: a pass over a long
    queue then redoes only what changed (a new level, a newly measured peak or prompt length)."""

    levels: dict[tuple[Any, ...], list[Level]] = field(default_factory=dict)  # by content
    model_info: dict[str, ModelInfo | None] = field(default_factory=dict)
    peft_specs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    shapes: dict[tuple[Any, ...], ShapeFacts] = field(default_factory=dict)
    attempt_keys: dict[tuple[int, int], str] = field(default_factory=dict)  # (attempt, level) -> shape key
    attempt_families: dict[tuple[int, int], FamilyTag | None] = field(default_factory=dict)  # and its family

    def keep_shapes(self, kept: Iterable[ShapeFacts]) -> None:
        """Drop the shape facts no queued job has (kept: those it has)."""
        ids = {id(facts) for facts in kept}
        self.shapes = {k: v for k, v in self.shapes.items() if id(v) in ids}


ATTEMPT_KEYS_KEPT = 4096


def resolve_paths(config: dict[str, Any], config_path: str) -> dict[str, Any]:
    """Relative file paths in a config are written relative to the config file; the run dir's
    copy lives elsewhere, so make them absolute where the file exists."""
    resolved = dict(config)
    base = Path(config_path).parent
    for key in PATH_KEYS:
        value = resolved.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            candidate = (base / value).resolve()
            if candidate.exists():
                resolved[key] = str(candidate)
    return resolved


def model_info_of(config: dict[str, Any], cache: JobShapeCache) -> ModelInfo | None:
    model = config.get("model")
    if not isinstance(model, str):
        return None
    if model not in cache.model_info:
        info: ModelInfo | None = None
        config_json = Path(model) / "config.json"
        try:
            if config_json.is_file():
                info = model_info_from_hf_config(json.loads(config_json.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            info = None
        cache.model_info[model] = info or lookup_model_info(model)
    return cache.model_info[model]


def peft_spec_of(config: dict[str, Any], cache: JobShapeCache) -> dict[str, Any] | None:
    peft = config.get("peft")
    if isinstance(peft, dict):
        return peft
    if not isinstance(peft, str):
        return None
    if peft not in cache.peft_specs:
        try:
            loaded = json.loads(Path(peft).read_text())
            cache.peft_specs[peft] = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError):
            cache.peft_specs[peft] = None
    return cache.peft_specs[peft]


def job_keys(job: Job) -> KeyMap:
    """The ladder knobs under the script's own key names (the suite's `keys:`)."""
    names = job.worker_output.get("keys") or {}
    return KeyMap({str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {})


def worker_reaches(job: Job, keys: KeyMap) -> Callable[[str], bool] | None:
    """Which config changes (orch's key names) reach the job's worker; None: every one does (our
    workers and templates with {config} read the merged config.yaml)."""
    if job.worker in OUR_WORKERS:
        return None
    template = parse_template(job.worker)
    if template.reads_config:
        return None
    return lambda key: template.reaches(keys.script_key(key))


def job_ladder(job: Job) -> Ladder:
    """The job's ladder as submitted (the suite's, made strict by `--strict-ladder`)."""
    return load_ladder(json.loads(job.ladder_json) if job.ladder_json else None)


def job_inexact_rungs(job: Job, level: int) -> tuple[str, ...]:
    """The rungs that change numerics an attempt of `job` at `level` has gone through
    (`orchestrator.prediction.ladder.inexact_rungs` over the job's own levels)."""
    return inexact_rungs(job_levels(job, JobShapeCache()), level)


def job_levels(job: Job, cache: JobShapeCache) -> list[Level]:
    """The job's ladder levels, in orch's key names (`attempt_config` renames them). Keyed by
    content, not job id: a sweep's seeds share one ladder (and one entry)."""
    key = (job.ladder_json or "", _without_seed(job), int(job.one_token), job.worker, job.worker_output_json)
    levels = cache.levels.get(key)
    if levels is None:
        ladder = job_ladder(job)
        keys = job_keys(job)
        levels = cache.levels[key] = expand_levels(
            ladder, keys.to_orch(dict(job.config)), job.one_token, worker_reaches(job, keys), logits_exact(job.worker)
        )
    return levels


_WITHOUT_SEED: dict[str, str] = {}  # config text -> `_without_seed`, for the last few configs


def _without_seed(job: Job) -> str:
    """The config's text without its seed and task, from the config already parsed; kept for
    the last few configs, as a job's facts ask for it twice (its ladder's key, its shape's hash)."""
    found = _WITHOUT_SEED.get(job.config_json)
    if found is None:
        config = job.config
        found = json.dumps({k: v for k, v in config.items() if k not in ("seed", "data")}, sort_keys=True, default=str)
        if len(_WITHOUT_SEED) >= 16:
            _WITHOUT_SEED.pop(next(iter(_WITHOUT_SEED)))
        _WITHOUT_SEED[job.config_json] = found
    return found


def as_received(job: Job, level: Level) -> Level:
    """`level` with its changes under the script's own key names, for messages."""
    keys = job_keys(job)
    if not keys.names:
        return level
    return Level(
        level.index,
        level.rung,
        keys.to_script(level.overrides),
        keys.to_script(level.changes),
        level.run_alone,
        level.exact,
    )


def attempt_config(job: Job, level: Level) -> dict[str, Any]:
    """The config an attempt at `level` runs with: the job's, with the level's overrides under
    the script's own key names, relative paths made absolute."""
    overrides = job_keys(job).to_script(level.overrides)
    return resolve_paths({**job.config, **overrides}, job.config_path)


def job_host_settings(job: Job) -> HostSettings:
    """The host-side steps the job took after host-RAM OOMs (none before the first)."""
    if job.host_steps_json in ("", "[]"):  # nearly every job: no json.loads per job per pass
        return HostSettings.from_records(())
    return HostSettings.from_records(json.loads(job.host_steps_json))


def level_of(job: Job, cache: JobShapeCache) -> Level:
    """What the job's next attempt runs with: its ladder level plus its host-side settings."""
    levels = job_levels(job, cache)
    return with_host_settings(levels[min(job.level, len(levels) - 1)], job_host_settings(job))


def received_memory_config(job: Job, level: Level) -> tuple[dict[str, Any], list[str]]:
    """The config the script receives at `level` (the job's, with the level's changes under the
    script's own key names), and the suite's `memory_keys` (plus the number of GPUs of a
    multi-GPU job: a rank's peak depends on how the model is split)."""
    config: dict[str, Any] = {**job.config, **job_keys(job).to_script(level.overrides)}
    extra = list(job.memory_keys)
    if job.gpus > 1:
        config, extra = {**config, "gpus": job.gpus}, [*extra, "gpus"]
    if job.worker not in OUR_WORKERS:
        # Two commands given identical config files are two programs (`python small.py {config}`,
        # `python big.py {config}`): the command's digest keeps their memory apart.
        config, extra = {**config, WORKER_DIGEST_KEY: worker_digest(job.worker)}, [*extra, WORKER_DIGEST_KEY]
    return config, extra


WORKER_DIGEST_KEY = "orch.worker_sha256"  # a name no config key has (orch's keys have no dots)


def worker_digest(worker: str) -> str:
    """The digest of a job's worker command template (its placeholders unfilled, so the same
    for every seed and task)."""
    return hashlib.sha256(worker.encode()).hexdigest()[:16]


def job_shape_key(job: Job, level: Level) -> str:
    """The shape of the job's attempts at `level`: the memory-relevant keys of the config the
    script receives there (plus the suite's `memory_keys`), model and task. Two attempts passing
    identical settings share it, whatever their config name or ladder level."""
    config, extra = received_memory_config(job, level)
    foreign = job.worker not in OUR_WORKERS  # its memory keys are not known: all but the harmless
    return shape_key(memory_hash(config, extra, foreign=foreign), str(config.get("model", "")), job.data)


def job_family_tag(job: Job, level: Level) -> FamilyTag | None:
    """Where the job's shape at `level` sits in its memory family (`orchestrator.prediction.families`);
    None when the script receives no batch size."""
    config, extra = received_memory_config(job, level)
    foreign = job.worker not in OUR_WORKERS
    keys = job_keys(job)
    return family_of(memory_config(config, extra, foreign=foreign), str(config.get("model", "")), job.data,
                     keys.script_key("batch_size") if keys.names else None)


def attempt_family_tag(job: Job, attempt: Attempt, cache: JobShapeCache) -> FamilyTag | None:
    memo = (attempt.id, attempt.level)
    if memo not in cache.attempt_families:
        if len(cache.attempt_families) >= ATTEMPT_KEYS_KEPT:
            cache.attempt_families.clear()
        levels = job_levels(job, cache)
        cache.attempt_families[memo] = job_family_tag(job, levels[min(attempt.level, len(levels) - 1)])
    return cache.attempt_families[memo]


def attempt_shape_key(job: Job, attempt: Attempt, cache: JobShapeCache) -> str:
    """The shape key of a (live) attempt: its job's shape at the attempt's level. Kept per
    attempt: a running attempt's key is asked for several times in every pass."""
    memo = (attempt.id, attempt.level)
    if (found := cache.attempt_keys.get(memo)) is not None:
        return found
    levels = job_levels(job, cache)
    key = job_shape_key(job, levels[min(attempt.level, len(levels) - 1)])
    if len(cache.attempt_keys) >= ATTEMPT_KEYS_KEPT:
        cache.attempt_keys.clear()  # ended attempts' keys: dropped wholesale, rarely
    cache.attempt_keys[memo] = key
    return key


def job_prompt_length_key(job: Job) -> str:
    return prompt_length_key(resolve_paths(job.config, job.config_path), job.data)


def shape_facts(job: Job, level: Level, cache: JobShapeCache) -> ShapeFacts:
    key = (
        hashlib.sha256(_without_seed(job).encode()).hexdigest()[:16], job.config_path, job.data,
        job.worker, job.declared_mib,
        level.index, json.dumps(level.overrides, sort_keys=True, default=str),
        job.worker_output_json, job.memory_keys_json, job.gpus, job.ladder_json,
    )
    facts = cache.shapes.get(key)
    if facts is None:
        resolved = attempt_config(job, level)
        own_key = job_shape_key(job, level)
        lower = job_levels(job, cache)[: level.index]
        facts = cache.shapes[key] = ShapeFacts(
            resolved, own_key, prompt_length_key(resolved, job.data), job=job,
            family=job_family_tag(job, level), level_keys=(*(job_shape_key(job, below) for below in lower), own_key),
        )
    return facts
