"""The multi-GPU and host-RAM benchmark: its accounting on small traces, and orch on the trace."""

from __future__ import annotations

from pathlib import Path

from benchmarks.packing.resources import (
    Job,
    Machine,
    list_policy,
    load,
    lower_bound_min,
    main,
    orch_policy,
    report,
    simulate,
)

TRACE = Path(__file__).resolve().parent.parent / "benchmarks" / "traces" / "gangs_host_4x24.yaml"
FOUR = Machine((24.0,) * 4, 64.0, 4.0)


def test_a_host_blind_launcher_is_killed_and_orch_holds_back() -> None:
    jobs = [Job(f"j{i}", "lora", 1, 8, 25, 10) for i in range(3)]  # two fit 60 GiB, three do not
    greedy = simulate(FOUR, jobs, list_policy(host_aware=False, backfill=True))
    assert greedy.host_oom_kills >= 1 and greedy.lost_gpu_min >= 1.0
    orch = simulate(FOUR, jobs, orch_policy)
    assert (orch.host_oom_kills, orch.makespan_min) == (0, 20.0)


def test_orch_reserves_for_a_gang_that_greedy_backfill_starves() -> None:
    # staggered one-GPU jobs keep at least one card busy until the stream ends
    stream = [Job(f"s{i}", f"c{i % 4}", 1, 8, 1, 10 + (i % 4) * 3) for i in range(16)]
    jobs = [*stream[:4], Job("gang", "tp", 4, 20, 4, 30), *stream[4:]]
    greedy = simulate(FOUR, jobs, list_policy(host_aware=True, backfill=True))
    orch = simulate(FOUR, jobs, orch_policy)
    assert orch.max_gang_wait_min < greedy.max_gang_wait_min
    assert orch.partial_gangs == greedy.partial_gangs == 0


def test_the_trace_report_puts_orch_near_the_bound_without_kills(capsys) -> None:  # type: ignore[no-untyped-def]
    machine, jobs = load(TRACE)
    data = report(machine, jobs)
    bound = lower_bound_min(machine, jobs)
    policies = data["policies"]
    assert isinstance(policies, dict)
    for r in policies.values():
        assert r["makespan_min"] >= bound and r["partial_gangs"] == 0
    assert policies["orch"]["host_oom_kills"] == 0 and policies["greedy"]["host_oom_kills"] > 0
    assert main(["--trace", str(TRACE)]) == 0
    assert "oracle" in capsys.readouterr().out
