"""What an ended attempt's job does next (attempts.next_step), from plain values: no database,
no run dir."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from orchestrator.attempts.classify import Classification
from orchestrator.attempts.next_step import EndEvidence, EndVerdict, classify_end, decide_next
from orchestrator.executors.remote_verdict import ClusterEnd
from orchestrator.lifecycle import REASON_HUNG, AttemptOutcome, JobState, KillRequest
from orchestrator.prediction.ladder import Level, expand_levels, load_ladder
from orchestrator.store.rows import Job

CONFIG: dict[str, Any] = {"model": "m", "batch_size": 8, "gradient_accumulation_steps": 1, "num_data_workers": 4}
LEVELS: list[Level] = expand_levels(load_ladder(None), CONFIG, False)


def a_job(**changes: Any) -> Job:
    job = Job(
        id=1, identity="i", suite="s", config_name="c", config_path="/nonexistent/c.yaml",
        config_json=json.dumps(CONFIG), seed=0, data="d", worker="lora", declared_mib=1024, priority=0,
        state=JobState.RUNNING, level=0, attempt_count=1, max_attempts=8, one_token=False, hang_timeout_s=600.0,
        queued_at=0.0, created_at=0.0, updated_at=0.0, crash_loop_failures=0, crash_loop_within_s=60.0,
        crash_loop_window_s=600.0, gpus=1, config=dict(CONFIG),
    )
    return replace(job, **changes)


def ended(outcome: AttemptOutcome, reason: str = "r", *, retryable: bool = True, disk_full: str | None = None,
          kill_reason: KillRequest | None = None, remote_end: ClusterEnd | None = None) -> EndVerdict:
    return EndVerdict(Classification(outcome, reason, retryable=retryable), disk_full, kill_reason, remote_end)


def test_the_default_ladder_has_levels_to_step_down() -> None:
    assert len(LEVELS) >= 3 and LEVELS[1].overrides != LEVELS[0].overrides


def test_success_and_cancel_end_the_job() -> None:
    done = decide_next(a_job(), LEVELS, LEVELS[0], ended(AttemptOutcome.SUCCEEDED))
    assert (done.job_state, done.job_fields, done.retry) == (JobState.SUCCEEDED, {"reason": None}, None)
    cancelled = decide_next(a_job(), LEVELS, LEVELS[0], ended(AttemptOutcome.CANCELLED))
    assert cancelled.job_state is JobState.CANCELLED and cancelled.job_fields["reason"] == "cancelled by user"


def test_an_oom_moves_one_level_down_the_ladder() -> None:
    step = decide_next(a_job(), LEVELS, LEVELS[0], ended(AttemptOutcome.OOM, "CUDA out of memory"))
    assert step.job_state is JobState.QUEUED and step.next_level == 1 and step.counted
    assert step.retry == {"from_level": 0, "to_level": 1, "why": "CUDA out of memory"}
    assert step.why.startswith("requeued at level 1")


def test_an_oom_at_the_last_rung_fails_the_job() -> None:
    last = LEVELS[-1]
    step = decide_next(a_job(level=last.index), LEVELS, last, ended(AttemptOutcome.OOM, "CUDA out of memory"))
    assert step.job_state is JobState.FAILED and step.retry is None
    assert "OOM at every level of the degradation ladder" in step.job_fields["reason"]


def test_a_host_oom_stays_at_its_level_and_takes_a_host_step() -> None:
    step = decide_next(a_job(), LEVELS, LEVELS[0], ended(AttemptOutcome.HOST_OOM, "host RAM exhausted"))
    assert step.job_state is JobState.QUEUED and step.next_level == 0
    steps = json.loads(step.job_fields["host_steps_json"])
    assert len(steps) == 1 and step.retry is not None and step.retry["host_step"] == steps[0]


def test_a_plain_failure_fails_the_job_whatever_its_attempts_left() -> None:
    step = decide_next(a_job(attempt_count=1), LEVELS, LEVELS[0], ended(AttemptOutcome.FAILED, "KeyError: 'x'"))
    assert (step.job_state, step.job_fields, step.why) == (JobState.FAILED, {"reason": "KeyError: 'x'"}, "job failed")
    config_error = decide_next(a_job(), LEVELS, LEVELS[0], ended(AttemptOutcome.FAILED, "bad key", retryable=False))
    assert config_error.job_fields["reason"] == "bad key (not retryable)"
    assert config_error.why == "failed: bad key (not retryable)"


def test_lost_is_requeued_unchanged_while_attempts_remain() -> None:
    step = decide_next(a_job(attempt_count=2), LEVELS, LEVELS[1], ended(AttemptOutcome.LOST, "no exit record"))
    assert step.job_state is JobState.QUEUED and step.next_level == 1 and step.counted
    assert step.why == "requeued unchanged at level 1" and step.retry is None


def test_lost_with_no_attempts_left_fails() -> None:
    step = decide_next(a_job(attempt_count=8), LEVELS, LEVELS[0], ended(AttemptOutcome.LOST, "no exit record"))
    assert step.job_state is JobState.FAILED
    assert step.job_fields["reason"] == "gave up after 8 attempts; last: lost: no exit record"


def test_an_oom_with_no_attempts_left_fails_before_the_ladder_ends() -> None:
    step = decide_next(a_job(attempt_count=8), LEVELS, LEVELS[0], ended(AttemptOutcome.OOM, "CUDA out of memory"))
    assert step.job_state is JobState.FAILED and step.job_fields["reason"].startswith("gave up after 8 attempts")


def test_a_hang_is_retried_once_unchanged_then_fails() -> None:
    hung = ended(AttemptOutcome.FAILED, REASON_HUNG)
    first = decide_next(a_job(), LEVELS, LEVELS[0], hung, hung_retries_so_far=0)
    assert first.job_state is JobState.QUEUED and first.why == "requeued unchanged at level 0"
    again = decide_next(a_job(attempt_count=2), LEVELS, LEVELS[0], hung, hung_retries_so_far=1)
    assert again.job_state is JobState.FAILED


def test_a_full_disk_holds_the_job_without_counting_the_attempt() -> None:
    step = decide_next(a_job(max_attempts=3, attempt_count=3), LEVELS, LEVELS[0],
                       ended(AttemptOutcome.LOST, "disk full (ENOSPC)", disk_full="ENOSPC"))
    assert step.job_state is JobState.QUEUED and not step.counted
    assert step.job_fields == {"reason": None, "max_attempts": 4}
    assert "waits until the disk has space" in step.why


def test_orch_retry_requeues_as_it_is() -> None:
    step = decide_next(a_job(), LEVELS, LEVELS[2], ended(AttemptOutcome.CANCELLED, kill_reason=KillRequest.RETRY))
    assert (step.job_state, step.job_fields) == (JobState.QUEUED, {"reason": None})


def test_a_preempted_or_resumable_timeout_requeues_uncounted() -> None:
    preempted = ClusterEnd(AttemptOutcome.LOST, "preempted", counted=False)
    step = decide_next(
        a_job(attempt_count=8, max_attempts=8),
        LEVELS,
        LEVELS[0],
        ended(AttemptOutcome.LOST, "preempted", remote_end=preempted),
    )
    assert step.job_state is JobState.QUEUED and step.job_fields["max_attempts"] == 9 and not step.counted


def test_a_counted_slurm_timeout_fails_as_the_ladder_says() -> None:
    timeout = ClusterEnd(AttemptOutcome.FAILED, "reached its time limit (1:00:00)", retryable=False)
    step = decide_next(a_job(), LEVELS, LEVELS[0], ended(AttemptOutcome.FAILED, timeout.reason, retryable=False,
                                                             remote_end=timeout))
    assert step.job_state is JobState.FAILED and "time limit" in step.job_fields["reason"]


def test_a_slurm_out_of_memory_asks_for_more_host_memory_at_the_same_level() -> None:
    oom = ClusterEnd(AttemptOutcome.HOST_OOM, "Slurm OUT_OF_MEMORY", next_mem_mib=8192)
    verdict = ended(AttemptOutcome.HOST_OOM, oom.reason, remote_end=oom)
    step = decide_next(a_job(slurm={"mem_mib": 4096}), LEVELS, LEVELS[1], verdict)
    assert step.job_state is JobState.QUEUED and step.next_level is None and step.counted
    assert json.loads(step.job_fields["slurm_json"]) == {"mem_mib": 8192, "mem_per_gpu_mib": None}
    assert step.why == "requeued at level 1 with --mem=8192M"
    # with no attempts left, the ladder decides (a host OOM's step)
    last = decide_next(a_job(attempt_count=8), LEVELS, LEVELS[1], verdict)
    assert last.job_state is JobState.FAILED


def evidence(**kw: Any) -> EndEvidence:
    base: dict[str, Any] = {"exit_record": {"exit_code": 1}, "result": None, "log_tail": "", "kill_reason": None}
    return EndEvidence(**{**base, **kw})


def test_classify_end_reads_an_oom_from_the_log() -> None:
    verdict = classify_end(
        evidence(
            log_tail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        )
    )
    assert verdict.classification.outcome is AttemptOutcome.OOM and verdict.disk_full is None


def test_classify_end_blames_a_full_disk_and_the_cluster_word_wins() -> None:
    full = classify_end(evidence(log_tail="OSError: [Errno 28] No space left on device\n"))
    assert full.classification.outcome is AttemptOutcome.LOST and full.disk_full is not None
    assert classify_end(evidence(disk_full_now=True)).disk_full == "the runs dir's filesystem is full"
    preempted = classify_end(evidence(remote_end=ClusterEnd(AttemptOutcome.LOST, "preempted", counted=False)))
    assert (preempted.classification.outcome, preempted.classification.reason) == (AttemptOutcome.LOST, "preempted")


def test_classify_end_a_hangup_orch_did_not_send_is_lost() -> None:
    verdict = classify_end(evidence(exit_record={"exit_code": 143, "received": ["SIGTERM"]}))
    assert verdict.classification.outcome is AttemptOutcome.LOST
    killed = classify_end(
        evidence(
            exit_record={"exit_code": 143, "received": ["SIGTERM"]}, kill_reason=KillRequest.HUNG
        )
    )
    assert killed.classification.outcome is AttemptOutcome.FAILED and killed.classification.reason == REASON_HUNG


def test_a_diverged_run_fails_only_where_the_suite_says_so() -> None:
    ok = {"exit_record": {"exit_code": 0}, "result": {"status": "succeeded", "metrics": {}}}
    why = "final loss 9.2e+08 above the first steps' 0.7"
    marked = classify_end(evidence(**ok, diverged=why))
    assert marked.classification.outcome is AttemptOutcome.SUCCEEDED  # succeeded, marked in results
    failed = classify_end(evidence(**ok, diverged=why, fail_on_divergence=True))
    assert failed.classification.outcome is AttemptOutcome.FAILED and not failed.classification.retryable
    assert failed.classification.reason == f"diverged: {why} (fail_on_divergence)"
    step = decide_next(a_job(), LEVELS, LEVELS[0], failed)
    assert step.job_state is JobState.FAILED and "diverged" in step.job_fields["reason"]
    calm = classify_end(evidence(**ok, diverged=None, fail_on_divergence=True))
    assert calm.classification.outcome is AttemptOutcome.SUCCEEDED


def test_a_stop_request_after_the_worker_ended_keeps_its_own_end() -> None:
    """A cancel or retry read after the worker exited by itself (no signal reached its wrapper)
    does not make its end a cancellation: a success stays a success, a failure a failure."""
    on_its_own = {"exit_code": 0, "signal": None, "received": []}
    for request in (KillRequest.CANCEL, KillRequest.RETRY):
        kept = classify_end(
            evidence(
                exit_record=on_its_own,
                result={"status": "succeeded", "metrics": {}},
                kill_reason=request,
            )
        )
        assert kept.classification.outcome is AttemptOutcome.SUCCEEDED
        assert decide_next(a_job(), LEVELS, LEVELS[0], kept).job_state is JobState.SUCCEEDED
    failed = classify_end(evidence(exit_record={**on_its_own, "exit_code": 1}, kill_reason=KillRequest.CANCEL))
    assert failed.classification.outcome is AttemptOutcome.FAILED
    assert decide_next(a_job(), LEVELS, LEVELS[0], failed).job_state is JobState.CANCELLED
    stopped = classify_end(
        evidence(
            exit_record={"exit_code": 143, "received": ["SIGTERM"]}, kill_reason=KillRequest.CANCEL
        )
    )
    assert stopped.classification.outcome is AttemptOutcome.CANCELLED
