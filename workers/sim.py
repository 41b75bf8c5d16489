"""Simulated training worker: holds simulated GPU memory as a real run would, then reports.

`python -m workers.sim --config RUN_DIR/config.yaml --run-dir RUN_DIR`

A simulated GPU is a directory `$ORCH_SIM_DIR/gpu<index>/`. Every process holding memory on it
has a file `<pid>.json` = {pid, used_mib, create_time}; memory held by processes orch did not
start is in `foreign-<name>.json` files (pid 0). A holder counts while its process is alive with
the same create_time, so a reused pid cannot keep a dead worker's memory "allocated". Card sizes
come from `$ORCH_SIM_GPUS` ("7x24GiB" or "24GiB,24GiB,48GiB"). That file protocol is
`orchestrator.gpu.sim_files`, which the probe in orchestrator.gpu.sim reads too; of orchestrator
this module imports only standard-library modules (that one and `rundir_files`), so it
starts fast.

Memory model of the worker (all from the config):
    base   = sim_base_gib (default 0.4 x sim_mem_gib): weights, LoRA state, CUDA context
    acts   = (sim_mem_gib - base) x batch_size / sim_reference_batch
             sim_reference_batch defaults to batch_size x gradient_accumulation_steps, the
             effective batch, which the degradation ladder keeps constant while it halves
             batch_size
    logits = LOGITS_SHARE of acts; `logits_to_keep: k` keeps k / SIM_SEQ_LEN of them
    rest   = acts - logits; `gradient_checkpointing: true` keeps CHECKPOINT_FACTOR of them
    peak   = base + rest + logits
`num_data_workers` costs host memory only, so it does not change the simulated peak.
The worker allocates the peak in RAMP_STEPS equal steps over sim_ramp_s (like a model load),
each under an fcntl lock on the GPU dir; a step that would overfill the card fails with torch's
out-of-memory message, result.json status "oom" and exit code 3; so does a step past the MPS fence
of a one-GPU worker (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, set by `--mps`, simulated on simulated
cards), as a fenced client fails. `sim_startup_s: S` first holds
the base alone for S seconds (imports, tokenising: a real trainer's start-up, before its first
step), then ramps the rest; `sim_exit_s: E` holds the peak E seconds after the last step (saving
the adapter) before the worker writes its result and exits.

`sim_fail` makes an attempt fail on purpose:
    error     a RuntimeError halfway through training
    hang      heartbeats stop halfway through training (the process lives on)
    host_oom  host RAM runs out when the data loader starts, at the first training step, while
              `num_data_workers` is above `sim_host_max_workers` (default 0; the ladder's
              `data_workers: 0` rung brings it down to there). `sim_host_oom_kind` picks torch's
              wording: `allocator` (default), DefaultCPUAllocator's "can't allocate memory";
              `dataloader`, "DataLoader worker (pid(s) N) exited unexpectedly" raised from "...
              is killed by signal: Killed." (the kernel OOM-killed a loader process).
`sim_fail_seeds: [4, 7]` limits `sim_fail: error` to those seeds (the others succeed), as a
sweep where some seeds diverge or crash.
error and host_oom are Python exceptions, reported as a real worker does: the traceback on
stderr, result.json status "failed" with the exception's last line, exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import yaml

from orchestrator.gpu.sim_files import (
    HOST_DIR,
    gpu_dir,
    gpu_lock,
    parse_sizes_mib,
    read_holders,
    sim_uuid,
)
from orchestrator.rundir_files import write_json
from workers import harness, sim_curves

LOGITS_SHARE = 0.25
SIM_SEQ_LEN = 128
CHECKPOINT_FACTOR = 0.4
BASE_SHARE = 0.4
RAMP_STEPS = 4
HEARTBEAT_S = 0.25

HOST_OOM_KINDS = ("allocator", "dataloader")
HOST_BYTES_PER_WORKER = 2 * 1024**3  # one data worker's prefetched batches, shown in the message
ENOMEM = 12


# The simulated-GPU file protocol (card dirs, locks, holder files) is orchestrator.gpu.sim_files.


def format_size(mib: float) -> str:
    """torch's format_size: bytes below 1 MiB, MiB below 1 GiB, else GiB, two decimals."""
    if mib * 1024 * 1024 <= 1048576:
        return f"{int(mib * 1024 * 1024)} bytes"
    if mib < 1024:
        return f"{mib:.2f} MiB"
    return f"{mib / 1024:.2f} GiB"


