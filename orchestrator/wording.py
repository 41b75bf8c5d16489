"""Values as people write them (YAML words, not Python reprs), for messages and tables. Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any


def fmt_value(value: Any) -> str:
    """A config value as written in YAML: `true`, `null`, `2e-05`; never `True` or a repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def fmt_settings(settings: Any) -> str:
    """`{'sim_seconds': 45, 'env': {'A': 'b'}}` -> `sim_seconds=45 env.A=b`, as --set takes them."""
    if not isinstance(settings, dict):
        return fmt_value(settings)
    parts: list[str] = []
    for key, value in settings.items():
        if isinstance(value, dict):
            parts.extend(f"{key}.{inner}={fmt_value(v)}" for inner, v in value.items())
        else:
            parts.append(f"{key}={fmt_value(value)}")
    return " ".join(parts)


def fmt_changes(changes: Any, run_alone: bool = False) -> str:
    """What a ladder level or host step changed: `gradient_checkpointing=true, batch_size=2`."""
    shown = [f"{k}={fmt_value(v)}" for k, v in (changes or {}).items()] if isinstance(changes, dict) else []
    if run_alone:
        shown.append("run alone")
    return ", ".join(shown)


# Beyond this magnitude a number a script reports is no metric value: treated as a non-finite one
# (named, never averaged or drawn), since its sums of squares would leave a float's range.
MAX_METRIC = 1e300


def number(value: Any) -> float | None:
    """A finite number from a value a script printed (a number or a numeric string)."""
    if isinstance(value, bool):
        return None
    try:  # an int of 400 digits overflows a float: not a number a metric can be
        if isinstance(value, (int, float)):
            result = float(value)
        elif isinstance(value, str) and len(value) <= 64:
            result = float(value.strip())
        else:
            return None
    except (ValueError, OverflowError):
        return None
    return result if math.isfinite(result) else None


def ended_on_gpu(n: int, outcome: str, gpu: int | None, *details: str) -> str:
    """`attempt 2 oom on GPU 0: CUDA out of memory ...; retry at level 1`: each detail once, and
    none that only repeats the outcome (a cancel reads `attempt 1 cancelled on GPU 0`)."""
    said = [d for d in dict.fromkeys(d.strip() for d in details) if d and d != outcome]
    where = "" if gpu is None else f" on GPU {gpu}"
    return f"attempt {n} {outcome}{where}" + (f": {'; '.join(said)}" if said else "")


def attempts_said(
    attempts: int, counted: int, max_attempts: int, resumes: int, max_resumes: int
) -> str:
    """`attempt 3 of at most 4 (5 in all), resume 2 of at most 8`: the attempts that use up
    max_attempts, and the deaths resumed from a checkpoint without using one up."""
    in_all = f" ({attempts} in all)" if attempts != counted else ""
    return (f"attempt {counted} of at most {max_attempts}{in_all}, "
            f"resume {resumes} of at most {max_resumes}")


# What a reader is never shown as it is: control characters (Unicode's Cc, C0 and C1: a terminal
# obeys them), the line and paragraph separators (Zl, Zp), lone surrogates (Cs: JSON's `\ud800`,
# which no terminal or page can encode), and the invisible characters that reorder or hide text:
# the bidirectional marks, embeddings, overrides and isolates (U+061C, U+200E, U+200F,
# U+202A-U+202E, U+2066-U+2069), the zero-width space and word joiner (U+200B, U+2060), the
# invisible operators (U+2061-U+2064), the deprecated format controls (U+206A-U+206F), the byte
# order mark (U+FEFF) and the interlinear annotation controls (U+FFF9-U+FFFB). The other format
# characters are text: the zero-width joiner and non-joiner (U+200D in 👩‍🔬, U+200C in Persian),
# the soft hyphen, the tag characters of a subdivision flag (U+E0020-U+E007F).
_HIDDEN_RANGES = (
    (0x00, 0x1F), (0x7F, 0x9F), (0x061C, 0x061C), (0x200B, 0x200B), (0x200E, 0x200F), (0x2028, 0x202E),
    (0x2060, 0x206F), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
)
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escaped(found: re.Match[str]) -> str:
    return _escape(found[0])


def _hidden_class(kept: str = "") -> re.Pattern[str]:
    """One character class of exactly the hidden code points (but `kept`), so the callback runs
    only on a character it escapes, never on `·` or `ü`."""
    spans: list[tuple[int, int]] = []
    for low, high in _HIDDEN_RANGES:
        start = low
        for code in sorted(ord(c) for c in kept if low <= ord(c) <= high):
            if start < code:
                spans.append((start, code - 1))
            start = code + 1
        if start <= high:
            spans.append((start, high))
    return re.compile("[" + "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in spans) + "]")


# every hidden character is one str.isprintable() rejects, so text it accepts (most text) is
# returned as it is without a search
_HIDDEN = _hidden_class()
_HIDDEN_IN_LINES = _hidden_class("\n\t")


def one_line(text: str) -> str:
    """User text (a name, a note, a value: written by user code) as one line for a reader, in
    every human-facing output: each hidden character above shown escaped (`\\n`, `\\x1b`,
    `\\u202e`), so it never splits a row, reaches a terminal as a control sequence or reorders
    what is read."""
    return text if text.isprintable() else _HIDDEN.sub(_escaped, text)


def shown_lines(text: str) -> str:
    """User text of several lines (a log, a config file) for a reader: one_line's rule, its
    line breaks and tabs kept."""
    return text if text.isprintable() else _HIDDEN_IN_LINES.sub(_escaped, text)


def fmt_duration(seconds: float | None) -> str:
    """`42s`, `3m07s`, `2h05m`; `-` for none (the CLI's tables and the web page alike)."""
    if seconds is None or seconds < 0:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{(whole % 3600) // 60:02d}m"


def setting_pairs(overrides: Any) -> list[tuple[str, str]]:
    """A job's overrides (`--set`, `--grid`) as (key, value) words, nested keys dotted
    (`env.A`), in the order they were given."""
    if not isinstance(overrides, dict):
        return []
    pairs: list[tuple[str, str]] = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            pairs.extend((f"{key}.{inner}", fmt_value(v)) for inner, v in value.items())
        else:
            pairs.append((str(key), fmt_value(value)))
    return pairs


def short_key(key: str) -> str:
    """`learning_rate` -> `lr`, `gradient_accumulation_steps` -> `gas`: the initials of a key of
    two or more words; a one-word key (`dropout`) and a dotted one (`env.A`) as they are."""
    words = [w for w in key.replace("-", "_").split("_") if w]
    return "".join(w[0] for w in words) if len(words) > 1 and "." not in key else key


def short_keys(keys: Iterable[str]) -> dict[str, str]:
    """The short name of each key of one listing: initials where no two keys (and no key's
    own name) share them, else the whole key, so `lr` never means two things in one table."""
    keys = set(keys)
    by_short: dict[str, set[str]] = {}
    for key in keys:
        by_short.setdefault(short_key(key), set()).add(key)
    return {key: short if len(by_short[short]) == 1 and (short == key or short not in keys) else key
            for short, named in by_short.items() for key in named}


def fmt_setting(overrides: Any, names: dict[str, str] | None = None, sep: str = " ") -> str:
    """A job's overrides in one cell: `learning_rate=0.001`, or with `names` (short_keys)
    `lr=0.001`; `-` when it has none."""
    pairs = setting_pairs(overrides)
    if not pairs:
        return "-"
    return sep.join(f"{(names or {}).get(k, k)}={v}" for k, v in pairs)
