"""A misspelt name's likely meaning, for the one-line errors that refuse it. Pure."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(names: Iterable[object], known: Iterable[str]) -> str:
    """` (did you mean 'learning_rate'?)` for a name close to a known one (`learning_rat`), else
    ''; where several names were refused, each suggestion says which it answers (` (did you mean
    'warmup_steps' for 'warmup_step'?)`). One suggestion per name: a list of near misses would
    read as a second error."""
    choices = sorted(known)
    refused = [str(name) for name in names]
    close = {name: match for name in refused for match in difflib.get_close_matches(name, choices, n=1)}
    if not close:
        return ""
    if len(refused) == 1:
        return f" (did you mean {next(iter(close.values()))!r}?)"
    return f" (did you mean {', '.join(f'{match!r} for {name!r}' for name, match in close.items())}?)"