def oom_message(request_mib: float, total_mib: int, free_mib: float, own_mib: float) -> str:
    """The text of torch's caching-allocator OOM (torch >= 2.1, device index as the process sees it)."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {format_size(request_mib)}. "
        f"GPU 0 has a total capacity of {format_size(total_mib)} of which "
        f"{format_size(max(0.0, free_mib))} is free. Including non-PyTorch memory, this process has "
        f"{format_size(own_mib)} memory in use. Of the allocated memory {format_size(own_mib)} is "
        "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def base_gib_of(config: dict[str, Any]) -> float:
    """The base of the memory model: what the worker holds through its start-up (`sim_startup_s`)."""
    return float(config.get("sim_base_gib", BASE_SHARE * float(config["sim_mem_gib"])))


def base_mib_of(config: dict[str, Any]) -> int:
    return round(base_gib_of(config) * 1024)


def predicted_peak_mib(config: dict[str, Any]) -> int:
    """The memory model of the module docstring."""
    peak_gib = float(config["sim_mem_gib"])
    base_gib = base_gib_of(config)
    batch = int(config.get("batch_size", 1))
    accum = int(config.get("gradient_accumulation_steps", 1) or 1)
    reference = int(config.get("sim_reference_batch") or batch * accum)
    acts_gib = max(0.0, peak_gib - base_gib) * batch / max(1, reference)
    logits_gib = LOGITS_SHARE * acts_gib
    rest_gib = acts_gib - logits_gib
    keep = config.get("logits_to_keep")
    if keep:
        logits_gib *= min(1.0, int(keep) / SIM_SEQ_LEN)
    if config.get("gradient_checkpointing"):
        rest_gib *= CHECKPOINT_FACTOR
    return round((base_gib + rest_gib + logits_gib) * 1024)


def failing_seed(config: dict[str, Any]) -> bool:
    """Whether `sim_fail` applies to this attempt's seed (every seed without `sim_fail_seeds`)."""
    seeds = config.get("sim_fail_seeds")
    return seeds is None or int(config.get("seed", os.environ.get("ORCH_SEED", 0)) or 0) in seeds


def check_sim_fail(config: dict[str, Any]) -> None:
    """Refuse sim_fail settings that would otherwise be ignored silently (ValueError)."""
    seeds = config.get("sim_fail_seeds")
    if seeds is not None and not (isinstance(seeds, list) and all(type(s) is int for s in seeds)):
        raise ValueError(f"sim_fail_seeds must be a list of seeds (integers), got {seeds!r}")
    if config.get("sim_fail") != "host_oom":
        return
    kind = config.get("sim_host_oom_kind", "allocator")
    if kind not in HOST_OOM_KINDS:
        raise ValueError(
            f"sim_host_oom_kind must be one of {', '.join(HOST_OOM_KINDS)}, got {kind!r}"
        )
    for key in ("sim_host_max_workers", "num_data_workers"):
        value = config.get(key, 0)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ValueError(f"{key} must be an integer >= 0, got {value!r}")


def host_oom_error(config: dict[str, Any], loader_pid: int) -> RuntimeError | None:
    """The exception torch raises when the data workers need more host RAM than there is:
    `sim_fail: host_oom` with more than `sim_host_max_workers` of them; None otherwise.
    `loader_pid` is the data-loader process named in the `dataloader` wording."""
    if config.get("sim_fail") != "host_oom":
        return None
    workers = int(config.get("num_data_workers") or 0)
    if workers <= int(config.get("sim_host_max_workers") or 0):
        return None
    if config.get("sim_host_oom_kind", "allocator") == "dataloader":
        # torch's loader raises this from the worker's death, so the traceback shows both.
        error = RuntimeError(f"DataLoader worker (pid(s) {loader_pid}) exited unexpectedly")
        error.__cause__ = RuntimeError(
            f"DataLoader worker (pid {loader_pid}) is killed by signal: Killed. "
        )
        return error
    return RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
        f"you tried to allocate {workers * HOST_BYTES_PER_WORKER} bytes. "
        f"Error code {ENOMEM} (Cannot allocate memory)"
    )


def resolve_gpu(visible: str, sizes_mib: list[int]) -> int:
    """Index of the simulated GPU named by CUDA_VISIBLE_DEVICES (a uuid or an index; first one)."""
    first = visible.split(",")[0].strip()
    if first.isdigit() and int(first) < len(sizes_mib):
        return int(first)
    for index in range(len(sizes_mib)):
        if first == sim_uuid(index):
            return index
    raise ValueError(
        f"CUDA_VISIBLE_DEVICES={visible!r} names no simulated GPU ({len(sizes_mib)} exist)"
    )


def mps_fence_mib(env: Mapping[str, str]) -> int | None:
    """The device memory an MPS client may pin (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, `0=8252M` as
    orch sets it, or `0=8G`); None when unfenced or not read."""
    spec = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    match = re.fullmatch(r"\s*0=(\d+)([MG])\s*", spec)
    if match is None:
        return None
    return int(match.group(1)) * (1024 if match.group(2) == "G" else 1)


