"""Which jobs may train together in one fused LoRA worker process (`share_base: fused`), pure.

A fused group is the jobs of one suite whose resolved configs (at the attempt's ladder level)
agree on what the process loads and how it steps: the model, `prec`, `max_seq_len` and
`gradient_checkpointing`. The worker's own group key (its base key: model digest, dtype,
interpreter, environment) is finer still; the daemon's key only says where a job may join.

What a group's process was measured to take at each size is its members' shapes' records at that
size (`<shape>|fused<k>`, taught by attempts.fused_lessons); `learned_group_peaks` reads them as
the solo path reads a shape's own record (orchestrator.prediction.memory.predict_peak_mib).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.plans.lora_keys import by_long_names
from orchestrator.plans.model import ShareBase
from orchestrator.plans.worker_output import FUSED_MEMBERS_DEFAULT, FUSED_MEMBERS_RANGE
from orchestrator.prediction.families import BATCH_KEYS
from orchestrator.prediction.memory import first_int, predict_peak_mib
from orchestrator.store.peak_source import SourceKind
from orchestrator.store.rows import Job, ShapeMemory

FUSE_KEYS = ("model", "prec", "max_seq_len", "gradient_checkpointing")
MAX_FUSE = FUSED_MEMBERS_RANGE[1]
FUSED_SHAPE_MARK = "|fused"
# What a row costs a tick in the base's own projections, in adapted modules' worth: a Llama
# layer's seven (q, k, v, o, gate, up, down). On one H200 a 1.3B Llama's jobs alone took 15.5 s
# with r 8 on two of them and 24 s on all seven (benchmarks/gpu/README.md): (7 + 7) / (7 + 2).
BASE_MODULE_WORK = 7.0
DEFAULT_TARGETS = 4  # the worker's default q, k, v, o; also a spec given as a file or another pattern
SHAPE_KEY_PARTS = 3  # hash|model|task (orchestrator.prediction.memory.shape_key)
_SIZE = re.compile(r"[1-9][0-9]?", re.ASCII)  # a group size as group_shape_key writes it


def share_base(job: Job) -> ShareBase:
    """The job's `share_base` as its suite stored it (off where absent or not a mode, and for any
    worker but the LoRA worker)."""
    if job.worker != "lora":
        return ShareBase.OFF
    return ShareBase.of(job.worker_output.get("share_base", ShareBase.OFF.value)) or ShareBase.OFF


def shares_base(job: Job) -> bool:
    """Whether the job's attempts may be trained by a warm LoRA worker process (`share_base`)."""
    return share_base(job) is not ShareBase.OFF


def fused(job: Job) -> bool:
    """Whether the job's attempts may train in a fused group (`share_base: fused`)."""
    return share_base(job) is ShareBase.FUSED


def fuse_group(job: Job, suite: str, overrides: Mapping[str, Any], run_alone: bool = False) -> str | None:
    """The fused group of the job's attempt with these ladder `overrides`; None where it trains
    in no fused group (not fused, a multi-GPU job, or run alone by the ladder)."""
    if not fused(job) or job.gpus != 1 or run_alone:
        return None
    config = {**job.config, **overrides}
    return json.dumps([suite, *(config.get(key) for key in FUSE_KEYS)], default=str)


def member_work(config: Mapping[str, Any], peft_spec: Mapping[str, Any] | None) -> float:
    """What a fused member adds to each tick of its group, relative: its micro-batch rows times
    the base's work per row plus one share per adapted module name (`BASE_MODULE_WORK`). Only
    for ordering members into groups of like work; a member's length (its steps) is not in it."""
    rows = first_int(config, BATCH_KEYS) or 1
    spec = by_long_names(peft_spec or {})
    targets = spec.get("target_modules")
    if targets == "all-linear":  # peft: every linear layer but the output head, a Llama layer's seven
        count = int(BASE_MODULE_WORK)
    else:
        count = len(targets) if isinstance(targets, list) and targets else DEFAULT_TARGETS
    return rows * (BASE_MODULE_WORK + count)


def member_stack(config: Mapping[str, Any], peft_spec: Mapping[str, Any] | None) -> str | None:
    """Which members of a fused group stack together: those of one micro-batch size and one adapter
    spec (rank, alpha, targets, dropout, ...) go through each of their LoRA layers as one stack,
    two batched matmuls for all of them (workers.lora.routing), where members of other shapes are
    stacks of their own. A spec is the one read (`peft_spec`), else the file the config names (one
    file, one spec, whether or not orch can read it from here), else the worker's default where
    the config names none; None for anything else: a member that stacks with no other."""
    named = config.get("peft")
    if peft_spec is not None:
        spec: Any = by_long_names(peft_spec)
    elif isinstance(named, str):
        spec = {"file": named}
    elif named is None:
        spec = "default"
    else:
        return None
    rows = first_int(config, BATCH_KEYS) or 1
    return json.dumps([rows, spec], sort_keys=True, default=str)


def fuse_max(job: Job, fused_cap: int | None) -> int:
    """The most members a fused group of this job may have now (1..16): its suite's
    `fused_members`, lowered to `fused_cap` after one of the suite's groups ran out of memory."""
    members = job.worker_output.get("fused_members")
    wanted = members if isinstance(members, int) and not isinstance(members, bool) else FUSED_MEMBERS_DEFAULT
    return max(1, min(MAX_FUSE, wanted, fused_cap if fused_cap is not None else MAX_FUSE))


def group_shape_key(shape_key: str, members: int) -> str:
    """The memory record of a shape's process at a group size: its shape's own at one member
    (a job alone in its process), else `<shape>|fused<k>`."""
    return shape_key if members <= 1 else f"{shape_key}{FUSED_SHAPE_MARK}{members}"


def split_group_key(key: str) -> tuple[str, int | None]:
    """A memory record's shape key and group size (`group_shape_key` undone); (key, None) for a
    shape's own record. The mark follows a whole shape key (`hash|model|task`): a shape whose task
    is named `fused4` is a shape of its own. The size is ASCII digits written as the daemon writes
    them (keys are read back from the store: anything else is no group's)."""
    shape, mark, members = key.rpartition(FUSED_SHAPE_MARK)
    if not mark or shape.count("|") < SHAPE_KEY_PARTS - 1 or not _SIZE.fullmatch(members):
        return key, None
    if FUSED_MEMBERS_RANGE[0] <= int(members) <= MAX_FUSE:
        return shape, int(members)
    return key, None


@dataclass(frozen=True)
class GroupPeak:
    """A fused process's peak at `members` members, as one member shape's record says."""

    members: int  # 2..16
    mib: int  # the peak with the margin the solo path gives a shape's own record
    # a completed member's peak: it may put the process below today's figure (base plus the
    # members' own needs), as a measured peak overrides a declared one; else an OOM floor,
    # which only raises it
    measured: bool


def learned_group_peaks(shape_key: str, shapes: Mapping[str, ShapeMemory]) -> tuple[GroupPeak, ...]:
    """The shape's `|fused<k>` records as process peaks, smallest group first; () where none was
    learned. Margins and the OOM floor as for the shape's own record (predict_peak_mib)."""
    found = []
    for members in range(FUSED_MEMBERS_RANGE[0], MAX_FUSE + 1):
        record = shapes.get(group_shape_key(shape_key, members))
        if record is None or (record.peak_mib is None and record.oom_floor_mib is None):
            continue
        predicted = predict_peak_mib(record, None, None)
        found.append(GroupPeak(members, predicted.mib, predicted.source.kind is SourceKind.MEASURED))
    return tuple(found)
