"""Suites, configs, GPU plans, pairs, rounds and `--set` overrides.

`inputs` parses what a user types (pure functions); `suite` loads suite files and expands them
into jobs. Every bad value raises PlanError (exit 2) with one line naming it.
"""

from orchestrator.plans.inputs import (
    DEFAULT_SLOTS,
    MAX_GPU_INDEX,
    MAX_PAIRS_CHARS,
    MAX_SEED,
    MAX_SLOTS_PER_GPU,
    MAX_VALUE_CHARS,
    PAIR_KEYS,
    GpuPlan,
    Pair,
    Scalar,
    parse_gpu_plan,
    parse_gpus,
    parse_pairs,
    parse_round,
    parse_scalar,
    parse_set_overrides,
)
from orchestrator.plans.model import (
    CRASH_LOOP_FAILURES,
    CRASH_LOOP_WINDOW_S,
    CRASH_LOOP_WITHIN_S,
    KNOWN_CONFIG_KEYS,
    ConfigSpec,
    CrashLoop,
    Suite,
)
from orchestrator.plans.suite import (
    CRASH_LOOP_OFF,
    MAX_CRASH_LOOP_FAILURES,
    MAX_CRASH_LOOP_S,
    JobSpec,
    canonical_json,
    default_plans_dir,
    expand_jobs,
    job_identity,
    list_suites,
    load_suite,
)
from orchestrator.plans.worker_output import check_worker_template

__all__ = [
    "CRASH_LOOP_FAILURES",
    "CRASH_LOOP_OFF",
    "CRASH_LOOP_WINDOW_S",
    "CRASH_LOOP_WITHIN_S",
    "DEFAULT_SLOTS",
    "KNOWN_CONFIG_KEYS",
    "MAX_CRASH_LOOP_FAILURES",
    "MAX_CRASH_LOOP_S",
    "MAX_GPU_INDEX",
    "MAX_PAIRS_CHARS",
    "MAX_SEED",
    "MAX_SLOTS_PER_GPU",
    "MAX_VALUE_CHARS",
    "PAIR_KEYS",
    "ConfigSpec",
    "CrashLoop",
    "GpuPlan",
    "JobSpec",
    "Pair",
    "Scalar",
    "Suite",
    "canonical_json",
    "check_worker_template",
    "default_plans_dir",
    "expand_jobs",
    "job_identity",
    "list_suites",
    "load_suite",
    "parse_gpu_plan",
    "parse_gpus",
    "parse_pairs",
    "parse_round",
    "parse_scalar",
    "parse_set_overrides",
]
