"""Entry point: run one training attempt and report it through the worker file protocol.

Exit codes: 0 succeeded, 1 failed, 3 CUDA out of memory, 4 invalid configuration.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.lora", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="default: RUN_DIR/config.yaml")
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    started_s = time.monotonic()
    memory: dict[str, Any] = {}
    provenance: dict[str, Any] = {}
    try:
        config = load_config(args.config or RunDir(run_dir).config)
        for warning in config.warnings:
            log(f"warning: {warning}")
        check_inputs(config)
        if test_is_validation(config.data):
            log(f"warning: {config.data} scores test on the validation split that also picks the "
                "best epoch; result.json says test_is_val (use glue-tvt_ for a held-out test)")  # fmt: skip
        provenance = worker_record(config)
        from workers.lora import train  # torch is imported only once the config is known good

        outcome = train.run(config, run_dir, Heartbeat(run_dir), log, keep_checkpoints=True)
    except ConfigError as exc:
        log(f"config error: {exc}")
        write_result(
            run_dir, STATUS_CONFIG_ERROR, error=str(exc), seconds=time.monotonic() - started_s
        )
        return EXIT_CONFIG_ERROR
    except Exception as exc:
        traceback.print_exc()  # the log is the researcher's: keep the whole story there
        if "workers.lora.train" in sys.modules:
            memory = sys.modules["workers.lora.train"].peak_memory(
                sys.modules["workers.lora.train"].select_device()
            )
        oom = is_oom(exc)
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        write_result(
            run_dir, STATUS_OOM if oom else STATUS_FAILED, error=error,
            seconds=time.monotonic() - started_s, **memory,
            provenance=(provenance | torch_record()) or None,
        )  # fmt: skip
        return EXIT_OOM if oom else EXIT_FAILED
    write_result(
        run_dir,
        STATUS_SUCCEEDED,
        metrics=outcome.metrics,
        samples_per_s=round(outcome.samples_per_s, 3),
        steps=outcome.steps,
        seconds=round(time.monotonic() - started_s, 3),
        best_step=outcome.best_step,
        final_loss=outcome.losses[-1] if outcome.losses else None,
        longest_tokens=outcome.longest_tokens,
        examples=outcome.examples,
        truncated=outcome.truncated,
        loss_summary=outcome.loss_summary,
        provenance=provenance | torch_record(),
        test_is_val=test_is_validation(config.data),
        **outcome.settings,
        **outcome.memory,
    )
    # finished and recorded: nothing left to resume. Removed only now, so a kill during the
    # clean-up leaves a succeeded run, never one that must resume from a checkpoint
    from workers.lora.checkpoint import remove_checkpoints

    remove_checkpoints(run_dir)
    log(f"done: test {outcome.metrics['test']} (best val at step {outcome.best_step})")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
