"""Which jobs may train together in one fused LoRA worker process (`share_base: fused`), pure.

A fused group is the jobs of one suite whose resolved configs (at the attempt's ladder level)
agree on what the process loads and how it steps: the model, `prec`, `max_seq_len` and
`gradient_checkpointing`. The worker's own group key (its base key: model digest, dtype,
interpreter, environment) is finer still; the daemon's key only says where a job may join.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orchestrator.plans.worker_output import FUSED_MEMBERS_DEFAULT, FUSED_MEMBERS_RANGE
from orchestrator.store.rows import Job

FUSE_KEYS = ("model", "prec", "max_seq_len", "gradient_checkpointing")
MAX_FUSE = FUSED_MEMBERS_RANGE[1]


def shares_base(job: Job) -> bool:
    """Whether the job's attempts may be trained by a warm LoRA worker process (`share_base`)."""
    return job.worker == "lora" and job.worker_output.get("share_base", "off") != "off"


def fused(job: Job) -> bool:
    """Whether the job's attempts may train in a fused group (`share_base: fused`)."""
    return job.worker == "lora" and job.worker_output.get("share_base") == "fused"


def fuse_group(job: Job, suite: str, overrides: Mapping[str, Any], run_alone: bool = False) -> str | None:
    """The fused group of the job's attempt with these ladder `overrides`; None where it trains
    in no fused group (not fused, a multi-GPU job, or run alone by the ladder)."""
    if not fused(job) or job.gpus != 1 or run_alone:
        return None
    config = {**job.config, **overrides}
    return json.dumps([suite, *(config.get(key) for key in FUSE_KEYS)], default=str)


def fuse_max(job: Job, fused_cap: int | None) -> int:
    """The most members a fused group of this job may have now (1..16): its suite's
    `fused_members`, lowered to `fused_cap` after one of the suite's groups ran out of memory."""
    members = job.worker_output.get("fused_members")
    wanted = members if isinstance(members, int) and not isinstance(members, bool) else FUSED_MEMBERS_DEFAULT
    return max(1, min(MAX_FUSE, wanted, fused_cap if fused_cap is not None else MAX_FUSE))
