"""Suite settings about a suite's worker: hang timeout, progress and result regexes, and the
check at submit that its command template can be filled. Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.plans.inputs import Scalar
from orchestrator.plans.ladder_spec import spec_steps
from orchestrator.plans.lora_keys import unknown_keys, unknown_keys_message
from orchestrator.plans.lora_values import ConfigError, check_inline_peft, check_values
from orchestrator.plans.model import KNOWN_CONFIG_KEYS, JobSpec, ShareBase, Suite
from orchestrator.plans.search import Dimension, Distribution
from orchestrator.plans.spelling import did_you_mean
from orchestrator.plans.template import check_config_keys, parse_template

HANG_TIMEOUT_OFF = 0.0  # stored for `hang_timeout_s: off`
SHARE_BASE_VALUES = tuple(mode.value for mode in ShareBase)
SHARING_WORKERS = frozenset({"lora"})  # workers that can train several jobs over one loaded base
FUSED_MEMBERS_DEFAULT = 4  # `fused_members`: the most jobs one fused process trains at once
FUSED_MEMBERS_RANGE = (2, 16)
MAX_REGEX_CHARS = 500


def parse_hang_timeout(path: Path, raw: Any) -> float:
    """Seconds without any output (progress.jsonl or stdout.log) before a worker counts as hung;
    `off` (YAML may read it as false) disables the check."""
    if raw is False or (isinstance(raw, str) and raw.strip().lower() == "off"):
        return HANG_TIMEOUT_OFF
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise PlanError(f"suite {path}: `hang_timeout_s` must be a number of seconds or off")
    if not (math.isfinite(raw) and raw > 0):
        raise PlanError(f"suite {path}: `hang_timeout_s` must be positive (or off)")
    return float(raw)


def parse_share_base(path: Path, raw: Any, worker: str) -> ShareBase:
    """`share_base`: off, sequential (one warm process per card slot and base trains jobs one
    after another; the default for `worker: lora`) or fused (several jobs of one base trained
    at once, in one process, over one batch). A value other than off on a worker that cannot
    share is refused."""
    if raw is None:
        return ShareBase.SEQUENTIAL if worker in SHARING_WORKERS else ShareBase.OFF
    value = ShareBase.OFF if raw is False else ShareBase.of(raw.strip().lower()) if isinstance(raw, str) else None
    if value is None:
        shown = repr(raw) if not isinstance(raw, str) else repr(raw[:40])
        raise PlanError(f"suite {path}: `share_base` must be off, sequential or fused, not {shown}")
    if value is not ShareBase.OFF and worker not in SHARING_WORKERS:
        raise PlanError(f"suite {path}: `share_base: {value.value}` needs the built-in LoRA worker "
                        "(`worker: lora`); other workers cannot share a loaded base: "
                        "use share_base: off")
    return value


def parse_fused_members(path: Path, raw: Any, share_base: ShareBase) -> int:
    """`fused_members`: the most jobs one fused process trains at once (2..16, default 4); only
    with `share_base: fused`, where it means something."""
    if raw is None:
        return FUSED_MEMBERS_DEFAULT
    low, high = FUSED_MEMBERS_RANGE
    if share_base is not ShareBase.FUSED:
        raise PlanError(f"suite {path}: `fused_members` applies only with `share_base: fused` "
                        f"(this suite's share_base is {share_base.value})")
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        shown = repr(raw) if not isinstance(raw, str) else repr(raw[:40])
        raise PlanError(f"suite {path}: `fused_members` must be a whole number from {low} to {high}, not {shown}")
    return raw


def parse_regex(path: Path, data: dict[str, Any], key: str, required_group: str | None) -> str | None:
    raw = data.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw or len(raw) > MAX_REGEX_CHARS:
        raise PlanError(f"suite {path}: `{key}` must be a regular expression of at most {MAX_REGEX_CHARS} characters")
    try:
        pattern = re.compile(raw)
    except re.error as exc:
        raise PlanError(f"suite {path}: `{key}` is not a valid regular expression: {exc}") from None
    if required_group and required_group not in pattern.groupindex:
        raise PlanError(f"suite {path}: `{key}` needs a named group (?P<{required_group}>...)")
    if not pattern.groupindex:
        raise PlanError(f"suite {path}: `{key}` needs named groups, one per metric, e.g. (?P<accuracy>[0-9.]+)")
    return raw


def check_worker_template(suite: Suite, jobs: Sequence[JobSpec], overrides: dict[str, Scalar]) -> None:
    """Refuse (PlanError) a command template whose `{cfg.KEY}` placeholders the submitted jobs
    cannot fill, or a ladder `set:` of a renamed batch key (only halve_batch may change it, to
    keep batch x accumulation). Our own workers read config.yaml and have no template."""
    if suite.worker != "lora":  # the LoRA worker's own check (check_values) names these
        check_knob_values(suite, jobs)
    ladder_sets: set[str] = set()
    for step in spec_steps(suite.ladder):
        if isinstance(step, dict) and isinstance(step.get("set"), dict):
            ladder_sets.update(str(k) for k in step["set"])
    for knob in ("batch_size", "gradient_accumulation_steps"):
        if suite.keys.script_key(knob) in ladder_sets - {knob}:
            raise PlanError(f"suite {suite.path}: a ladder `set:` changes {suite.keys.script_key(knob)!r} "
                            f"(orch's {knob}): use halve_batch, which keeps batch x accumulation")
    if suite.worker == "lora":
        check_lora_config_keys(suite, jobs, ladder_sets)
    if suite.worker == "sim":
        check_sim_config_keys(suite, jobs, ladder_sets)
    if suite.worker in ("lora", "sim"):
        return
    settable = set(suite.keys.script_keys()) | set(overrides) | ladder_sets
    configs = {job.config_name: job.config for job in jobs}
    if not configs:  # nothing selected: check against the suite's configs as they are
        configs = {c.name: c.content for c in suite.configs}
    check_config_keys(parse_template(suite.worker), configs, settable)


# orch's ladder knobs and the least each may be: halve_batch halves a batch and doubles the
# accumulation, data_workers lowers the loader's workers.
KNOB_FLOORS = {"batch_size": 1, "gradient_accumulation_steps": 1, "num_data_workers": 0}


def check_knob_values(suite: Suite, jobs: Sequence[JobSpec]) -> None:
    """Refuse a job whose batch size, accumulation or data workers (orch's ladder knobs, under
    the suite's names) is a number that is not a whole one at or above its floor: `--set
    batch_size=1.5` was queued and failed at run time, `-4` ran, and `8.0` reached a command as
    `8.0` (the ladder leaves a value it cannot halve alone). Text (`auto`) is the script's own.
    A search over a knob is checked over its space."""
    for job in jobs:
        config = suite.keys.to_orch(job.config)
        for knob, floor in KNOB_FLOORS.items():
            if problem := _knob_problem(config.get(knob), floor):
                raise PlanError(f"suite {suite.name}, config {job.config_name}: "
                                f"{suite.keys.script_key(knob)}={problem}")
    if suite.search is None:
        return
    for dimension in suite.search.space:
        as_orch = suite.keys.to_orch({dimension.key: None})  # the knob it is, under orch's name
        searched_floor = next((KNOB_FLOORS[k] for k in as_orch if k in KNOB_FLOORS), None)
        if searched_floor is None:
            continue
        for value in dimension_values(dimension):
            if problem := _knob_problem(value, searched_floor):
                raise PlanError(f"suite {suite.name}, search.space.{dimension.key} {shown_range(dimension)}: "
                                f"{dimension.key}={problem}")


def _knob_problem(value: Any, floor: int) -> str | None:
    """What is wrong with a ladder knob's value (`1.5 must be ...`), or None (a whole number at
    its floor or above; text or a switch, the script's own)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and value.is_integer() and value >= floor:
        return f"{value!r}: write {int(value)}, a whole number (orch's ladder halves only those)"
    if isinstance(value, float) or value < floor:
        return f"{value!r} must be a whole number of {floor} or more"
    return None


SIM_KEYS = frozenset(key for key in KNOWN_CONFIG_KEYS if key.startswith("sim_"))


def check_sim_config_keys(suite: Suite, jobs: Sequence[JobSpec], ladder_sets: set[str]) -> None:
    """Refuse a key close to one the simulated worker reads but not it (a misspelt `sim_secnds`
    would rehearse the sweep with the default run time), in the submitted configs or the ladder's
    `set:`. Other keys pass, `sim_` ones too: a rehearsal may carry the real script's config."""
    configs = {job.config_name: job.config for job in jobs} or {c.name: c.content for c in suite.configs}
    for where, keys in [*((f"config {name}", set(config)) for name, config in configs.items()),
                        ("ladder set", ladder_sets)]:
        unknown = sorted(key for key in keys if key.startswith("sim_") and key not in SIM_KEYS
                         and did_you_mean([key], SIM_KEYS))
        if unknown:
            raise PlanError(f"suite {suite.name}, {where}: the simulated worker reads no "
                            f"{', '.join(repr(key) for key in unknown)}{did_you_mean(unknown, SIM_KEYS)} "
                            f"(its keys: {', '.join(sorted(SIM_KEYS))})")


def check_lora_config_keys(suite: Suite, jobs: Sequence[JobSpec], ladder_sets: set[str]) -> None:
    """Refuse a key the LoRA worker does not know (a misspelt `warmup_step` would otherwise run
    without warm-up), in the submitted configs or the suite ladder's `set:`; and a value it would
    refuse at start (a mistyped task, `batch_size: 8.5`), in each submitted job's config as it
    would run (its task and overrides in), before anything is queued."""
    configs = {job.config_name: job.config for job in jobs}
    if not configs:
        configs = {c.name: c.content for c in suite.configs}
    for name, config in configs.items():
        unknown = unknown_keys(config)
        if unknown:
            raise PlanError(f"suite {suite.name}, config {name}: {unknown_keys_message(unknown)}")
    unknown = unknown_keys(dict.fromkeys(ladder_sets))
    if unknown:
        raise PlanError(f"suite {suite.name}, ladder set: {unknown_keys_message(unknown)}")
    if suite.search is not None and jobs:  # a TPE search draws its later trials in the daemon
        for dimension in suite.search.space:
            for value in dimension_values(dimension):
                try:
                    check_values(jobs[0].config | {dimension.key: value})
                except ConfigError as exc:
                    if f"'{dimension.key}'" not in str(exc):
                        break  # a fault of the config itself: the job's check below names it
                    drawn = repr(value) if dimension.distribution is Distribution.CHOICE else shown_range(dimension)
                    # a probe just inside a bound reads as the bound, as a drawn value is kept (6 digits)
                    said = str(exc).replace(repr(value), f"{value:.6g}") if isinstance(value, float) else str(exc)
                    raise PlanError(f"suite {suite.name}, search.space.{dimension.key} {drawn}: {said}") from None
    for job in jobs:
        if job.data != job.data.strip().lower():
            raise PlanError(f"suite {suite.name}, config {job.config_name}, task {job.data}: write the data name "
                            "as the worker reads it, "
                            f"{job.data.strip().lower()} (two spellings of one task would be two jobs)")
        try:
            check_values(job.config)
            if isinstance(job.config.get("peft"), dict):
                check_inline_peft(job.config["peft"])
        except ConfigError as exc:
            raise PlanError(f"suite {suite.name}, config {job.config_name}, task {job.data}: {exc}") from None


def shown_range(dimension: Dimension) -> str:
    return f"{dimension.distribution.value} [{dimension.low:g}, {dimension.high:g}]"


def dimension_values(dimension: Dimension) -> tuple[Scalar, ...]:
    """What a searched key may take, as far as a check of values goes: its choices; an
    int_uniform's bounds; just inside a uniform's or log_uniform's bounds (a draw lands on a
    bound practically never, and such a draw is a fraction: a key the worker reads as an
    integer is refused). Every check of lora_values is a bound or a kind, so these stand for
    the values between."""
    if dimension.distribution is Distribution.CHOICE:
        return dimension.choices
    if dimension.distribution is Distribution.INT_UNIFORM:
        return (int(dimension.low), int(dimension.high))
    return (math.nextafter(dimension.low, dimension.high), math.nextafter(dimension.high, dimension.low))


ORCH_READ_KEYS = frozenset({"gpus", "cpus", "host_mem_gib"})  # orch itself sizes a job by these


def check_keys_reach(suite: Suite, sources: dict[str, str]) -> None:
    """Refuse a `--set`/`--grid`/`grid:` key (key -> where it was given) that the worker command
    never receives: its jobs would be identical runs told apart only by a label. env.NAME
    reaches the environment, and orch itself reads the resource keys."""
    if suite.worker in ("lora", "sim"):
        return
    template = parse_template(suite.worker)
    for key, given in sources.items():
        if key.startswith("env.") or key in ORCH_READ_KEYS or template.reaches(key):
            continue
        flag = f"--{key.replace('_', '-')}"
        raise PlanError(f"{given} {key}: the worker command never receives {key} "
                        f"(it has no {{config}} and no {{cfg.{key}}}): add e.g. "
                        f"`{flag} {{cfg.{key}}}` or `--config {{config}}` to the suite's worker")
