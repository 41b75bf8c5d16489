"""A suite's `keys:` mapping: orch's ladder knobs under the names the user's script reads. Pure.

The ladder reasons about `batch_size`, `gradient_accumulation_steps`, `gradient_checkpointing`,
`logits_to_keep` and `num_data_workers`; `resume_from_checkpoint` (not a ladder knob) is
where a resumed attempt finds its checkpoint. A Hugging Face `TrainingArguments` YAML names the
batch `per_device_train_batch_size`; with `keys: {batch_size: per_device_train_batch_size}` the
ladder reads and halves that key instead, and keeps batch x accumulation under the script's own
names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import PlanError

# orch's knob -> its config key; the short names match the ladder's actions.
KNOBS: dict[str, str] = {
    "batch_size": "batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "accumulation": "gradient_accumulation_steps",
    "gradient_checkpointing": "gradient_checkpointing",
    "checkpointing": "gradient_checkpointing",
    "logits_to_keep": "logits_to_keep",
    "num_data_workers": "num_data_workers",
    "data_workers": "num_data_workers",
    # not a ladder knob: the checkpoint an attempt after a death resumes from (plans/resume.py)
    "resume_from_checkpoint": "resume_from_checkpoint",
}
RESUME_KEY = "resume_from_checkpoint"
_MAX_KEY_CHARS = 128


@dataclass(frozen=True)
class KeyMap:
    """orch config key -> the script's key, for the knobs the suite renames."""

    names: dict[str, str] = field(default_factory=dict)

    def script_key(self, key: str) -> str:
        return self.names.get(key, key)

    def script_keys(self) -> set[str]:
        """Every key the ladder's knobs use under this mapping."""
        return {self.script_key(key) for key in set(KNOBS.values())}

    def to_orch(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config as the ladder reads it: renamed knobs under orch's names."""
        if not self.names:
            return dict(config)
        renamed = {script: orch for orch, script in self.names.items()}
        view: dict[str, Any] = {}
        for key, value in config.items():
            if key in renamed:
                view[renamed[key]] = value
            elif key not in self.names:  # orch's name of a renamed knob means something else here
                view[key] = value
        return view

    def to_script(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Ladder overrides (orch's names) as the script's keys, in the same order."""
        return {self.script_key(key): value for key, value in overrides.items()}

    def to_json(self) -> dict[str, str]:
        return dict(self.names)


NO_KEYS = KeyMap()


def parse_keys(raw: Any, where: str) -> KeyMap:
    """A suite's `keys:` mapping (knob: script key); PlanError naming the bad entry."""
    if raw is None:
        return NO_KEYS
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: `keys` must be a mapping of orch knob: your script's key name")
    names: dict[str, str] = {}
    for knob, key in raw.items():
        if knob not in KNOBS:
            raise PlanError(f"{where}: `keys` names unknown knob {knob!r} (known: {', '.join(KNOBS)})")
        if not isinstance(key, str) or not key.strip() or len(key) > _MAX_KEY_CHARS:
            raise PlanError(f"{where}: `keys.{knob}` must be a config key name, not {key!r}")
        orch_key = KNOBS[knob]
        if orch_key in names:
            raise PlanError(f"{where}: `keys` maps {orch_key} twice")
        if key in names.values():
            raise PlanError(f"{where}: `keys` maps two knobs to {key!r}")
        if key != orch_key or orch_key == RESUME_KEY:  # naming the resume key opts {config} in
            names[orch_key] = key
    taken = set(names.values()) & set(KNOBS.values()) - set(names)
    if taken:
        raise PlanError(f"{where}: `keys` maps a knob to {sorted(taken)[0]!r}, another knob's own name")
    return KeyMap(names)