class SimAllocation:
    """This process's holding file on one simulated GPU. Under an MPS fence (simulated `--mps`)
    it never holds more than the fence, as a fenced client is held."""

    def __init__(self, directory: Path, total_mib: int, fence_mib: int | None = None) -> None:
        self.directory = directory
        self.total_mib = total_mib
        self.fence_mib = fence_mib
        self.path = directory / f"{os.getpid()}.json"
        self.create_time = psutil.Process().create_time()
        self.used_mib = 0
        self.peak_mib = 0

    def allocate(self, request_mib: int) -> str | None:
        """Take `request_mib` more, or return torch's OOM message when the card (or the fence) is
        too full."""
        with gpu_lock(self.directory):
            holders, _ = read_holders(self.directory)
            others_mib = sum(mib for pid, mib in holders if pid != os.getpid())
            free_mib = self.total_mib - others_mib - self.used_mib
            if self.fence_mib is not None:
                free_mib = min(free_mib, self.fence_mib - self.used_mib)
            if request_mib > free_mib:
                message = oom_message(request_mib, self.total_mib, free_mib, self.used_mib)
                # The process is about to die: free its memory before a neighbour's next step,
                # so two workers that overfill a card do not both fail.
                self.release()
                return message
            self.used_mib += request_mib
            self.peak_mib = max(self.peak_mib, self.used_mib)
            write_json(
                self.path,
                {"pid": os.getpid(), "used_mib": self.used_mib, "create_time": self.create_time},
                parents=True,
            )
        return None

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.used_mib = 0


def pseudo_accuracy(seed: int, config: dict[str, Any], split: str = "test") -> float:
    """Deterministic per (seed, data, split): the same job gives the same result on every attempt."""
    key = f"{seed}:{config.get('data', '')}:{config.get('sim_mem_gib')}" + ("" if split == "test" else f":{split}")
    digest = sum((i + 1) * ord(c) for i, c in enumerate(key)) % 1000
    return round(0.7 + 0.2 * digest / 1000, 4)


def resolve_gpus(visible: str, sizes_mib: list[int]) -> list[int]:
    """Indices of every simulated GPU CUDA_VISIBLE_DEVICES names, in its order."""
    return [resolve_gpu(item, sizes_mib) for item in visible.split(",") if item.strip()] or [
        resolve_gpu("0", sizes_mib)
    ]


class GangAllocation(SimAllocation):
    """One process holding the same memory on each of its GPUs, as the ranks of a multi-GPU job
    each hold theirs: an allocation that does not fit on any one card is the job's OOM."""

    def __init__(self, parts: list[SimAllocation]) -> None:
        super().__init__(parts[0].directory, parts[0].total_mib)
        self.parts = parts

    def allocate(self, request_mib: int) -> str | None:
        for part in self.parts:
            message = part.allocate(request_mib)
            if message is not None:
                self.release()
                return message
        self.peak_mib = max(part.peak_mib for part in self.parts)
        return None

    def release(self) -> None:
        for part in self.parts:
            part.release()


def hold_host(config: dict[str, Any]) -> SimAllocation | None:
    """Take `sim_host_gib` of the simulated host RAM ($ORCH_SIM_HOST, e.g. "32GiB"); more than
    is free fails as torch's CPU allocator does (a host OOM)."""
    want_gib = config.get("sim_host_gib")
    total_spec = os.environ.get("ORCH_SIM_HOST", "")
    if not want_gib or not total_spec.strip():
        return None
    directory = Path(os.environ["ORCH_SIM_DIR"]) / HOST_DIR
    directory.mkdir(parents=True, exist_ok=True)
    host = SimAllocation(directory, parse_sizes_mib(total_spec)[0])
    want_mib = round(float(want_gib) * 1024)
    if host.allocate(want_mib) is not None:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
            f"you tried to allocate {want_mib * 1024 * 1024} bytes. Error code {ENOMEM} (Cannot allocate memory)"
        )
    return host


def run(config: dict[str, Any], run_dir: Path) -> int:
    sizes_mib = parse_sizes_mib(os.environ["ORCH_SIM_GPUS"])
    indices = resolve_gpus(os.environ.get("CUDA_VISIBLE_DEVICES", "0"), sizes_mib)
    state = Path(os.environ["ORCH_SIM_DIR"])
    fence = mps_fence_mib(os.environ) if len(indices) == 1 else None  # MPS fences one-GPU workers only
    parts = [SimAllocation(gpu_dir(state, i), sizes_mib[i], fence) for i in indices]
    alloc = parts[0] if len(parts) == 1 else GangAllocation(parts)
    host: list[SimAllocation] = []

    def on_term(signum: int, _frame: object) -> None:
        alloc.release()
        for held in host:
            held.release()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        held_host = hold_host(config)  # weights and data loaded into host RAM first
        host.extend([held_host] if held_host else [])
        return train(config, run_dir, alloc)
    finally:
        alloc.release()
        for held in host:
            held.release()


