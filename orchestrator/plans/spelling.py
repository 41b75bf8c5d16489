"""A misspelt name's likely meaning, for the one-line errors that refuse it. Pure."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(names: Iterable[object], known: Iterable[str]) -> str:
    """` (did you mean 'learning_rate'?)` for names close to a known one (`learning_rat`), else ''.
    One suggestion per name: a list of near misses would read as a second error."""
    choices = sorted(known)
    close = [
        match for name in names for match in difflib.get_close_matches(str(name), choices, n=1)
    ]
    if not close:
        return ""
    return f" (did you mean {', '.join(repr(match) for match in dict.fromkeys(close))}?)"
