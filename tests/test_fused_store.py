"""`share_base` in state.db: which running jobs share a process (`orch status`, its --json and
the web page, from the attempts' share.json as stored), a suite's lowered fused cap kept across
restarts, and one process's failures counted once by the crash-loop guard."""

from __future__ import annotations

import io
from pathlib import Path

import yaml
from rich.console import Console

from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.attempts.crash_loop import guard_crash_loop
from orchestrator.attempts.fused_lessons import teaches_solo_speed
from orchestrator.attempts.outcomes import complete, learn_rate
from orchestrator.cli.status.plain import plain_status
from orchestrator.cli.status.rich_view import render_status
from orchestrator.executors.observation import Observation
from orchestrator.lifecycle import JobState
from orchestrator.plans import CrashLoop, expand_jobs, load_suite, parse_pairs
from orchestrator.prediction.job_facts import JobShapeCache
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptPlan, read_attempt, start_attempt, update_attempt
from orchestrator.store.endings import recent_failure_durations
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.learning import read_throughput
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.queries import get_attempts, get_job
from orchestrator.store.queue import succeeded_runs_since
from orchestrator.store.sharing import fused_caps, lower_fused_cap, members_now
from orchestrator.store.status import paused_configs
from orchestrator.store.web_queries import overview
from tests.store_reads import events, job_ids
from tests.test_crash_loop import submit, write_suite

PLANS = Path(__file__).resolve().parents[1] / "plans"
PROCESS = "0123456789abcdef-0"


def _running(store: Store, db_path: Path, n_jobs: int) -> list[int]:
    suite = load_suite("demo", PLANS)
    pairs = " ".join(f"{seed}:glue_rte" for seed in range(1, n_jobs + 1))
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs(pairs), {}, None, 0),
                allowed_gpus=None, priority=0, force=False, dry_run=False)
    attempts = []
    for job_id in job_ids(store)[:n_jobs]:
        plan = AttemptPlan(job_id, 0, "GPU-0", 0, "base", {}, {}, False, 4096,
                           PredictionSource(SourceKind.DECLARED), 4096)
        attempts.append(start_attempt(store, plan, lambda n, j=job_id: db_path.parent / f"run-{j}-{n}").id)
    return attempts


def test_status_and_the_web_page_show_which_jobs_share_a_process(db_path: Path) -> None:
    with Store(db_path) as store:
        a = _running(store, db_path, 5)
        jobs = job_ids(store)[:5]
        for attempt_id in a[:3]:
            update_attempt(store, attempt_id, share_mode="fused", share_process=PROCESS, share_pid=4242,
                           share_base_mib=8000)
        update_attempt(store, a[3], share_mode="sequential", share_process="fedcba9876543210-1", share_pid=77)
        snapshot = status_snapshot(store)
        web = {r.job_id: r.shares for r in overview(store).running}
        assert members_now(store, PROCESS, 4242, a[0]) == 3
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/fragment/overview", headers={"X-Orch-Token": "t0ken"}).text
    fused = f"fused 0123-0 · jobs {','.join(str(j) for j in jobs[:3])}"
    shares = {r["id"]: r["shares"] for r in snapshot["running"]}
    assert shares == {jobs[0]: fused, jobs[1]: fused, jobs[2]: fused, jobs[3]: "warm fedc-1", jobs[4]: None}
    assert web == {**{j: fused for j in jobs[:3]}, jobs[3]: "warm fedc-1", jobs[4]: ""}
    assert "<th" in page and ">shares</th>" in page and page.count(f'<td class="shares">{fused}</td>') == 3
    plain = plain_status(snapshot)
    assert "shares" in plain and fused in plain and "warm fedc-1" in plain
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(render_status(snapshot, width=200))
    assert fused in console.export_text()
    for r in snapshot["running"]:
        r["shares"] = None
    assert "shares" not in plain_status(snapshot)  # no job shares: no column


def test_a_lowered_fused_cap_is_kept_and_never_raised(db_path: Path) -> None:
    with Store(db_path) as store:
        assert fused_caps(store) == {}
        assert lower_fused_cap(store, "s", 2, "a fused group of 4 members ran out of memory (job 3)")
        assert not lower_fused_cap(store, "s", 3, "later")  # a larger group's OOM raises nothing
        assert lower_fused_cap(store, "s", 1, "a fused group of 2 members ran out of memory (job 5)")
        said = [e.message for e in events(store, "fused")]
    assert said == ["suite s: fused groups now have at most 2 members (a fused group of 4 members ran out of "
                    "memory (job 3))", "suite s: fused groups now have at most 1 member (a fused group of 2 "
                    "members ran out of memory (job 5))"]
    with Store(db_path) as store:  # a daemon started again reads the same
        assert fused_caps(store) == {"s": 1}


def test_the_failures_of_one_process_count_once(db_path: Path) -> None:
    with Store(db_path) as store:
        a = _running(store, db_path, 5)
        now = store.now_s()
        for n, attempt_id in enumerate(a):
            shared = {"share_mode": "fused", "share_process": PROCESS, "share_pid": 4242} if n < 3 else {}
            update_attempt(store, attempt_id, outcome="failed", ended_at=now, **shared)
        suite, config = "demo", store.query("SELECT config_name FROM jobs LIMIT 1")[0]["config_name"]
        durations = recent_failure_durations(store, suite, config, now - 60, now + 1)
    assert len(durations) == 3  # the process's three members once, and the two others


