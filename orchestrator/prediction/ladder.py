"""The degradation ladder: what an OOM'd job changes on its next attempt, and whether to retry.

Pure: the daemon and the virtual-time simulator call `expand_levels` once per job and
`retry_decision` after every attempt. Each level's overrides are cumulative against the job's
own config, and every level keeps `batch_size × gradient_accumulation_steps` (so the effective
batch and the learning-rate schedule) unchanged, which keeps degraded results comparable.
A CUDA OOM moves the job one level down. A host-RAM OOM leaves the level alone and adds a
host-side step (fewer data workers, then running alone) to the job's `HostSettings`, which
every later attempt keeps on top of its level: GPU memory was not the problem, so nothing
GPU-side changes. The ladder as a suite writes it is parsed in `ladder_spec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from orchestrator.lifecycle import REASON_HUNG, AttemptOutcome

# The ladder as written (its steps and their parsing) lives in ladder_spec; its public names
# are importable from here too.
from orchestrator.plans.ladder_spec import (
    ACCUM_KEY,
    BATCH_KEY,
    CHECKPOINTING_KEY,
    DEFAULT_LADDER_SPEC,
    EVAL_BATCH_KEY,
    LOGITS_KEY,
    WORKERS_KEY,
    Ladder,
    Rung,
    is_one_token_task,
    load_ladder,
    load_ladder_file,
)
from orchestrator.wording import fmt_value

__all__ = [
    "ACCUM_KEY",
    "BATCH_KEY",
    "CHECKPOINTING_KEY",
    "DEFAULT_LADDER_SPEC",
    "DEFAULT_MAX_ATTEMPTS",
    "HUNG_RETRIES",
    "LOGITS_KEY",
    "NO_HOST_STEPS",
    "WORKERS_KEY",
    "HostSettings",
    "HostStep",
    "Ladder",
    "Level",
    "RetryDecision",
    "Rung",
    "expand_levels",
    "first_inexact_level",
    "inexact_rungs",
    "is_one_token_task",
    "load_ladder",
    "load_ladder_file",
    "next_host_step",
    "retry_decision",
    "with_host_settings",
]

DEFAULT_MAX_ATTEMPTS = 8
HUNG_RETRIES = 1  # a hang may be the machine's fault: one more try unchanged, then fail


@dataclass(frozen=True)
class Level:
    """One attempt configuration. `overrides` are cumulative against the job's config."""

    index: int
    rung: str  # the name of the rung this level comes from ("as_configured" for level 0)
    overrides: dict[str, Any] = field(default_factory=dict)
    changes: dict[str, Any] = field(default_factory=dict)  # vs. the previous level
    run_alone: bool = False
    exact: bool = True  # its rung keeps numbers bit-equal (`Rung.exact`); level 0 is as configured

    def describe(self) -> str:
        shown = [f"{key}={fmt_value(value)}" for key, value in self.changes.items()]
        if self.run_alone and not self.changes:
            shown.append("run alone on a GPU")
        return f"level {self.index} ({self.rung}): " + (", ".join(shown) or "as configured")


@dataclass(frozen=True)
class HostStep:
    """One host-side step a job took after a host-RAM OOM, kept on top of its ladder level."""

    level: int  # the ladder level the job was at when it took the step
    rung: str  # the name of the rung it came from (stored as "step": records keep their key)
    changes: dict[str, Any] = field(default_factory=dict)  # config changes (num_data_workers)
    run_alone: bool = False  # whether this step made the job run alone

    def to_record(self) -> dict[str, Any]:
        return {
            "level": self.level, "step": self.rung, "changes": self.changes,
            "run_alone": self.run_alone,
        }  # fmt: skip


