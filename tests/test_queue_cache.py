"""The daemon keeps the queue between passes and re-reads only the jobs the change log names;
what it keeps is always what a whole read would give."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
from orchestrator.scheduling.dispatch import DispatchContext, schedule
from orchestrator.scheduling.packing.types import PackingPolicy
from orchestrator.scheduling.queue_index import FORGET_AFTER, FULL_READ_CHANGES, QueueCache
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store import Store
from orchestrator.store.jobs import cancel_queued, set_gpu_plan, submit_jobs, transition
from tests.conftest import REPO_ROOT
from tests.store_reads import job_ids, read_jobs
from tests.test_scale import _Recorder


def _submit(store: Store, seeds: range, priority: int = 0) -> list[int]:
    suite = load_suite("demo", REPO_ROOT / "plans")
    specs = expand_jobs(suite, parse_pairs(" ".join(f"{i}:glue_rte" for i in seeds)), {}, None, 0)
    submit_jobs(store, suite, specs, allowed_gpus=None, priority=priority, force=False, dry_run=False)
    return job_ids(store)


def _whole(store: Store) -> list[tuple[int, int, int, str | None]]:
    cache = QueueCache()
    cache.read(store)
    return [(e.id, e.priority, e.level, e.wait_reason) for e in cache.ordered()]


def _kept(cache: QueueCache, store: Store) -> list[tuple[int, int, int, str | None]]:
    cache.read(store)
    return [(e.id, e.priority, e.level, e.wait_reason) for e in cache.ordered()]


def test_after_the_first_read_only_changed_jobs_are_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    ids = _submit(store, range(10))
    cache = QueueCache()
    first = cache.read(store)
    assert first.whole and [e.id for e in cache.ordered()] == ids
    again = cache.read(store)
    assert not again.whole and not again.changed and not again.left  # nothing changed: nothing read
    transition(store, ids[0], JobState.RUNNING, message="started")
    cancel_queued(store, ids[1], "not wanted")
    moved = cache.read(store)
    assert not moved.whole and moved.left == {ids[0], ids[1]}
    assert [e.id for e in cache.ordered()] == ids[2:]
    urgent = _submit(store, range(10, 12), priority=5)[-6:]  # three configs x two seeds, ahead of the rest
    ahead = cache.read(store)
    assert not ahead.whole and [e.id for e in cache.first(6)] == urgent
    transition(store, ids[0], JobState.QUEUED, message="requeued after an OOM", fields={"level": 1})
    back = cache.read(store)
    assert not back.whole and (ids[0], 0, 1, None) in _kept(cache, store)
    assert _kept(cache, store) == _whole(store)


def test_changes_read_while_only_the_head_is_looked_at_wait_for_the_next_pass_that_packs(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    ids = _submit(store, range(3))
    cache = QueueCache()
    cache.read(store)
    assert cache.take_changes().whole
    added = _submit(store, range(3, 4))[-3:]
    transition(store, ids[0], JobState.RUNNING, message="started")
    assert [e.id for e in cache.head(store, 2) or []] == ids[1:3]  # a busy pass: the head only
    transition(store, added[0], JobState.RUNNING, message="started")
    cache.read(store)
    changes = cache.take_changes()
    assert not changes.whole and changes.changed == set(added[1:]) and changes.left == {ids[0], added[0]}
    assert cache.take_changes().changed == set()  # taken once


def test_the_log_is_forgotten_once_read_and_a_burst_reads_the_queue_whole(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    cache = QueueCache()
    _submit(store, range(2))
    cache.read(store)
    _submit(store, range(2, 2 + FORGET_AFTER // 3 + 1))  # three jobs per seed
    assert not cache.read(store).whole
    assert store.query("SELECT count(*) AS n FROM queue_changes")[0]["n"] == 0  # read, then deleted
    assert _kept(cache, store) == _whole(store)
    _submit(store, range(1_000, 1_000 + FULL_READ_CHANGES // 3 + 1))
    assert cache.read(store).whole  # a burst: one whole read, not thousands of look-ups
    assert _kept(cache, store) == _whole(store)


@pytest.mark.parametrize("seed", range(8))
def test_random_changes_keep_the_kept_queue_equal_to_a_whole_read(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = Store(tmp_path / "state.db")
    _submit(store, range(20))
    cache = QueueCache()
    cache.read(store)
    next_seed = 20
    for _ in range(60):
        queued = job_ids(store, JobState.QUEUED)
        running = job_ids(store, JobState.RUNNING)
        move = rng.choice(["start", "cancel", "requeue", "submit", "reason", "priority"])
        if move == "start" and queued:
            transition(store, rng.choice(queued), JobState.RUNNING, message="started")
        elif move == "cancel" and queued:
            cancel_queued(store, rng.choice(queued), "cancelled")
        elif move == "requeue" and running:
            transition(
                store,
                rng.choice(running),
                JobState.QUEUED,
                message="retry",
                fields={"level": rng.randint(1, 3)},
            )
        elif move == "submit":
            _submit(store, range(next_seed, next_seed + 1), priority=rng.randint(-1, 1))
            next_seed += 1
        elif move == "priority" and (queued or running):
            with store.write():
                store.execute(
                    "UPDATE jobs SET priority = ? WHERE id = ?",
                    [rng.randint(-2, 2), rng.choice(queued + running)],
                )
        elif move == "reason" and queued:
            with store.write():
                store.execute("UPDATE jobs SET wait_reason = ? WHERE id = ?", [f"r{rng.random()}", rng.choice(queued)])
        roll = rng.random()
        if roll < 0.3:  # the head alone, read lazily
            cache.read(store)
            assert [e.id for e in cache.first(5)] == [row[0] for row in _whole(store)[:5]]
        elif roll < 0.6:
            assert _kept(cache, store) == _whole(store)
    assert _kept(cache, store) == _whole(store)


def test_a_pass_hands_pack_as_many_jobs_of_each_kind_as_there_are_free_slots(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    ids = _submit(store, range(100))  # 300 jobs of three kinds (the demo's configs)
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=2))
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(order="fifo"), {})
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80_000, used_mib=0, free_mib=80_000, processes=()),)
    state = SchedulerState()
    decision = schedule(store, gpu, _Recorder(), ctx, state, draining=False)
    # fifo: the head of the queue, then the first job of another kind: the head's family has
    # measured nothing, so its next seed waits for the head's step-K reading (it probes)
    assert [p.job_id for p in decision.placements] == [ids[0], ids[100]]
    # two free slots: two jobs of each of the three kinds, and the head of the queue (whose
    # waiting reasons `orch status` shows), were handed to pack
    explained = [job.id for job in read_jobs(store) if job.wait_reason is not None]
    assert explained == ids[1:51]  # as when the whole queue is handed over
    assert len(state.job_facts.by_job) == 300  # every job's facts are known: later passes place any of them
