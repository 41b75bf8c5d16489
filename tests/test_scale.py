"""A long queue costs little: listings page and stream, the scheduling pass keeps what it
computed per job and per shape and redoes it when its inputs change, pack stops early."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest

from orchestrator.cli.common import echo_json, echo_json_stream
from orchestrator.clock import FakeClock
from orchestrator.executors.base import LaunchHandle, LaunchSpec, LocalExecutor
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.scheduling.dispatch import DispatchContext, schedule
from orchestrator.scheduling.packing.pack import can_take_any, pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store import Store
from orchestrator.store.attempts import read_all_shapes, update_attempt, write_shape
from orchestrator.store.jobs import cancel_queued, set_gpu_plan, submit_jobs
from orchestrator.store.queries import get_attempts
from orchestrator.store.rows import ShapeMemory
from orchestrator.store.sweep_attempts import all_attempts
from tests.conftest import REPO_ROOT, OrchRunner
from tests.store_reads import job_ids, read_jobs

# ---------------------------------------------------------------- streamed JSON


@pytest.mark.parametrize(
    "items", [[], [{"id": 1, "a": [1, 2], "b": None}], [{"id": i, "n": {"x": i}} for i in range(3)]]
)
def test_streamed_json_is_what_echo_json_prints(
    items: list, capsys: pytest.CaptureFixture[str]
) -> None:
    echo_json(items)
    whole = capsys.readouterr().out
    echo_json_stream(iter(items))
    assert capsys.readouterr().out == whole
    head = {"daemon": {"alive": False}, "counts": {"queued": 3}}
    echo_json({**head, "jobs": items})
    whole = capsys.readouterr().out
    echo_json_stream(iter(items), head, "jobs")
    assert capsys.readouterr().out == whole
    assert json.loads(whole)["jobs"] == items


# ---------------------------------------------------------------- paging


def test_jobs_and_status_json_page_by_limit_and_offset(orch_inproc: OrchRunner) -> None:
    pairs = " ".join(f"{i}:glue_rte" for i in range(40))
    assert orch_inproc("submit", "--suite", "demo", "--pairs", pairs).rc == 0
    every = json.loads(orch_inproc("jobs", "--json").stdout)
    assert len(every) > 40
    page = json.loads(orch_inproc("jobs", "--json", "--limit", "5", "--offset", "10").stdout)
    assert [j["id"] for j in page] == [j["id"] for j in every[10:15]]
    tail = json.loads(orch_inproc("jobs", "--json", "--offset", str(len(every) - 2)).stdout)
    assert [j["id"] for j in tail] == [j["id"] for j in every[-2:]]
    status = json.loads(orch_inproc("status", "--json", "--limit", "3", "--offset", "1").stdout)
    assert [j["id"] for j in status["jobs"]] == [j["id"] for j in every[1:4]]
    assert status["counts"]["queued"] == len(every)  # the counts are of every job, not the page
    table = orch_inproc("jobs", "--limit", "2", "--offset", "3").stdout
    assert [line.split()[0] for line in table.splitlines()[1:]] == [str(j["id"]) for j in every[3:5]]
    bad = orch_inproc("jobs", "--limit", "0")
    assert bad.rc == 2 and len(bad.stderr.splitlines()) == 1 and "--limit" in bad.stderr


def test_a_long_listing_is_a_plain_table_with_every_row(orch_inproc: OrchRunner) -> None:
    pairs = " ".join(f"{i}:glue_rte" for i in range(40))
    assert orch_inproc("submit", "--suite", "demo", "--pairs", pairs).rc == 0
    n_jobs = len(json.loads(orch_inproc("jobs", "--json").stdout))
    import orchestrator.cli.jobs.table as jobs_module

    original = jobs_module.RICH_TABLE_ROWS
    jobs_module.RICH_TABLE_ROWS = 10
    try:
        out = orch_inproc("jobs").stdout
    finally:
        jobs_module.RICH_TABLE_ROWS = original
    lines = out.splitlines()
    assert lines[0].split() == ["id", "state", "suite", "config", "setting", "seed", "data", "gpu", "att", "lvl",
                                "metric", "time", "note"]
    assert len(lines) == n_jobs + 1
    assert all(line.split()[1] == "queued" for line in lines[1:])
    assert click.unstyle(out) == out  # not a terminal: no colour codes


# ---------------------------------------------------------------- pack


def _queue(n: int, peak_mib: int = 1000) -> list[QueuedJob]:
    return [
        QueuedJob(
            job_id=i, priority=0, queued_seq=i, predicted_peak_mib=peak_mib, waiting_since_s=0.0
        )
        for i in range(n)
    ]


def test_pack_on_a_full_machine_places_nothing_and_explains_only_the_head() -> None:
    gpus = [GpuState(0, "u0", 24_000, 20_000, 1)]
    running = [RunningAttempt(99, 0, 1000, 1000, True)]
    policy = PackingPolicy(reasons_for=5)
    assert not can_take_any(gpus, running, policy)
    decision = pack(_queue(1000), gpus, running, policy, now_s=0.0)
    assert decision.placements == ()
    assert set(decision.wait_reasons) == {0, 1, 2, 3, 4}
    assert decision.wait_reasons[0] == "all allowed GPUs at their plan cap"


def test_pack_still_backfills_a_small_job_deep_in_the_queue() -> None:
    gpus = [GpuState(0, "u0", 24_000, 6_000, 2)]
    big = _queue(500, peak_mib=20_000)
    small = QueuedJob(job_id=500, priority=0, queued_seq=500, predicted_peak_mib=1_000, waiting_since_s=0.0)
    policy = PackingPolicy(reasons_for=3, order="fifo")
    assert can_take_any(gpus, [], policy)
    decision = pack([*big, small], gpus, [], policy, now_s=0.0)
    assert [p.job_id for p in decision.placements] == [500]
    assert {0, 1, 2} <= set(decision.wait_reasons) and len(decision.wait_reasons) <= 6


# ---------------------------------------------------------------- run times


def test_a_run_time_table_filled_run_by_run_answers_as_one_built_at_once() -> None:
    runs = [CompletedRun("a", "rte", 0, 100.0), CompletedRun("b", "rte", 0, 300.0), CompletedRun("a", "qnli", 1, 900.0),
            CompletedRun("b", "qnli", 0, 2_000.0), CompletedRun("c", "rte", 2, 50.0)]
    growing = DurationTable()
    for i, run in enumerate(runs):
        growing.add(run)
        fresh = DurationTable(runs[: i + 1])
        for config in ("a", "b", "c", "d"):
            for task in ("rte", "qnli", "mnli"):
                for level in (0, 1, 2):
                    assert growing.expected_s(config, task, level) == pytest.approx(
                        fresh.expected_s(config, task, level)
                    )
    # config c ran at a sixth of rte's mean; qnli's mean times that factor
    assert growing.expected_s("c", "qnli", 0) == pytest.approx((900 + 2_000) / 2 * 50 / ((100 + 300 + 50) / 3))


# ---------------------------------------------------------------- the scheduling pass


class _Recorder(LocalExecutor):
    name = "fake"

    def __init__(self) -> None:
        self.specs: list[LaunchSpec] = []

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        self.specs.append(spec)
        return LaunchHandle(executor="fake", pid=None, executor_id=f"@{len(self.specs)}")


def _store_with_queue(tmp_path: Path, n: int) -> Store:
    suite = load_suite("demo", REPO_ROOT / "plans")
    store = Store(tmp_path / "state.db")
    specs = expand_jobs(suite, parse_pairs(" ".join(f"{i}:glue_rte" for i in range(n))), {}, None, 0)
    submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False)
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=1))
    return store


def test_a_queued_job_is_predicted_again_when_its_shape_learns_a_peak(tmp_path: Path) -> None:
    store = _store_with_queue(tmp_path, 3)
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(order="fifo"), {})
    cache = SchedulerState()
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80_000, used_mib=0, free_mib=80_000, processes=()),)
    launcher = _Recorder()
    first = schedule(store, gpu, launcher, ctx, cache, draining=False)
    assert len(first.placements) == 1
    (attempt,) = all_attempts(store)
    assert attempt.prediction_source != "measured"
    queued = job_ids(store, JobState.QUEUED)
    facts = cache.job_facts.by_job[queued[0]]
    write_shape(store, facts.shape.shape_key, ShapeMemory(peak_mib=3_000, oom_floor_mib=None, samples=1))
    assert facts.shape.shape_key in read_all_shapes(store)
    # the running attempt ends: the slot frees, and the next job of that shape starts
    update_attempt(store, attempt.id, outcome="succeeded", ended_at=attempt.started_at + 5)
    with store.write():
        store.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ?", [attempt.job_id])
    second = schedule(store, gpu, launcher, ctx, cache, draining=False)
    placed = [p for p in second.placements if p.job_id == queued[0]]
    assert placed and placed[0].reserved_mib == 3_150  # measured x 1.05
    started = get_attempts(store, queued[0])
    assert started[0].prediction_source == "measured"
    assert len(launcher.specs) == 2


def test_while_no_slot_is_free_only_the_head_of_the_queue_is_read(tmp_path: Path) -> None:
    store = _store_with_queue(tmp_path, 200)
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=0))
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(reasons_for=7), {})
    cache = SchedulerState()
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80_000, used_mib=0, free_mib=80_000, processes=()),)
    decision = schedule(store, gpu, _Recorder(), ctx, cache, draining=False)
    assert decision.placements == ()
    assert len(cache.job_facts.by_job) == 7  # the head only: nothing else was read or computed
    reasons = [job.wait_reason for job in read_jobs(store) if job.wait_reason is not None]
    assert len(reasons) == 7 and all("0 slots" in reason for reason in reasons)


def test_while_nothing_can_start_the_heads_reasons_are_worked_out_again_only_on_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orchestrator.scheduling.dispatch as dispatch

    store = _store_with_queue(tmp_path, 20)
    store.clock = clock = FakeClock()
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=0))
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(reasons_for=5), {})
    cache = SchedulerState()
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80_000, used_mib=0, free_mib=80_000, processes=()),)
    packed: list[int] = []
    real_pack = dispatch.pack

    def counted_pack(queue: Any, *args: Any, **kwargs: Any) -> Any:
        packed.append(len(queue))
        return real_pack(queue, *args, **kwargs)

    monkeypatch.setattr(dispatch, "pack", counted_pack)

    def passes(**kwargs: object) -> int:
        before = len(packed)
        schedule(store, gpu, _Recorder(), ctx, cache, draining=False, **kwargs)  # type: ignore[arg-type]
        return len(packed) - before

    assert passes() == 1 and passes() == 1  # the second sees the reasons the first wrote
    assert passes() == 0  # nothing changed: the reasons stand
    assert passes(hold="disk full") == 1  # a hold: at once
    reasons = [job.wait_reason for job in read_jobs(store) if job.wait_reason is not None]
    assert len(reasons) == 5 and all("disk full" in reason for reason in reasons)
    assert passes(hold="disk full") == 1 and passes(hold="disk full") == 0
    assert passes() == 1  # the hold lifted
    clock.advance(dispatch.WAITING_REFRESH_S + 0.1)
    assert passes() == 1  # too old: the free memory in them may have changed
    cancel_queued(store, job_ids(store, JobState.QUEUED)[0], "cancelled")  # the head leaves the queue
    assert passes() == 1