@dataclass(frozen=True)
class HostSettings:
    """Every host-side step a job has taken, in order. Stored with the job; a CUDA OOM moving
    the job down the ladder keeps them."""

    steps: tuple[HostStep, ...] = ()

    @property
    def overrides(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for step in self.steps:
            merged.update(step.changes)
        return merged

    @property
    def run_alone(self) -> bool:
        return any(step.run_alone for step in self.steps)

    def to_records(self) -> list[dict[str, Any]]:
        return [step.to_record() for step in self.steps]

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> HostSettings:
        return cls(
            tuple(
                HostStep(
                    level=int(r["level"]),
                    rung=str(r["step"]),
                    changes=dict(r.get("changes", {})),
                    run_alone=bool(r.get("run_alone", False)),
                )
                for r in records
            )
        )


NO_HOST_STEPS = HostSettings()


@dataclass(frozen=True)
class RetryDecision:
    action: Literal["requeue", "fail", "done"]
    level: Level | None  # the ladder level of the next attempt when requeued
    why: str
    # The job's host-side settings for the next attempt (those it had, or one step more).
    host: HostSettings = NO_HOST_STEPS


def _smallest_factor(number: int) -> int:
    for factor in range(2, int(number**0.5) + 1):
        if number % factor == 0:
            return factor
    return number


def _lowers(current: Any, target: int) -> bool:
    """Whether setting an int knob to `target` reduces it (unset counts as higher)."""
    return not isinstance(current, int) or isinstance(current, bool) or current > target


def _rung_changes(step: Rung, current: Mapping[str, Any], one_token_task: bool) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if step.checkpointing and current.get(CHECKPOINTING_KEY) is not True:
        changes[CHECKPOINTING_KEY] = True
    if step.logits_to_keep is not None and one_token_task:
        kept = current.get(LOGITS_KEY)
        if kept in (None, 0) or _lowers(kept, step.logits_to_keep):  # 0 keeps every position
            changes[LOGITS_KEY] = step.logits_to_keep
    if step.data_workers is not None and _lowers(current.get(WORKERS_KEY), step.data_workers):
        changes[WORKERS_KEY] = step.data_workers
    for key, value in step.set_values:
        if key not in current or current[key] != value:
            changes[key] = value
    return changes


def _halvings(current: Mapping[str, Any], eval_too: bool = True) -> list[dict[str, Any]]:
    """Successive batch reductions down to 1. An odd size is divided by its smallest prime
    factor instead of 2 so that batch × accumulation stays exactly the same. An explicit
    `eval_batch_size` (`eval_too`: it reaches the worker) is scaled by the same factor, at least
    1, so an evaluation that ran out of memory gets smaller too (scores do not depend on it)."""
    batch, accum = current.get(BATCH_KEY), current.get(ACCUM_KEY, 1)
    if not isinstance(batch, int) or isinstance(batch, bool) or not isinstance(accum, int):
        return []  # no batch size we can reason about: nothing to halve
    configured_batch, raw_eval = batch, current.get(EVAL_BATCH_KEY)
    eval_batch = raw_eval if isinstance(raw_eval, int) and not isinstance(raw_eval, bool) and raw_eval > 0 else 0
    scale_eval = eval_too and eval_batch > 0
    result: list[dict[str, Any]] = []
    while batch > 1:
        factor = _smallest_factor(batch)
        batch, accum = batch // factor, accum * factor
        changes: dict[str, Any] = {BATCH_KEY: batch, ACCUM_KEY: accum}
        if scale_eval:
            changes[EVAL_BATCH_KEY] = max(1, eval_batch * batch // configured_batch)
        result.append(changes)
    return result


def expand_levels(
    ladder: Ladder,
    base_config: Mapping[str, Any],
    one_token_task: bool,
    reaches: Callable[[str], bool] | None = None,
    logits_exact: bool = True,
) -> list[Level]:
    """Level 0 (as configured) and every rung that really changes this config, in order.

    `reaches(key)` says whether a change of config `key` reaches the worker (None: all do). A
    change that cannot reach it is left out, and a rung left with nothing to change is skipped,
    so no level claims a change the worker never received. `logits_exact`: whether a change of
    `logits_to_keep` keeps the worker's numbers bit-equal (`plans.ladder_spec.logits_exact`); where
    not, a rung changing it is inexact unless it says `exact:` itself. A strict ladder leaves out
    every rung that changes numerics (of a rung inexact only by `logits_to_keep`, that change)."""
    current = dict(base_config)
    overrides: dict[str, Any] = {}
    levels = [Level(index=0, rung="as_configured")]
    run_alone = False

    def add(step: Rung, changes: dict[str, Any]) -> None:
        nonlocal run_alone
        current.update(changes)
        overrides.update(changes)
        run_alone = run_alone or step.run_alone
        levels.append(Level(len(levels), step.name, dict(overrides), changes, run_alone, step.exact))

    for step in ladder.rungs:
        if ladder.strict and not step.exact:
            continue
        if step.halve_batch:
            if reaches is None or (reaches(BATCH_KEY) and reaches(ACCUM_KEY)):
                for changes in _halvings(current, reaches is None or reaches(EVAL_BATCH_KEY)):
                    add(step, changes)
            continue
        changes = _rung_changes(step, current, one_token_task)
        if reaches is not None:
            changes = {key: value for key, value in changes.items() if reaches(key)}
        if LOGITS_KEY in changes and not logits_exact and not step.exact_declared:
            if ladder.strict:
                changes.pop(LOGITS_KEY)
            else:
                step = replace(step, exact=False)
        if changes or (step.run_alone and not run_alone):
            add(step, changes)
    return levels


def inexact_rungs(levels: Sequence[Level], level: int) -> tuple[str, ...]:
    """The names of the rungs that change numerics which an attempt at `level` (an index into
    the job's expanded `levels`) has gone through, in ladder order, each once: empty when its
    numbers are those level 0 gives. Levels are cumulative, so every lower level counts.
    Host-side steps (fewer data workers, running alone) are exact and never named."""
    names: dict[str, None] = {}
    for reached in levels[1 : level + 1]:
        if not reached.exact:
            names.setdefault(reached.rung)
    return tuple(names)


def exact_levels_after(levels: Sequence[Level], level: int) -> list[Level]:
    """The levels after `level` reached through exact rungs only (each keeps numbers bit-equal):
    up to, not including, the next rung that changes numerics."""
    found = []
    for later in levels[level + 1 :]:
        if not later.exact:
            break
        found.append(later)
    return found


def first_inexact_level(levels: Sequence[Level]) -> int | None:
    """The index of the first level whose rung changes numerics; None when every one is exact."""
    return next((level.index for level in levels[1:] if not level.exact), None)


def with_host_settings(level: Level, host: HostSettings) -> Level:
    """What an attempt at `level` runs with: the level's overrides plus the host-side ones
    (where the level does not already lower the same knob further), running alone if either
    says so. Its step and changes are the latest host step's when the job took it at this
    level (the attempt after a host OOM records only what that step changed), else the level's."""
    if not host.steps:
        return level
    overrides = dict(level.overrides)
    for key, value in host.overrides.items():
        if key not in overrides or _lowers(overrides[key], value):
            overrides[key] = value
    latest = host.steps[-1]
    rung, changes = level.rung, dict(level.changes)
    if latest.level == level.index:
        rung, changes = latest.rung, dict(latest.changes)
    return Level(level.index, rung, overrides, changes, level.run_alone or host.run_alone, level.exact)


def _lowers_host_memory(level: Level, previous: Level) -> bool:
    return WORKERS_KEY in level.changes or (level.run_alone and not previous.run_alone)


def next_host_step(
    levels: Sequence[Level], current_index: int, host: HostSettings = NO_HOST_STEPS
) -> HostSettings | None:
    """The job's host settings after a host-RAM OOM at `current_index`: one step more, taken
    from the first rung of its ladder that lowers host memory and is not yet in effect (fewer
    data workers than it runs with now, then running alone). Only that rung's host-side part
    is taken, so no GPU-side setting changes. None when nothing host-side is left."""
    now = with_host_settings(levels[current_index], host)
    for level in levels[1:]:
        if not _lowers_host_memory(level, levels[level.index - 1]):
            continue
        changes: dict[str, Any] = {}
        workers = level.changes.get(WORKERS_KEY)
        # No count in the overrides means the job's own, which the first data_workers level lowers.
        if isinstance(workers, int) and _lowers(now.overrides.get(WORKERS_KEY), workers):
            changes[WORKERS_KEY] = workers
        run_alone = level.run_alone and not now.run_alone
        if changes or run_alone:
            taken = HostStep(current_index, level.rung, changes, run_alone)
            return HostSettings((*host.steps, taken))
    return None


def _repeats(level: Level, current: Level, ran_alone: bool) -> bool:
    """Whether an attempt at `level` would repeat the one that just OOM'd at `current`: the same
    settings, and running alone adds nothing to an attempt that had its card to itself."""
    return ran_alone and level.overrides == current.overrides


def _after_oom(
    levels: Sequence[Level], current_index: int, outcome: AttemptOutcome, host: HostSettings,
    ran_alone: bool = False,
) -> tuple[Level, HostSettings] | None:
    """(ladder level, host settings) of the attempt after an OOM; None when nothing is left.
    A CUDA OOM moves down to the next ladder level that changes something for this attempt
    (`ran_alone`: it had no other job on its card, so a rung that only runs it alone is passed
    over) and keeps the host settings; a host OOM stays at this level and adds the next
    host-side step (fewer data workers, then running alone), changing nothing GPU-side."""
    if outcome is AttemptOutcome.OOM:
        current = levels[current_index]
        later = [level for level in levels[current_index + 1 :] if not _repeats(level, current, ran_alone)]
        return (later[0], host) if later else None
    if outcome is AttemptOutcome.HOST_OOM:
        stepped = next_host_step(levels, current_index, host)
        return (levels[current_index], stepped) if stepped is not None else None
    return None


def retry_decision(
    outcome: AttemptOutcome,
    reason: str,
    attempts_so_far: int,
    levels: Sequence[Level],
    current_index: int,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    *,
    retryable: bool = True,
    hung_retries_so_far: int = 0,
    host: HostSettings = NO_HOST_STEPS,
    strict: bool = False,
    ran_alone: bool = False,
) -> RetryDecision:
    """What to do after an attempt ends: the single entry point the daemon calls.

    `attempts_so_far` counts the attempt that just ended; `hung_retries_so_far` counts earlier
    attempts of this job that were requeued because they hung; `host` is the job's host-side
    settings, kept by every requeue and one step longer after a host OOM; `strict`: the
    job's ladder has exact rungs only (said when it runs out); `ran_alone`: the attempt had no
    other attempt on its card when it ended (a rung that only runs it alone would repeat it).
    """
    current = levels[current_index]
    if outcome in (AttemptOutcome.SUCCEEDED, AttemptOutcome.CANCELLED, AttemptOutcome.PRUNED):
        return RetryDecision("done", None, outcome.value, host)
    out_of_attempts = attempts_so_far >= max_attempts
    if outcome is AttemptOutcome.FAILED:
        hung_again = hung_retries_so_far >= HUNG_RETRIES
        if reason == REASON_HUNG and retryable and not hung_again and not out_of_attempts:
            return RetryDecision("requeue", current, "hung: retried once, unchanged", host)
        if not retryable:
            return RetryDecision("fail", None, f"{reason} (not retryable)", host)
        return RetryDecision("fail", None, reason, host)
    if out_of_attempts:
        return RetryDecision(
            "fail",
            None,
            f"gave up after {attempts_so_far} attempts; last: {outcome.value}: {reason}",
            host,
        )
    if outcome is AttemptOutcome.LOST:
        return RetryDecision("requeue", current, f"lost ({reason}): requeued unchanged", host)
    after = _after_oom(levels, current_index, outcome, host, ran_alone)
    if after is None:
        ran = with_host_settings(current, host).describe()
        if outcome is AttemptOutcome.HOST_OOM:
            why = f"host OOM with no host-side step left after {ran}: {reason}"
        elif strict:
            why = (f"OOM at every exact rung of the strict ladder (last {ran}; rungs that change "
                   f"numerics are not tried): {reason}")
        else:
            why = f"OOM at every level of the degradation ladder (last {ran}): {reason}"
        return RetryDecision("fail", None, why, host)
    following, host = after
    shown = with_host_settings(following, host).describe()
    passed = [level.index for level in levels[current_index + 1 : following.index]]
    if passed and outcome is AttemptOutcome.OOM:
        numbers = ", ".join(str(index) for index in passed)
        shown += f" (level {numbers} passed over: it only runs alone, and this attempt had its card to itself)"
    return RetryDecision("requeue", following, f"{outcome.value}: {reason}; next {shown}", host)
