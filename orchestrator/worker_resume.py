"""Can a job's worker resume from its own checkpoint? Pure.

An attempt ended by a cluster's time limit is worth another attempt only when that attempt
carries on from where the last one stopped; rerunning from scratch would hit the same limit.
A worker says it can resume through its command template (`{resume}`, or `{resume?TEXT}`)
or through its config (a `resume_from_checkpoint` key, Hugging Face's name, which the
script reads; `resume_from_checkpoint: false` opts out).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

RESUME_KEY = "resume_from_checkpoint"
# `{resume}` or `{resume?--resume}`, not the literal `{{resume}}`
_RESUME_PLACEHOLDER = re.compile(r"(?<!\{)\{resume(?:\?[^{}]*)?\}")


def worker_can_resume(worker: str, config: Mapping[str, Any], keys: Mapping[str, str] | None = None) -> bool:
    """True when the worker (`lora`, `sim` or a command template) resumes from a checkpoint:
    its template names `{resume}`, or its config, under the suite's `keys:` names, has
    `resume_from_checkpoint`."""
    if _RESUME_PLACEHOLDER.search(worker or ""):
        return True
    script_key = (keys or {}).get("resume", RESUME_KEY)
    # present, even as null (orch fills it in on a resumed attempt); `false` says it does not
    return any(key in config and config[key] is not False for key in {RESUME_KEY, script_key})
