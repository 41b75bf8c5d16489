"""Live attempts and their jobs, read twice in every pass: a row read again unchanged is the
object built before; any changed column gives a fresh one."""

from __future__ import annotations

from pathlib import Path

from store_helpers import declared_plan

from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.attempts import start_attempt, update_attempt
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queue import live_attempts_with_jobs
from orchestrator.store.row_memo import RowMemo
from orchestrator.store.rows import Attempt
from tests.rows_helpers import ATTEMPT_DEFAULTS
from tests.store_reads import job_ids

PLANS = Path(__file__).resolve().parents[1] / "plans"


def _started(store: Store, db_path: Path, seeds: str) -> list[Attempt]:
    suite = load_suite("demo", PLANS)
    submit = expand_jobs(suite, parse_pairs(seeds), {}, None, 0)
    submit_jobs(store, suite, submit, allowed_gpus=None, priority=0, force=False, dry_run=False)
    started = []
    for job_id in job_ids(store):
        plan = declared_plan(job_id)
        started.append(start_attempt(store, plan, lambda n, j=job_id: db_path.parent / f"run-{j}-{n}"))
    return started


def test_an_unchanged_row_is_not_built_again_and_a_changed_one_is(db_path: Path) -> None:
    with Store(db_path) as store:
        started = _started(store, db_path, "1:glue_rte 2:glue_rte")
        assert len(started) >= 2
        first = started[0]
        live, jobs = live_attempts_with_jobs(store)
        again, jobs_again = live_attempts_with_jobs(store)
        assert [a.id for a in again] == [a.id for a in started]
        assert all(a is b for a, b in zip(again, live, strict=True))
        assert jobs_again[first.job_id] is jobs[first.job_id]

        update_attempt(store, first.id, held_mib=777, progress_json='{"step": 3}')
        changed, _ = live_attempts_with_jobs(store)
        assert changed[0] is not live[0]
        assert (changed[0].held_mib, changed[0].progress) == (777, {"step": 3})
        assert changed[1] is live[1]


def test_an_ended_attempt_leaves_the_live_rows(db_path: Path) -> None:
    with Store(db_path) as store:
        first, *others = _started(store, db_path, "1:glue_rte 2:glue_rte")
        live_attempts_with_jobs(store)
        store.execute("UPDATE attempts SET outcome = 'succeeded', ended_at = 1 WHERE id = ?", [first.id])
        live, jobs = live_attempts_with_jobs(store)
        assert [a.id for a in live] == [a.id for a in others]
        assert sorted(jobs) == sorted({a.job_id for a in others})


def test_the_memo_forgets_rows_no_longer_read() -> None:
    built: list[int] = []

    def build(row: object) -> Attempt:
        attempt = Attempt.from_row(row)  # type: ignore[arg-type]
        built.append(attempt.id)
        return attempt

    memo: RowMemo[Attempt] = RowMemo(build)
    row = dict(ATTEMPT_DEFAULTS)
    assert memo.get(row) is memo.get(dict(row))
    memo.keep_only([])
    memo.get(row)
    assert built == [1, 1]
