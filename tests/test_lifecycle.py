"""The job transition table: every (from, to) move, allowed or not."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.errors import InvalidTransition, StoreError
from orchestrator.lifecycle import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    JobState,
    check_transition,
    is_allowed,
)

Q, R, S, F, C, P = (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                    JobState.PRUNED)

# Written out independently of the code: the lifecycle of DESIGN.md plus `orch retry`
# (failed/cancelled -> queued), requeue after an OOM'd or lost attempt (running -> queued) and a
# queued job failed because no ladder level fits any GPU (queued -> failed); early stopping
# (running or queued -> pruned) and `orch retry` of a pruned job (pruned -> queued).
EXPECTED: frozenset[tuple[JobState | None, JobState]] = frozenset(
    {(None, Q), (Q, R), (Q, C), (Q, F), (R, S), (R, F), (R, C), (R, Q), (F, Q), (C, Q), (Q, P), (R, P), (P, Q)}
)

FROM_STATES: list[JobState | None] = [None, *JobState]
ALL_MOVES = list(itertools.product(FROM_STATES, list(JobState)))


def _move_id(move: tuple[JobState | None, JobState]) -> str:
    from_state, to_state = move
    return f"{from_state.value if from_state else 'new'}->{to_state.value}"


def test_table_is_exactly_the_expected_one() -> None:
    assert frozenset(ALLOWED_TRANSITIONS) == EXPECTED


@pytest.mark.parametrize("move", ALL_MOVES, ids=_move_id)
def test_every_move(move: tuple[JobState | None, JobState]) -> None:
    from_state, to_state = move
    if move in EXPECTED:
        assert is_allowed(from_state, to_state)
        check_transition(from_state, to_state)  # no exception
    else:
        assert not is_allowed(from_state, to_state)
        with pytest.raises(InvalidTransition) as info:
            check_transition(from_state, to_state)
        shown_from = from_state.value if from_state else "(new)"
        assert f"{shown_from} -> {to_state.value}" in str(info.value)


def test_product_covers_forty_two_moves() -> None:
    # 7 "from" values (None + 6 states) × 6 targets; guards the parametrization above.
    assert len(ALL_MOVES) == 42
    assert len(set(ALL_MOVES)) == 42


def test_succeeded_is_final_and_creation_only_queues() -> None:
    assert all(not is_allowed(S, to) for to in JobState)
    assert [to for to in JobState if is_allowed(None, to)] == [Q]
    assert all(not is_allowed(state, state) for state in JobState)


def test_terminal_states() -> None:
    assert frozenset({S, F, C, P}) == TERMINAL_STATES
    # Only `orch retry` leaves a terminal state, and only back to queued.
    for state in TERMINAL_STATES:
        assert {to for to in JobState if is_allowed(state, to)} <= {Q}


def test_invalid_transition_is_a_store_error() -> None:
    # The CLI maps StoreError to its exit code; a forbidden move must not escape as a bare Exception.
    assert issubclass(InvalidTransition, StoreError)
    assert JobState("queued") is Q and Q == "queued"
