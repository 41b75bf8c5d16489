"""Suite settings about a worker's output: hang timeout, progress and result regexes. Pure."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from orchestrator.errors import PlanError

HANG_TIMEOUT_OFF = 0.0  # stored for `hang_timeout_s: off`
MAX_REGEX_CHARS = 500


def parse_hang_timeout(path: Path, raw: Any) -> float:
    """Seconds without any output (progress.jsonl or stdout.log) before a worker counts as hung;
    `off` (YAML may read it as false) disables the check."""
    if raw is False or (isinstance(raw, str) and raw.strip().lower() == "off"):
        return HANG_TIMEOUT_OFF
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise PlanError(f"suite {path}: `hang_timeout_s` must be a number of seconds or off")
    if not (math.isfinite(raw) and raw > 0):
        raise PlanError(f"suite {path}: `hang_timeout_s` must be positive (or off)")
    return float(raw)


def parse_regex(path: Path, data: dict[str, Any], key: str, required_group: str | None) -> str | None:
    raw = data.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw or len(raw) > MAX_REGEX_CHARS:
        raise PlanError(f"suite {path}: `{key}` must be a regular expression of at most {MAX_REGEX_CHARS} characters")
    try:
        pattern = re.compile(raw)
    except re.error as exc:
        raise PlanError(f"suite {path}: `{key}` is not a valid regular expression: {exc}") from None
    if required_group and required_group not in pattern.groupindex:
        raise PlanError(f"suite {path}: `{key}` needs a named group (?P<{required_group}>...)")
    if not pattern.groupindex:
        raise PlanError(f"suite {path}: `{key}` needs named groups, one per metric, e.g. (?P<accuracy>[0-9.]+)")
    return raw
