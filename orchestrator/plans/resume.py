"""Whether a job's worker can resume from a checkpoint, and how it is told which. Pure.

An attempt after a death gets the latest checkpoint of the job's earlier attempts
(orchestrator.executors.checkpoints) in two ways, only where the worker can take it:
- `{resume}` in a command template: the checkpoint's path; an argument that uses it is left
  out when there is none, so `--resume_from_checkpoint={resume}` is given only on a resume;
- the config key `resume_from_checkpoint` (or the name the suite's `keys:` gives it), in the
  attempt's config.yaml and `{cfg.KEY}` values: set only on a resume, never to an empty value
  (a Hugging Face Trainer given "" looks for a checkpoint named "").
Only attempts after the latest one that failed (a config error, a non-finite loss: anything
but a death such as an OOM, a hang, a lost process or a kill), after the latest that ran
another worker command, and after `orch retry --fresh` are searched: a bad checkpoint or one
written by another command is never resumed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from orchestrator.errors import PlanError
from orchestrator.plans.keymap import RESUME_KEY, KeyMap
from orchestrator.plans.template import parse_template

RESUME_PLACEHOLDER = "resume"
RESUMING_WORKERS = frozenset({"lora"})  # ours that read the key (the sim worker keeps no state)
# The file a worker of ours writes last into a checkpoint folder (workers/lora/checkpoint.py's
# STATE_FILE): a folder without it is no checkpoint (a save or a removal cut short).
_MARKERS = {"lora": "state.json"}
NOT_RESUMING_WORKERS = frozenset({"sim"})


def worker_can_resume(worker: str, keys: KeyMap, config: Mapping[str, Any] | None = None) -> bool:
    """Whether the worker (`lora`, `sim` or a command template) takes a checkpoint to resume
    from in either way: as the `{resume}` argument or as the resume key."""
    return takes_resume_argument(worker) or takes_resume_key(worker, keys, config)


def checkpoint_marker(worker: str) -> str | None:
    """The file that makes a folder a whole checkpoint of `worker`; None where orch does not
    know it (a script's own: the Trainer's trainer_state.json rule, executors.checkpoints)."""
    return _MARKERS.get(worker)


def takes_resume_argument(worker: str) -> bool:
    """A command template that uses `{resume}`."""
    if worker in RESUMING_WORKERS or worker in NOT_RESUMING_WORKERS:
        return False
    try:
        return RESUME_PLACEHOLDER in parse_template(worker).names
    except PlanError:
        return False


def takes_resume_key(worker: str, keys: KeyMap, config: Mapping[str, Any] | None = None) -> bool:
    """Whether the resume key belongs in the worker's config: ours that read it; a template that
    uses it as a `{cfg.KEY}` value; a template that passes `{config}` when the suite's `keys:`
    names the resume key, or the job's `config` already holds it (a script that does not know
    the key, one that opted in only through `{resume}` included, must never find it there)."""
    if worker in RESUMING_WORKERS:
        return True
    if worker in NOT_RESUMING_WORKERS:
        return False
    try:
        template = parse_template(worker)
    except PlanError:
        return False
    script_key = keys.script_key(RESUME_KEY)
    # a `{cfg.KEY?--flag}` of the key is not enough: a flag cannot carry the path
    if script_key in template.value_keys:
        return True
    if not template.reads_config:
        return False
    return RESUME_KEY in keys.names or (config is not None and script_key in config)


def resume_config(config: Mapping[str, Any], keys: KeyMap, checkpoint: str) -> dict[str, Any]:
    """The attempt's config with the checkpoint under the script's name for the resume key."""
    return {**config, keys.script_key(RESUME_KEY): checkpoint}


class PastAttemptView(Protocol):
    @property
    def n(self) -> int: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def worker(self) -> str | None: ...


_DEATHS = frozenset({"oom", "host_oom", "group_oom", "lost", "cancelled", "pruned"})
_DEATH_REASONS = ("hung", "killed by")  # a FAILED outcome that is a death, not the run's own failure


def ended_in_failure(outcome: str | None, reason: str | None) -> bool:
    """The attempt failed on its own (its checkpoints may carry what failed), not by a death."""
    if outcome != "failed":
        return False
    return not (reason or "").startswith(_DEATH_REASONS)


def resumable_attempts(past: Iterable[PastAttemptView], worker: str, fresh_after_attempt: int) -> list[tuple[int, str]]:
    """(n, run dir) of the earlier attempts a new attempt running `worker` may resume from: the
    latest ones back to (not including) the first that failed, ran another command, or is at
    or before `fresh_after_attempt`."""
    usable: list[tuple[int, str]] = []
    for attempt in sorted(past, key=lambda a: a.n, reverse=True):
        other_command = attempt.worker is not None and attempt.worker != worker
        if attempt.n <= fresh_after_attempt or other_command or ended_in_failure(attempt.outcome, attempt.reason):
            break
        usable.append((attempt.n, attempt.run_dir))
    return usable
