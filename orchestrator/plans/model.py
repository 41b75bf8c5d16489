"""What a suite is once loaded: its configs, crash-loop guard and settings, and the jobs it
expands into. Types only (and the defaults they name), so that loading, expanding and checking
worker output can all import them without importing each other."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from orchestrator.plans.early_stop import EarlyStop
from orchestrator.plans.inputs import PAIR_KEYS, Pair, Scalar
from orchestrator.plans.keymap import NO_KEYS, KeyMap
from orchestrator.plans.template import parse_template

# Config keys shared with the researchers' own training scripts, plus the ones our workers read.
KNOWN_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "model", "peft", "batch_size", "learning_rate", "num_epochs", "prec", "seed",
        "gradient_accumulation_steps", "gradient_checkpointing", "logits_to_keep",
        "num_data_workers", "data", "data_dir", "max_steps", "max_seq_len", "no_save",
        "eval_every_steps", "weight_decay", "warmup_steps",
        "warmup_ratio", "lr_scheduler", "max_grad_norm", "eval_batch_size",
        "sim_mem_gib", "sim_seconds", "sim_ramp_s", "sim_fail", "sim_reference_batch",
        "sim_base_gib", "sim_host_max_workers", "sim_best_lr", "sim_host_oom_kind", "sim_fail_seeds",
        "gpus", "cpus", "host_mem_gib", "sim_host_gib", "sim_startup_s", "sim_exit_s",
        "checkpoint_every_steps",  # the lora worker's checkpoint period (resume_from_checkpoint is orch's to set)
    }
)

# Crash-loop guard defaults (suite key `crash_loop`): this many fast non-OOM failures of one
# suite inside the window pause it, so a broken config does not burn through the whole queue.
CRASH_LOOP_FAILURES = 3
CRASH_LOOP_WITHIN_S = 30.0  # an attempt failing sooner than this after its start counts as fast
CRASH_LOOP_WINDOW_S = 300.0  # how far back failures are counted
# Deaths with a checkpoint left (SIGKILL without OOM evidence, each one further than the last)
# resumed without using up max_attempts: a few, never without end.
DEFAULT_MAX_RESUMES = 8


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class ConfigSpec:
    name: str
    path: Path
    content: dict[str, Any]  # the config file as loaded


@dataclass(frozen=True)
class CrashLoop:
    """When to pause a suite: `failures` attempts that each failed (not OOM, not hung) within
    `within_s` of starting, all ended in the last `window_s`. `failures == 0` switches it off."""

    failures: int = CRASH_LOOP_FAILURES
    within_s: float = CRASH_LOOP_WITHIN_S
    window_s: float = CRASH_LOOP_WINDOW_S

    @property
    def enabled(self) -> bool:
        return self.failures > 0


class ShareBase(str, Enum):
    """`share_base`: how a suite's LoRA jobs share a loaded base. The same words name a warm
    process's mode in an attempt's share.json (sequential or fused) and the ORCH_SHARE_BASE it
    is given."""

    OFF = "off"  # each attempt loads its own base
    SEQUENTIAL = "sequential"  # one warm LoRA worker process per card slot trains jobs of one base in turn
    FUSED = "fused"  # one process trains up to `fused_members` jobs of one base at once

    @classmethod
    def of(cls, value: object) -> ShareBase | None:
        """The mode a stored or reported text names; None for anything else (untrusted input)."""
        return next((mode for mode in cls if mode.value == value), None)


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    worker: str  # "lora", "sim", or a command template
    mem_gib: float
    env: dict[str, str]
    configs: tuple[ConfigSpec, ...]
    rounds: dict[str, tuple[str, ...]]  # name -> config names, in file order
    one_token_tasks: tuple[str, ...]  # fnmatch patterns of tasks scored on one token
    ladder: Any  # the suite's `ladder:` as written: a list of rungs, "strict", {strict, steps}, or None
    max_attempts: int
    hang_timeout_s: float
    description: str = ""
    crash_loop: CrashLoop = CrashLoop()
    notify: tuple[str, ...] = ()  # notification URLs (Apprise) for this suite's ends and failures
    keys: KeyMap = NO_KEYS  # orch's ladder knobs under the script's own key names
    progress_regex: str | None = None  # progress from stdout beyond the shapes orch knows
    result_regex: str | None = None  # metrics from stdout when there is no result.json
    fail_on_divergence: bool = False  # a run whose loss diverged fails instead of succeeding (marked)
    divergence_factor: float | None = None  # k of "last epoch above k × its minimum"; None: the default, 0: off
    share_base: ShareBase = ShareBase.OFF
    fused_members: int = 4

    @property
    def worker_output(self) -> dict[str, Any]:
        """What the daemon needs to drive and read this suite's worker, stored with each job."""
        stored: dict[str, Any] = {}
        if self.fail_on_divergence:
            stored["fail_on_divergence"] = True
        if self.divergence_factor is not None:
            stored["divergence_factor"] = self.divergence_factor
        if self.keys.names:
            stored["keys"] = self.keys.to_json()
        if self.progress_regex:
            stored["progress_regex"] = self.progress_regex
        if self.result_regex:
            stored["result_regex"] = self.result_regex
        if self.share_base is not ShareBase.OFF:
            stored["share_base"] = self.share_base.value
        if self.share_base is ShareBase.FUSED:
            stored["fused_members"] = self.fused_members
        return stored
    memory_keys: tuple[str, ...] = ()  # config keys beyond the known ones that change memory
    min_stack_gain: float | None = None  # stop stacking a card below this measured marginal gain
    slurm: dict[str, Any] = field(default_factory=dict)  # validated `slurm:` settings (plans.slurm_settings)
    gpus: int = 1  # cards per job (a gang) unless a config says otherwise
    cpus: int | None = None  # cores per job, counted only when set
    grid: dict[str, list[Scalar]] = field(default_factory=dict)  # `grid:` values per key (plans.grid)
    pairs: tuple[Pair, ...] = ()  # `seeds:` × `tasks:`, used when no --pairs is given
    not_science: tuple[str, ...] = ()  # config keys that never split results rows (paths, sim time)
    early_stop: EarlyStop | None = None  # `early_stop:`: stop hopeless settings (plans.early_stop)
    search: Any = None  # `search:` (plans.search.Search): random or TPE trials over config keys
    max_resumes: int = DEFAULT_MAX_RESUMES  # deaths resumed from a checkpoint without counting

    def config_names(self) -> list[str]:
        return [c.name for c in self.configs]

    def known_keys(self) -> set[str]:
        return known_keys(self.worker, self.configs)


def known_keys(worker: str, configs: Iterable[ConfigSpec]) -> set[str]:
    """The keys `--set`, `--grid` and `grid:` may name: the configs' own, those the worker command
    names (`{cfg.KEY}`), and for orch's own workers (lora, sim) every key the worker reads; never
    seed or data."""
    if worker == "sim":
        keys = set(KNOWN_CONFIG_KEYS)
    elif worker == "lora":  # the simulator's own keys mean nothing to the LoRA worker
        keys = {key for key in KNOWN_CONFIG_KEYS if not key.startswith("sim_")}
    else:
        template = parse_template(worker)
        keys = set(template.value_keys | template.flag_keys)
    for config in configs:
        keys.update(config.content)
    return keys - PAIR_KEYS


@dataclass(frozen=True)
class JobSpec:
    """One job to queue: a config of a suite at one seed and task, with overrides."""

    suite: str
    config_name: str
    config_path: str
    config: dict[str, Any]  # suite config with seed, data and --set overrides merged
    seed: int
    data: str
    overrides: dict[str, Scalar]
    env: dict[str, str]  # suite env + env.* overrides
    identity: str
    gpus: int = 1
    cpus: int | None = None
    trial: int | None = None  # its trial's number in the suite's `search:`