def test_a_sequential_processes_failures_each_count_and_pause_the_config(db_path: Path) -> None:
    guard = CrashLoop(failures=3, within_s=60.0, window_s=600.0)
    with Store(db_path) as store:
        a = _running(store, db_path, 3)
        now = store.now_s()
        for attempt_id in a:  # one warm process trained them one after another under one pid
            update_attempt(store, attempt_id, outcome="failed", ended_at=now, share_mode="sequential",
                           share_process=PROCESS, share_pid=4242)
        suite, config = "demo", store.query("SELECT config_name FROM jobs LIMIT 1")[0]["config_name"]
        assert len(recent_failure_durations(store, suite, config, now - 60, now + 1)) == 3
        guard_crash_loop(store, suite, config, guard)
        assert [(p.suite, p.config) for p in paused_configs(store)] == [(suite, config)]


def test_a_fused_processes_failures_minutes_apart_each_count(db_path: Path) -> None:
    with Store(db_path) as store:
        a = _running(store, db_path, 3)
        now = store.now_s()
        for n, attempt_id in enumerate(a):
            update_attempt(store, attempt_id, outcome="failed", ended_at=now - 240 + 120 * n, share_mode="fused",
                           share_process=PROCESS, share_pid=4242)
        suite, config = "demo", store.query("SELECT config_name FROM jobs LIMIT 1")[0]["config_name"]
        assert len(recent_failure_durations(store, suite, config, now - 300, now + 1)) == 3


def test_past_its_bound_a_group_oom_is_stored_as_the_jobs_own_and_lowers_no_cap(tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "fz", worker="lora", share_base="fused", fused_members=16,
                        max_attempts=1)
    (plans / "configs" / "fz" / "a.yaml").write_text(yaml.safe_dump({"model": "tiny-llama", "batch_size": 2}))
    line = "orch: fused group of {} members ran out of memory"
    with Store(tmp_path / "state.db") as store:
        (job,) = submit(store, plans, "fz", 1)
        for n, members in enumerate((16, 8, 4, 2, 2)):  # the fifth is past MAX_GROUP_OOMS
            plan = AttemptPlan(job.id, 0, "GPU-0", 0, "base", {}, {}, False, 1024,
                               PredictionSource(SourceKind.DECLARED), 1024)
            attempt = start_attempt(store, plan, lambda k: tmp_path / "runs" / f"attempt-{k}")
            Path(attempt.run_dir).mkdir(parents=True)
            (Path(attempt.run_dir) / "stdout.log").write_text(line.format(members) + "\n")
            obs = Observation(pid_record=None, exit_record={"exit_code": 75, "signal": None, "received": []},
                              process_alive=False, last_progress=None, last_progress_at=None,
                              now_s=store.now_s())
            complete(store, attempt, obs, JobShapeCache())
            assert get_job(store, job.id).state is (JobState.QUEUED if n < 4 else JobState.FAILED)
        outcomes = [a.outcome.value for a in get_attempts(store, job.id) if a.outcome]
        assert outcomes == ["group_oom"] * 4 + ["oom"]
        assert fused_caps(store) == {"fz": 1}  # the fourth's (of 2): the fifth lowered nothing
        assert len(events(store, "fused")) == 4


def test_a_fused_members_speed_teaches_no_throughput_or_run_time(db_path: Path) -> None:
    with Store(db_path) as store:
        a = _running(store, db_path, 3)
        modes = ("fused", "sequential", None)
        for attempt_id, mode in zip(a, modes, strict=True):
            update_attempt(store, attempt_id, share_mode=mode)
        for attempt_id in a:
            attempt = read_attempt(store, attempt_id)
            assert attempt is not None
            job = get_job(store, attempt.job_id)
            learn_rate(store, attempt, job, (1, 100.0), (11, 110.0), 1, JobShapeCache())
        taught = read_throughput(store)
        assert len(taught) == 1 and taught[0].samples == 2  # the sequential and the plain attempt only
        now = store.now_s()
        for attempt_id in a:
            update_attempt(store, attempt_id, outcome="succeeded", ended_at=now)
        assert sorted(r.attempt_id for r in succeeded_runs_since(store, None)) == sorted(a[1:])
    assert [teaches_solo_speed(mode, job_fused) for mode, job_fused in
            (("fused", False), ("sequential", True), (None, True), (None, False))] == [False, True, False, True]


def test_a_fused_process_takes_one_slot_from_its_members_start_before_any_share_json() -> None:
    from orchestrator.store.sharing import slots_taken
    from tests.rows_helpers import attempt_of

    # three members the daemon placed in process 7 (no share.json written yet) and one job alone
    starting = [attempt_of(id=n, job_id=n, fuse_process=7) for n in (7, 8, 9)] + [attempt_of(id=10, job_id=10)]
    assert slots_taken(starting) == 2
    # once written, share.json's process does not count the members again
    written = [attempt_of(id=n, job_id=n, fuse_process=7, share_mode="fused", share_process="k-0", share_pid=5)
               for n in (7, 8)] + [attempt_of(id=9, job_id=9, fuse_process=7)]
    assert slots_taken(written) == 1
    # members placed before processes were named: share.json's process, as before
    legacy = [attempt_of(id=n, job_id=n, share_mode="fused", share_process="k-0", share_pid=5) for n in (1, 2)]
    assert slots_taken(legacy) == 1
