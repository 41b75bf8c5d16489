"""Optuna, the one library early stopping and search run on: imported here only, and only when
a suite has `early_stop:` or `search:`. Missing, it is one line naming the extra to install."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from orchestrator.errors import UsageError

INSTALL_HINT = 'pip install "orch[search]"'


class OptunaMissing(UsageError):
    """A suite asks for early stopping or search and Optuna is not installed."""


def load_optuna() -> ModuleType:
    """The optuna module, its own logging quieted (orch says what it decided, in events)."""
    try:
        optuna = importlib.import_module("optuna")
    except ImportError:
        raise OptunaMissing(
            f"early_stop and search need Optuna, which is not installed: {INSTALL_HINT}"
        ) from None
    optuna.logging.set_verbosity(logging.WARNING)
    return optuna
