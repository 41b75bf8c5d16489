"""Periodic checkpoints of a training run, and resuming from one.

A checkpoint is a folder `checkpoint-N` (N the optimizer step, Hugging Face's convention, which
orch looks for) in the run dir, holding what the loop needs to go on as if never stopped:
- `lora.pt`: the LoRA (trainable) weights; `best.pt`: the best-on-val weights so far;
- `optimizer.pt`: AdamW's state; `rng.pt`: torch's RNG states (LoRA dropout draws from them);
- `state.json`: the step, the epoch, the examples of the epoch's (seed, epoch) permutation
  consumed so far, the losses, the best validation scores, and the settings that must match
  for a resume to be the same run (seed, data, effective batch, ...).

Written to a temp folder and renamed, and removed by renaming it aside first, so a
`checkpoint-N` folder is always whole (orch resumes only from one that holds `state.json`,
written last); only the newest is kept, and none once the run has finished. A resumed run
skips the consumed examples of the permutation, so it continues with the same optimizer steps
whatever its micro-batch: the ladder halves the batch and doubles the accumulation, and a
checkpoint is taken at a step's end, a multiple of the effective batch.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from workers.lora.config import ConfigError, RunConfig

CHECKPOINT_NAME = re.compile(r"^checkpoint-([0-9]+)$")
STATE_FILE = "state.json"  # written last: orch takes a folder for a checkpoint only with it
_REMOVING = ".removing"  # suffix of a checkpoint folder renamed aside to be deleted
MAX_STATE_BYTES = 64 * 1024 * 1024  # losses of a very long run, and nothing more


@dataclass
class LoopState:
    """Where the training loop is, between two optimizer steps."""

    step: int = 0
    epoch: int = 0  # 0-based
    consumed_in_epoch: int = 0  # examples of this epoch's permutation already trained on
    samples_seen: int = 0
    train_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    best_score: float = -math.inf
    best_step: int = 0
    best_val: dict[str, float] = field(default_factory=dict)


def run_identity(config: RunConfig) -> dict[str, Any]:
    """Settings a resumed run must share with the run that wrote the checkpoint. The micro-batch,
    accumulation, checkpointing, data workers and logits_to_keep may differ (the ladder's rungs)."""
    return {
        "model": config.model, "peft": config.peft, "data": config.data, "seed": config.seed,
        "effective_batch_size": config.effective_batch_size, "learning_rate": config.learning_rate,
        "num_epochs": config.num_epochs, "max_steps": config.max_steps, "prec": config.prec,
        "max_seq_len": config.max_seq_len, "eval_every_steps": config.eval_every_steps,
        "weight_decay": config.weight_decay, "lr_scheduler": config.lr_scheduler,
        "warmup_steps": config.warmup_steps, "warmup_ratio": config.warmup_ratio,
        "max_grad_norm": config.max_grad_norm,
    }  # fmt: skip


def trainable(model: Any) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(
    run_dir: Path, loop: LoopState, model: Any, optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler, best_weights: dict[str, torch.Tensor],
    config: RunConfig, params: dict[str, torch.Tensor] | None = None,
    check_stopped: Callable[[], None] = lambda: None,
) -> Path:  # fmt: skip
    """Write `run_dir/checkpoint-<step>` atomically and remove the older ones; returns its path.
    `check_stopped` raises where the job was stopped while it saved: the older checkpoints stay
    then (orch may have picked one of them for the next attempt meanwhile)."""
    final = run_dir / f"checkpoint-{loop.step}"
    partial = run_dir / f".checkpoint-{loop.step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=0o700)
    state = {**asdict(loop), "best_score": _finite_or_none(loop.best_score), "identity": run_identity(config),
             "python_rng": _jsonable(random.getstate())}  # fmt: skip
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    weights = {name: p.detach().cpu() for name, p in (params or trainable(model)).items()}
    _save(partial / "lora.pt", weights)
    _save(partial / "best.pt", {name: v.detach().cpu() for name, v in best_weights.items()})
    _save(partial / "optimizer.pt", optimizer.state_dict())
    _save(partial / "scheduler.pt", scheduler.state_dict())  # where warm-up and decay stand
    _save(partial / "rng.pt", rng)
    _write_synced(partial / STATE_FILE, json.dumps(state, sort_keys=True).encode())
    _fsync_dir(partial)
    if final.exists():
        _remove_aside(final)
    os.rename(partial, final)
    _fsync_dir(run_dir)
    check_stopped()
    remove_checkpoints(run_dir, below_step=loop.step)
    return final


def remove_checkpoints(run_dir: Path, below_step: int | None = None) -> None:
    """Delete this run's checkpoints (those before `below_step`; all when None): a finished run
    needs none, and a sweep of hundreds of runs would keep tens of GB of them. Removals an
    earlier run of this dir left half-done go too."""
    for folder in run_dir.iterdir():
        if folder.name.startswith(".checkpoint-") and folder.name.endswith(_REMOVING):
            shutil.rmtree(folder, ignore_errors=True)
            continue
        match = CHECKPOINT_NAME.match(folder.name)
        if match is None or folder.is_symlink() or not folder.is_dir():
            continue
        if below_step is None or int(match.group(1)) < below_step:
            _remove_aside(folder)


def _remove_aside(folder: Path) -> None:
    """Rename `folder` out of the checkpoint-N names, then delete it: a kill during the deletion
    leaves a hidden folder, never a checkpoint-N that lacks some of its files."""
    aside = folder.with_name(f".{folder.name}{_REMOVING}")
    shutil.rmtree(aside, ignore_errors=True)
    try:
        os.rename(folder, aside)
    except OSError:
        return  # gone already, or not ours to move: left as it is
    shutil.rmtree(aside, ignore_errors=True)


def load_checkpoint(
    path: Path, model: Any, optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler, config: RunConfig,
    params: dict[str, torch.Tensor] | None = None,
) -> tuple[LoopState, dict[str, torch.Tensor]]:  # fmt: skip
    """Restore the weights, optimizer and RNG from `path`; returns the loop's state and the
    best-on-val weights. ConfigError when it is not a checkpoint of this run. `params`: the job's
    trainable parameters by their names alone (default: the model's trainable ones)."""
    state_path = path / STATE_FILE
    if path.is_symlink() or not path.is_dir() or not state_path.is_file() or state_path.is_symlink():
        raise ConfigError(f"resume_from_checkpoint {path}: not a checkpoint folder of this worker (no {STATE_FILE})")
    if state_path.stat().st_size > MAX_STATE_BYTES:
        raise ConfigError(f"resume_from_checkpoint {path}: {STATE_FILE} is larger than {MAX_STATE_BYTES} bytes")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        identity, python_rng = state.pop("identity"), state.pop("python_rng")
        loop = LoopState(**state)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"resume_from_checkpoint {path}: unreadable {STATE_FILE} ({exc})") from None
    expected = json.loads(json.dumps(run_identity(config)))  # as JSON would give it back
    differing = sorted(k for k in expected if identity.get(k) != expected[k])
    if differing:
        raise ConfigError(f"resume_from_checkpoint {path} was written by a run with other settings: "
                          f"{', '.join(differing)} differ")  # fmt: skip
    loop.best_score = -math.inf if loop.best_score is None else float(loop.best_score)
    params = trainable(model) if params is None else params
    device = next(iter(params.values())).device
    weights = _load(path / "lora.pt")
    if set(weights) != set(params) or any(weights[k].shape != params[k].shape for k in params):
        raise ConfigError(f"resume_from_checkpoint {path}: its LoRA weights do not fit this model")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    best = {name: value.to(device) for name, value in _load(path / "best.pt").items()}
    optimizer.load_state_dict(_load(path / "optimizer.pt"))
    scheduler.load_state_dict(_load(path / "scheduler.pt"))
    rng = _load(path / "rng.pt")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    random.setstate(_tuples(python_rng))
    return loop, best


def _save(path: Path, payload: Any) -> None:
    torch.save(payload, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load(path: Path) -> Any:
    if path.is_symlink() or not path.is_file():
        raise ConfigError(f"resume_from_checkpoint: {path} is missing")
    try:  # weights_only: tensors and plain containers, never arbitrary pickled objects
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError) as exc:  # EOFError: cut short
        raise ConfigError(f"resume_from_checkpoint: cannot read {path}: {exc}".splitlines()[0]) from None


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, tuple | list) else value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
