"""Start-up overlap: a job starts ahead of the attempt whose end makes room for it, when its
start-up hold fits now and the end falls within its start-up; and the simulator's start-up phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.packing.__main__ import run_all
from benchmarks.packing.daemon_policy import OraclePolicy
from benchmarks.packing.simulator import Simulator
from benchmarks.packing.trace import Trace, TraceGpu, TraceJob, load_trace
from orchestrator.scheduling.packing.overlap import fits_ahead
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt

TRACES = Path(__file__).resolve().parent.parent / "benchmarks" / "traces"
GIB = 1024


def _fits(**changes: object) -> bool:
    values: dict[str, object] = {"need_mib": 16_000, "startup_mib": 1_000, "ahead_s": 38.0, "available_mib": 8_000,
                                 "used_slots": 1, "slots": 4, "frees": [(100.0, 16_000)], "now_s": 70.0}
    values.update(changes)
    return fits_ahead(**values)  # type: ignore[arg-type]


def test_fits_ahead_needs_an_end_within_the_start_up_and_room_then() -> None:
    assert _fits()  # ends at 100 s, within 70 + 38; 8,000 + 16,000 free then
    assert not _fits(now_s=50.0)  # the end is 50 s away: the job would be ready before the room is
    assert not _fits(ahead_s=None) and not _fits(ahead_s=0.0)  # start-up never measured
    assert not _fits(startup_mib=9_000)  # what it holds while starting does not fit now
    assert not _fits(frees=[(100.0, 4_000)])  # that end does not free enough
    assert not _fits(used_slots=5, slots=4)  # no plan slot free even after that end
    assert not _fits(frees=[(float("inf"), 16_000)])  # an attempt of unknown length


def _card(free_mib: int) -> list[GpuState]:
    return [GpuState(0, "GPU-0", 24 * GIB, free_mib, 4)]


def test_pack_starts_a_job_ahead_only_with_overlap_on() -> None:
    running = [RunningAttempt(1, 0, 15_700, 15_700, reached_peak=True, expected_end_s=100.0)]
    job = QueuedJob(2, 0, 2, 15_700, 0.0, expected_duration_s=84.0, ahead_s=38.0, startup_mib=1_000)
    free = 24 * GIB - 15_700
    plain = pack([job], _card(free), running, PackingPolicy(headroom_max_mib=1024), 70.0)
    assert plain.placements == ()
    ahead = pack([job], _card(free), running, PackingPolicy(headroom_max_mib=1024, overlap=True), 70.0)
    assert [(p.job_id, p.ahead) for p in ahead.placements] == [(2, True)]  # its start event says so
    roomy = pack([job], _card(24 * GIB), [], PackingPolicy(headroom_max_mib=1024, overlap=True), 70.0)
    assert [(p.job_id, p.ahead) for p in roomy.placements] == [(2, False)]  # it fits now: not ahead
    too_early = pack([job], _card(free), running, PackingPolicy(headroom_max_mib=1024, overlap=True), 40.0)
    assert too_early.placements == ()
    alone = QueuedJob(3, 0, 3, 15_700, 0.0, run_alone=True, ahead_s=38.0, startup_mib=1_000)
    assert (
        pack(
            [alone], _card(free), running, PackingPolicy(headroom_max_mib=1024, overlap=True), 70.0
        ).placements
        == ()
    )


def test_two_jobs_do_not_both_take_one_ending_attempts_room() -> None:
    running = [RunningAttempt(1, 0, 15_700, 15_700, reached_peak=True, expected_end_s=100.0)]
    jobs = [QueuedJob(j, 0, j, 15_700, 0.0, ahead_s=38.0, startup_mib=1_000) for j in (2, 3)]
    decision = pack(jobs, _card(24 * GIB - 15_700), running, PackingPolicy(headroom_max_mib=1024, overlap=True), 70.0)
    assert [p.job_id for p in decision.placements] == [2]


def _job(name: str, startup_s: float) -> TraceJob:
    return TraceJob(name, name, "t", 0, 6 * GIB, (6 * GIB,) * 5, (1.0,) * 5, 6.0, startup_s=startup_s,
                    startup_mib=512.0)  # fmt: skip


def test_a_start_up_does_no_work_and_takes_no_share_of_the_card() -> None:
    # A starts at 0 (30 s start-up, then 60 s of work alone); B starts with it but its start-up
    # is 60 s: A trains alone for 30 s, then both share the card
    trace = Trace((TraceGpu(0, 24 * GIB, 0.0),), (2,), (_job("A", 30.0), _job("B", 60.0)), sharing=(0.0, 1.0, 1.5))
    result = Simulator(trace).run(OraclePolicy(trace))
    ends = sorted(r.end_s for r in result.records)
    # A: 30 s alone by t=60 (half its work), then at 0.75 of solo speed: 30 / 0.75 = 40 s more
    assert ends[0] == pytest.approx(100.0)
    # B: from 60 s at 0.75 until A ends (40 s -> 30 s of work), then alone for the other 30 s
    assert ends[1] == pytest.approx(130.0)


def test_overlap_shortens_the_scarce_trl_trace_and_counts_its_ooms() -> None:
    trace = load_trace(TRACES / "trl_scarce_1x24.yaml")
    results = run_all(trace, PackingPolicy(), ("oracle", "oracle overlap", "orch", "orch overlap"))
    assert results["oracle overlap"].makespan_min < 0.85 * results["oracle"].makespan_min
    assert results["orch overlap"].makespan_min < results["orch"].makespan_min
    assert results["orch overlap"].failed_jobs == 0


def test_the_trl_benchmark_reports_each_jobs_slowdown_when_stacked() -> None:
    from benchmarks.gpu.trl_sweep import slowdowns

    def attempt(job: int, config: str, start: float, end: float, outcome: str = "succeeded") -> dict[str, object]:
        return {"job": job, "config": config, "outcome": outcome, "started_at": start, "ended_at": end}

    serial = {"attempts": [attempt(1, "b256", 0, 80), attempt(2, "b256", 80, 160), attempt(3, "b128", 160, 220)]}
    stacked = {"attempts": [attempt(1, "b256", 0, 20, "oom"), attempt(1, "b256", 20, 120), attempt(2, "b256", 0, 80),
                            attempt(3, "b128", 10, 100)]}  # fmt: skip
    found = slowdowns(stacked, serial)
    assert found["per_job"] == {"1": 1.25, "2": 1.0, "3": 1.5}  # an OOM'd attempt is not a run time
    assert found["median"] == 1.25 and found["worst"] == 1.5