def train(config: dict[str, Any], run_dir: Path, alloc: SimAllocation) -> int:
    started = time.monotonic()
    peak_mib = predicted_peak_mib(config)
    ramp_s = float(config.get("sim_ramp_s", 2.0))
    step_mib = [peak_mib // RAMP_STEPS] * RAMP_STEPS
    step_mib[-1] += peak_mib - sum(step_mib)
    print(
        f"sim worker: pid {os.getpid()}, peak {peak_mib} MiB on {alloc.directory.name}", flush=True
    )
    startup_s = float(config.get("sim_startup_s", 0.0))
    if startup_s > 0:  # the base alone through the start-up, then the rest in the ramp
        base_mib = min(peak_mib, base_mib_of(config))
        step_mib = [base_mib, *([(peak_mib - base_mib) // RAMP_STEPS] * RAMP_STEPS)]
        step_mib[-1] += peak_mib - sum(step_mib)
    for index, request_mib in enumerate(step_mib):
        message = alloc.allocate(request_mib)
        if message is not None:
            print(message, file=sys.stderr, flush=True)
            harness.write_result(
                run_dir,
                harness.STATUS_OOM,
                error=message,
                peak_mem_mib=alloc.peak_mib,
                seconds=time.monotonic() - started,
            )
            return harness.EXIT_OOM
        time.sleep(startup_s if startup_s > 0 and index == 0 else ramp_s / RAMP_STEPS)

    heartbeat = harness.Heartbeat(run_dir)
    total_steps = max(1, int(float(config.get("sim_seconds", 5.0)) / HEARTBEAT_S))
    batch = int(config.get("batch_size", 1))
    fail = config.get("sim_fail")
    # The data loader starts its workers with the first batch: that is when host RAM runs out.
    host_error = host_oom_error(config, loader_pid=os.getpid() + 1)
    if host_error is not None:
        raise host_error
    seed = int(config.get("seed", os.environ.get("ORCH_SEED", 0)) or 0)
    train_started = time.monotonic()
    for step in range(1, total_steps + 1):
        if fail == "hang" and step > total_steps // 2:
            while True:  # stops heartbeating, like a deadlocked data loader
                time.sleep(3600)
        if fail == "error" and step > total_steps // 2 and failing_seed(config):
            raise RuntimeError("simulated failure in the training loop (sim_fail: error)")
        time.sleep(HEARTBEAT_S)
        elapsed_s = time.monotonic() - train_started
        heartbeat.beat(
            step,
            total_steps,
            loss=sim_curves.sim_loss(step, config, seed),
            samples_per_s=round(step * batch / elapsed_s, 2),
            peak_mem_mib=alloc.peak_mib,
            **sim_curves.val_curve(config, step),  # with `sim_best_lr`: val_accuracy
        )
    time.sleep(float(config.get("sim_exit_s", 0.0)))
    harness.write_result(
        run_dir,
        harness.STATUS_SUCCEEDED,
        metrics={
            "test": sim_curves.final_test(config, total_steps, pseudo_accuracy(seed, config)),
            "val": sim_curves.final_val(config, total_steps, pseudo_accuracy(seed, config, "val")),
        },
        best_step=total_steps,
        peak_mem_mib=alloc.peak_mib,
        steps=total_steps,
        seconds=time.monotonic() - started,
    )
    print(f"sim worker: done, {total_steps} steps", flush=True)
    return harness.EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workers.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        config = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
        if not isinstance(config, dict) or "sim_mem_gib" not in config:
            raise ValueError(f"{args.config}: a mapping with sim_mem_gib is required")
        check_sim_fail(config)
        for name in ("ORCH_SIM_DIR", "ORCH_SIM_GPUS"):
            if not os.environ.get(name):
                raise ValueError(f"{name} is not set: the sim worker needs the simulated GPUs")
        resolve_gpus(
            os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
            parse_sizes_mib(os.environ["ORCH_SIM_GPUS"]),
        )
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        harness.write_result(args.run_dir, harness.STATUS_CONFIG_ERROR, error=str(exc))
        return harness.EXIT_CONFIG_ERROR
    try:
        return run(config, args.run_dir)
    except Exception as exc:
        traceback.print_exc()
        harness.write_result(
            args.run_dir, harness.STATUS_FAILED, error=f"{type(exc).__name__}: {exc}"
        )
        return harness.EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
