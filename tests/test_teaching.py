"""The first job of each model and data whose memory nothing has taught yet starts early."""

from __future__ import annotations

from pathlib import Path

from store_helpers import declared_plan

from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
from orchestrator.prediction.job_facts import job_prompt_length_key
from orchestrator.scheduling.dispatch import DispatchContext, schedule
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob
from orchestrator.scheduling.state import SchedulerState
from orchestrator.scheduling.teaching import teaching_jobs, untaught
from orchestrator.store import Store
from orchestrator.store.attempts import (
    record_prompt_length,
    start_attempt,
    update_attempt,
)
from orchestrator.store.jobs import set_gpu_plan, submit_jobs
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.queries import get_job
from tests.conftest import REPO_ROOT
from tests.store_reads import read_jobs
from tests.test_scale import _Recorder


def test_untaught_until_a_run_of_the_model_and_data_reports_or_a_peak_is_measured() -> None:
    for kind in (SourceKind.DECLARED, SourceKind.ESTIMATE, SourceKind.NONE):
        assert untaught(PredictionSource(kind), length_learned=False)
        assert not untaught(PredictionSource(kind), length_learned=True)
    for kind in (SourceKind.MEASURED, SourceKind.RUNNING, SourceKind.LEVEL, SourceKind.TASK, SourceKind.OOM_FLOOR):
        assert not untaught(PredictionSource(kind), length_learned=False)


def test_one_job_per_untaught_group_the_first_in_queue_order() -> None:
    kinds = [(1, None, 5), (2, "3b|rte", 1), (3, "3b|rte", 2), (4, "3b|mrpc", 3), (5, "1b|rte", 1)]
    # 1 is taught; 3b|rte teaches its second kind through its first job; 1b|rte is one job alone
    assert teaching_jobs(kinds, learning=set()) == {2, 4}
    # a running job of 3b|mrpc teaches it already: its queued jobs keep their place
    assert teaching_jobs(kinds, learning={"3b|mrpc"}) == {2}
    assert teaching_jobs([], learning=set()) == set()


def test_a_teaching_job_counts_as_longest_under_longest_first_only() -> None:
    one_slot = [GpuState(0, "GPU-0", 10_240, 10_240, 1)]
    queue = [
        QueuedJob(1, 0, 1, 6_000, 0.0, expected_duration_s=3_600.0),
        QueuedJob(2, 0, 2, 6_000, 0.0, expected_duration_s=60.0, teaches=True),
    ]
    policy = PackingPolicy(headroom_fraction=0.0)
    assert [p.job_id for p in pack(queue, one_slot, [], policy, 0.0).placements] == [2]
    # priority still comes first, and fifo keeps queue order
    urgent = [QueuedJob(3, 1, 3, 6_000, 0.0, expected_duration_s=1.0), *queue]
    assert [p.job_id for p in pack(urgent, one_slot, [], policy, 0.0).placements] == [3]
    fifo = PackingPolicy(headroom_fraction=0.0, order="fifo")
    assert [p.job_id for p in pack(queue, one_slot, [], fifo, 0.0).placements] == [1]


def test_the_daemon_starts_a_short_job_of_an_untaught_model_and_data_before_longer_ones(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    suite = load_suite("E5", REPO_ROOT / "plans")
    # config-major: every config's glue_sst2 seeds, then its glue_rte seeds
    specs = expand_jobs(suite, parse_pairs("1:glue_sst2 2:glue_sst2 1:glue_rte 2:glue_rte"), {}, None, 0)
    submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False)
    rows = read_jobs(store)
    sst2 = [job.id for job in rows if job.data == "glue_sst2"]
    rte = [job.id for job in rows if job.data == "glue_rte"]
    # one run of each task finished: SST-2 took an hour and reported its prompt lengths; RTE
    # took a minute and reported none (its model and data stay untaught)
    for job_id, wall_s in ((sst2[0], 3_600.0), (rte[0], 60.0)):
        plan = declared_plan(job_id)
        attempt = start_attempt(store, plan, lambda n, j=job_id: tmp_path / f"run-{j}-{n}")
        update_attempt(store, attempt.id, outcome="succeeded", ended_at=attempt.started_at + wall_s)
        with store.write():
            store.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ?", [job_id])
    record_prompt_length(store, job_prompt_length_key(get_job(store, sst2[1])), 120)
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=1))
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(), {})
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80_000, used_mib=0, free_mib=80_000, processes=()),)
    cache = SchedulerState()
    first = schedule(store, gpu, _Recorder(), ctx, cache, draining=False)
    # longest first would take an hour-long SST-2 job; the first queued RTE job goes instead
    assert [p.job_id for p in first.placements] == [rte[1]]
    # while it runs it is teaching RTE: the next free slot goes to the longest job again
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=2))
    second = schedule(store, gpu, _Recorder(), ctx, cache, draining=False)
    assert [p.job_id for p in second.placements] == [sst2[1]]


def test_the_benchmarks_orch_uses_the_rule_and_meets_the_goal_on_the_foreign_memory_trace() -> None:
    from benchmarks.packing.daemon_policy import EstimatePolicy, OraclePolicy
    from benchmarks.packing.simulator import Simulator
    from benchmarks.packing.trace import load_trace

    trace = load_trace(REPO_ROOT / "benchmarks/traces/foreign_4x48.yaml")
    oracle = Simulator(trace).run(OraclePolicy(trace))
    policy = EstimatePolicy(trace)
    orch = Simulator(trace).run(policy)
    # the goal: within 2 % of the oracle, OOM-lost work <= 0.5 % of the total
    assert orch.failed_jobs == 0 and orch.makespan_min <= 1.02 * oracle.makespan_min
    assert orch.oom_lost_gpu_min <= 0.005 * sum(j.minutes[0] for j in trace.jobs)
    # the 3B model's RTE jobs (9 min, up to 25 GiB): one starts in the first half of the sweep
    # and teaches the rest, which no longer all come last
    first_rte = min(r.start_s for r in orch.records if trace.jobs[r.job_index].id.startswith("llama-3b_lora_cfg0-rte"))
    assert first_rte < orch.makespan_min * 60 / 2
