"""Entry point: run one training attempt and report it through the worker file protocol.

Exit codes: 0 succeeded, 1 failed, 3 CUDA out of memory, 4 invalid configuration; through a warm
process (`share_base`) also 143 stopped (cancelled or its client gone: no result.json, as a worker
ended by SIGTERM) and 75 a fused group's out of memory (the stderr line `orch: fused group of N
members ran out of memory`; orch requeues the job uncounted with a smaller group).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.rundir_files import RunDir
from workers.harness import (
    EXIT_CONFIG_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_OOM,
    STATUS_CONFIG_ERROR,
    STATUS_FAILED,
    STATUS_OOM,
    STATUS_SUCCEEDED,
    Heartbeat,
    write_result,
)
from workers.lora.config import ConfigError, RunConfig, load_config
from workers.lora.data import find_source, parse_data_name, test_is_validation
from workers.lora.provenance import torch_record, worker_record
from workers.lora.resume_guard import ResumeBlocked, resume_point, wait_until_stopped
from workers.lora.share import digest_of

SHARE_BASE_VAR = "ORCH_SHARE_BASE"  # set by orch for a suite's `share_base` other than off

# Messages of device out-of-memory errors (torch, CUDA runtime, cuBLAS, Triton, NCCL).
OOM_SIGNATURES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "Triton Error [CUDA]: out of memory",
    "Cuda failure 'out of memory'",
)


def is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return any(signature in str(exc) for signature in OOM_SIGNATURES)


def check_inputs(config: RunConfig) -> None:
    """Fail fast, before importing torch, on what a config can get wrong about data."""
    task = parse_data_name(config.data).task
    if config.data_dir is None:
        raise ConfigError("no data directory: set 'data_dir' in the config or ORCH_DATA_DIR")
    find_source(config.data_dir, task)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


EXIT_STOPPED = 143  # as a process ended by SIGTERM


class JobStopped(Exception):
    """A warm process was told to stop the job it runs (a cancel, or its client gone)."""


# Exceptions a job brings on itself: the warm process that ran it is still usable afterwards.
# Anything else (a CUDA error, a bug) may have left it broken: it exits and is replaced.
OWN_ERRORS: tuple[type[BaseException], ...] = (ConfigError, OSError, JobStopped)


@dataclass(frozen=True)
class AttemptEnd:
    exit_code: int
    process_usable: bool  # False: an error not the job's own, the process may be broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.lora", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="default: RUN_DIR/config.yaml")
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path: Path = args.config or RunDir(run_dir).config
    if os.environ.get(SHARE_BASE_VAR, "off") != "off":
        from workers.lora.client import run_shared

        return run_shared(run_dir, config_path)
    return run_attempt(run_dir, config_path).exit_code


def run_attempt(
    run_dir: Path, config_path: Path, cache: Any = None, heartbeat: Heartbeat | None = None,
    shared: dict[str, Any] | None = None,
) -> AttemptEnd:  # fmt: skip
    """One attempt in this process: train and write result.json. `cache`: a warm process's
    workers.lora.base_cache.BaseCache; `heartbeat`: its stoppable one; `shared`: what
    result.json says of the sharing (default: `share_base: sequential` in a warm process)."""
    attempt = Attempt(run_dir, config_path)
    try:
        config = attempt.prepare()
        from workers.lora import train  # torch is imported only once the config is known good

        outcome = train.run(config, run_dir, heartbeat or Heartbeat(run_dir), log, cache, attempt.digests,
                            keep_checkpoints=True)  # fmt: skip
    except Exception as exc:
        return attempt.failed(exc)
    if shared is None:
        shared = {"share_base": "sequential"} if cache is not None else {}
    return attempt.succeeded(outcome, shared)


class Attempt:
    """What an attempt reports around its training (one job alone, or a member of a fused
    group): its config read and checked, provenance, and result.json at the end."""

    def __init__(self, run_dir: Path, config_path: Path) -> None:
        self.run_dir, self.config_path = run_dir, config_path
        self.started_s = time.monotonic()
        self.provenance: dict[str, Any] = {}
        self.digests = ("", "")
        self.config: RunConfig | None = None
        self.resumed: dict[str, Any] = {}  # what result.json says of a replaced checkpoint

    def prepare(self) -> RunConfig:
        config = load_config(self.config_path)
        for warning in config.warnings:
            log(f"warning: {warning}")
        check_inputs(config)
        if test_is_validation(config.data):
            log(f"warning: {config.data} scores test on the validation split that also picks the "
                "best epoch; result.json says test_is_val (use glue-tvt_ for a held-out test)")  # fmt: skip
        config, self.resumed = _resume_point(config)
        self.provenance = worker_record(config)
        self.digests = (digest_of(self.provenance.get("model")), digest_of(self.provenance.get("data")))
        self.config = config
        return config

    def failed(self, exc: BaseException) -> AttemptEnd:
        """The end of an attempt that raised `exc` (its result.json, unless stopped)."""
        run_dir = self.run_dir
        if isinstance(exc, JobStopped):
            log(f"stopped: {exc}")  # orch ends the attempt; no result.json of a job cut short
            return AttemptEnd(EXIT_STOPPED, True)
        if isinstance(exc, ConfigError):
            log(f"config error: {exc}")
            write_result(
                run_dir, STATUS_CONFIG_ERROR, error=str(exc), seconds=time.monotonic() - self.started_s
            )
            return AttemptEnd(EXIT_CONFIG_ERROR, True)
        traceback.print_exception(exc)  # the log is the researcher's: keep the whole story there
        memory: dict[str, Any] = {}
        if "workers.lora.train" in sys.modules:
            memory = sys.modules["workers.lora.train"].peak_memory(
                sys.modules["workers.lora.train"].select_device()
            )
        oom = is_oom(exc)
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        write_result(
            run_dir, STATUS_OOM if oom else STATUS_FAILED, error=error,
            seconds=time.monotonic() - self.started_s, **memory,
            provenance=(self.provenance | torch_record()) or None,
        )  # fmt: skip
        own = oom or isinstance(exc, OWN_ERRORS) or type(exc).__name__ in OWN_ERROR_NAMES
        return AttemptEnd(EXIT_OOM if oom else EXIT_FAILED, own)

    def succeeded(self, outcome: Any, shared: dict[str, Any]) -> AttemptEnd:
        assert self.config is not None
        write_result(
            self.run_dir,
            STATUS_SUCCEEDED,
            metrics=outcome.metrics,
            samples_per_s=round(outcome.samples_per_s, 3),
            steps=outcome.steps,
            seconds=round(time.monotonic() - self.started_s, 3),
            best_step=outcome.best_step,
            final_loss=outcome.losses[-1] if outcome.losses else None,
            longest_tokens=outcome.longest_tokens,
            examples=outcome.examples,
            truncated=outcome.truncated,
            loss_summary=outcome.loss_summary,
            provenance=self.provenance | torch_record(),
            test_is_val=test_is_validation(self.config.data),
            **outcome.settings,
            **outcome.memory,
            **shared,
            **self.resumed,
        )
        # finished and recorded: nothing left to resume. Removed only now, so a kill during the
        # clean-up leaves a succeeded run, never one that must resume from a checkpoint
        from workers.lora.checkpoint import remove_checkpoints

        remove_checkpoints(self.run_dir)
        log(f"done: test {outcome.metrics['test']} (best val at step {outcome.best_step})")
        return AttemptEnd(EXIT_OK, True)


def _resume_point(config: RunConfig) -> tuple[RunConfig, dict[str, Any]]:
    """The config to train with, once the job that wrote its checkpoint has stopped (a warm
    process may still train it after its client was killed), and what result.json says where
    that checkpoint had to be replaced by a later one of the same run (resume_guard)."""
    named = config.resume_from_checkpoint
    if named is None:
        return config, {}
    try:
        wait_until_stopped(named.parent, os.environ, log)
        point = resume_point(named)
    except ResumeBlocked as exc:
        raise ConfigError(f"resume_from_checkpoint {named}: {exc}") from None
    if point.note is None:
        return config, {}
    log(f"warning: {point.note}")
    used = replace(config, resume_from_checkpoint=point.checkpoint)
    return used, {"resumed_from_checkpoint": str(point.checkpoint), "resume_note": point.note}


# By name, so that this module need not import torch: a diverged loss, a model folder that could
# not be read are the job's own.
OWN_ERROR_NAMES = frozenset({"NonFiniteLoss", "ModelLoadError"})


if __name__ == "__main__":
    raise SystemExit(main())
