"""What earlier attempts of a job ended as in the cluster (Slurm's own word, kept in
attempts.executor_state): a resumable job's time limits are capped apart from max_attempts."""

from __future__ import annotations

from orchestrator.store.db import Store


def ended_in_state(
    store: Store, job_id: int, state: str, before_attempt_n: int, reason_words: str | None = None
) -> int:
    """How many attempts of the job before attempt `before_attempt_n` ended in the cluster's
    `state` (e.g. TIMEOUT), or with `reason_words` in their reason (the same end, seen another
    way: a worker that died of the time limit's warning)."""
    rows = store.query(
        "SELECT count(*) AS n FROM attempts WHERE job_id = ? AND n < ? AND outcome IS NOT NULL "
        "AND (executor_state = ? OR (? IS NOT NULL AND instr(coalesce(reason, ''), ?) > 0))",
        [job_id, before_attempt_n, state, reason_words, reason_words],
    )
    return int(rows[0]["n"]) if rows else 0


def stuck_attempt_count(store: Store, words: str) -> int:
    """Live attempts whose cluster state says they will never start (`words` in it): they hold
    no place among the attempts kept submitted."""
    rows = store.query(
        "SELECT count(*) AS n FROM attempts WHERE outcome IS NULL AND instr(coalesce(executor_state, ''), ?) > 0",
        [words],
    )
    return int(rows[0]["n"]) if rows else 0
