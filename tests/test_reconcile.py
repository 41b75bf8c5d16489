"""Deciding what happened to a live attempt: judge() on observations, the lost-marker handshake
with the wrapper, and the outcome of an attempt stopped from outside."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.lifecycle import AttemptOutcome
from orchestrator.outcomes import _stopped_from_outside


@pytest.mark.parametrize(
    ("exit_record", "outside"),
    [
        # the wrapper names what reached it: that decides, whatever the exit code
        ({"exit_code": 1, "signal": None, "received": ["SIGHUP"]}, True),
        ({"exit_code": 143, "signal": 15, "received": ["SIGTERM"]}, True),
        ({"exit_code": 143, "signal": None, "received": []}, False),
        ({"exit_code": 129, "signal": 1, "received": []}, False),
        ({"exit_code": 130, "signal": 2, "received": ["SIGINT"]}, False),
        # older records without "received": inferred from the exit status
        ({"exit_code": 143, "signal": 15}, True),
        ({"exit_code": 129, "signal": None}, True),
        ({"exit_code": 1, "signal": None}, False),
    ],
)
def test_stopped_from_outside(exit_record: dict[str, Any], outside: bool) -> None:
    assert _stopped_from_outside(AttemptOutcome.FAILED, None, exit_record, None) is outside


def test_stopped_from_outside_never_overrides_orch_kills_results_or_other_outcomes() -> None:
    hup = {"exit_code": 129, "signal": 1, "received": ["SIGHUP"]}
    assert not _stopped_from_outside(AttemptOutcome.FAILED, "cancel", hup, None)
    assert not _stopped_from_outside(AttemptOutcome.FAILED, None, hup, {"status": "error"})
    assert not _stopped_from_outside(AttemptOutcome.OOM, None, hup, None)
    assert not _stopped_from_outside(AttemptOutcome.FAILED, None, None, None)
