"""Optuna, the one library early stopping and search run on: imported here only, and only when
a suite has `early_stop:` or `search:`. Missing, it is one line naming the extra to install."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from types import ModuleType

from orchestrator.errors import UsageError

INSTALL_HINT = 'pip install "orch[search]"'
_NEEDS = ("numpy",)  # Optuna imports it; the `orch` console script keeps it out unless needed


class OptunaMissing(UsageError):
    """A suite asks for early stopping or search and Optuna is not installed."""


def _missing() -> OptunaMissing:
    return OptunaMissing(
        f"early_stop and search need Optuna, which is not installed: {INSTALL_HINT}"
    )


def require_optuna() -> None:
    """Raise OptunaMissing unless Optuna can be imported; imports nothing (a submit stays fast)."""
    if importlib.util.find_spec("optuna") is None:
        raise _missing()


def load_optuna() -> ModuleType:
    """The optuna module, its own logging quieted (orch says what it decided, in events)."""
    for name in _NEEDS:
        if name in sys.modules and sys.modules[name] is None:  # the console script's placeholder
            del sys.modules[name]
    try:
        optuna = importlib.import_module("optuna")
    except ImportError:
        raise _missing() from None
    optuna.logging.set_verbosity(logging.WARNING)
    return optuna
