"""What an ended attempt means and what its job does next, from values alone: `classify_end`
turns the evidence (exit record, result, log tail, orch's own kill request, the cluster's word)
into one verdict, and `decide_next` turns the verdict, the job and its ladder into the job's next
state. No store, run dir or clock: `orchestrator.attempts.outcomes` gathers and writes."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.attempts.classify import (
    REASON_CONFIG_ERROR,
    REASON_SIGKILL,
    Classification,
    classify_attempt,
)
from orchestrator.attempts.disk_space import disk_full_evidence
from orchestrator.executors.remote_verdict import ClusterEnd
from orchestrator.lifecycle import AttemptOutcome, JobState, KillRequest
from orchestrator.plans.early_stop import describe_pruned
from orchestrator.prediction.job_facts import as_received, job_host_settings, job_ladder
from orchestrator.prediction.ladder import Level, retry_decision, with_host_settings
from orchestrator.store.rows import Job


@dataclass(frozen=True)
class CheckpointLeft:
    """The checkpoint the job's next attempt would resume from."""

    attempt_n: int  # the attempt whose run dir holds it
    path: str
    # left by the attempt that ended, at a later step than the checkpoint it resumed from: it got
    # further (a checkpoint rewritten at the same step is no progress)
    progress: bool


@dataclass(frozen=True)
class EndEvidence:
    """What is known of how an attempt ended, read from its run dir, its row and the cluster."""

    exit_record: dict[str, Any] | None  # the wrapper's exit.json
    result: dict[str, Any] | None  # the worker's result.json, when this attempt's own
    log_tail: str
    kill_reason: KillRequest | None  # why orch asked it to stop, if it did
    lost: bool = False  # its process vanished without an exit record orch can trust
    hung: bool = False  # killed by the daemon as silent past its hang timeout
    disk_full_now: bool = False  # the runs dir's filesystem is below its free-space minimum
    remote_end: ClusterEnd | None = None  # the cluster's own word (Slurm's TIMEOUT, PREEMPTED, ...)
    not_started: str | None = None  # why its worker never started through no fault of its own
    kernel_oom_kill: bool = False  # the kernel log names a process of the attempt as OOM-killed
    checkpoint: CheckpointLeft | None = None  # what the job's next attempt would resume from
    diverged: str | None = None  # why the divergence rule flagged its loss
    fail_on_divergence: bool = False  # the suite's: a flagged run fails (never retried: it would again)
    fused: bool = False  # its job has `share_base: fused`: the only kind whose worker may report a group's OOM


@dataclass(frozen=True)
class EndVerdict:
    """How the attempt ended; `disk_full`: why a full disk is blamed (None: it is not); and what
    of the evidence the decision needs beside it: orch's own stop request, the cluster's word."""

    classification: Classification
    disk_full: str | None = None
    kill_reason: KillRequest | None = None
    remote_end: ClusterEnd | None = None
    resumes_from: CheckpointLeft | None = None  # a death the next attempt resumes from
    # why the end is not the job's doing (a hang-up from outside, a launch that never
    # happened): requeued unchanged without using up one of its attempts
    not_the_jobs: str | None = None


# stop requests that end the attempt as the user (or early stopping) asked, not as a failure
STOPS_ASKED = (KillRequest.CANCEL, KillRequest.RETRY, KillRequest.PRUNE)


def ended_by_itself(exit_record: dict[str, object] | None) -> bool:
    """The wrapper recorded the worker's end and no signal reached it: the worker ended on its
    own, so no stop request (cancel, retry) can have ended it. Records from wrappers that did
    not name the signals they received prove nothing either way (False)."""
    return exit_record is not None and exit_record.get("received") == []


def classify_end(evidence: EndEvidence) -> EndVerdict:
    """The attempt's outcome: the classifier's reading of its files, overruled by the cluster's
    word, by a hang-up signal orch did not send (lost, not failed), or by a full disk."""
    exit_record, result = evidence.exit_record, evidence.result
    kill_reason = evidence.kill_reason
    verdict = classify_attempt(
        exit_code=(exit_record or {}).get("exit_code"),
        signal=(exit_record or {}).get("signal"),
        result=result,
        log_tail=evidence.log_tail,
        # a stop request ends an attempt only if it came before the worker's own end
        cancelled=kill_reason in STOPS_ASKED and not ended_by_itself(exit_record),
        exit_record_present=exit_record is not None and not evidence.lost,
        hung=evidence.hung or kill_reason is KillRequest.HUNG,
        kernel_oom_kill=evidence.kernel_oom_kill or bool((exit_record or {}).get("oom_kills")),
        fused=evidence.fused,
    )
    remote_end, resumes_from = evidence.remote_end, None
    not_the_jobs = evidence.not_started
    if remote_end is not None:
        verdict = Classification(remote_end.outcome, remote_end.reason, retryable=remote_end.retryable)
    elif stopped_from_outside(verdict.outcome, kill_reason, exit_record, result):
        verdict = Classification(AttemptOutcome.LOST, f"stopped by a signal orch did not send ({verdict.reason})")
        not_the_jobs = "stopped from outside (a tmux server killed, a stray signal)"
    elif sigkilled_with_checkpoint(verdict, kill_reason, evidence.checkpoint):
        resumes_from = evidence.checkpoint
        verdict = Classification(AttemptOutcome.LOST, f"{REASON_SIGKILL}; a checkpoint is left to resume from")
    elif not_the_jobs is not None and result is None:
        verdict = Classification(AttemptOutcome.LOST, not_the_jobs)
    disk_full = disk_full_cause(verdict, kill_reason, evidence.disk_full_now, evidence.log_tail, result, exit_record)
    if disk_full is not None:
        verdict, resumes_from = Classification(AttemptOutcome.LOST, f"disk full ({disk_full})"), None
    if verdict.outcome is AttemptOutcome.CANCELLED and kill_reason is KillRequest.PRUNE:
        verdict = Classification(AttemptOutcome.PRUNED, "pruned by early stopping", retryable=False)
    if verdict.outcome is AttemptOutcome.SUCCEEDED and evidence.diverged and evidence.fail_on_divergence:
        verdict = Classification(AttemptOutcome.FAILED, f"diverged: {evidence.diverged} (fail_on_divergence)",
                                 retryable=False)
    return EndVerdict(verdict, disk_full, kill_reason, remote_end, resumes_from,
                      not_the_jobs if verdict.outcome is AttemptOutcome.LOST else None)


def sigkilled_with_checkpoint(
    verdict: Classification, kill_reason: KillRequest | None, checkpoint: CheckpointLeft | None
) -> bool:
    """A SIGKILL orch did not send, with no OOM evidence, where a checkpoint is left: a death
    (the work done so far is kept), not the run failing on its own."""
    return (checkpoint is not None and kill_reason is None and verdict.outcome is AttemptOutcome.FAILED
            and verdict.reason == REASON_SIGKILL)  # fmt: skip


def disk_full_cause(
    verdict: Classification, kill_reason: KillRequest | None, disk_full_now: bool, log_tail: str,
    result: dict[str, Any] | None, exit_record: dict[str, Any] | None,
) -> str | None:
    """Why an attempt that failed or was lost is put down to a full disk (ENOSPC/EDQUOT named in
    its log, result or exit record, or the runs filesystem full right now); None otherwise."""
    if verdict.outcome not in (AttemptOutcome.FAILED, AttemptOutcome.LOST) or kill_reason:
        return None
    evidence = disk_full_evidence(
        (result or {}).get("error"), (exit_record or {}).get("error"), log_tail[-4096:]
    )
    if evidence is not None:
        return evidence
    return "the runs dir's filesystem is full" if disk_full_now else None


# The terminal went away (tmux server killed: SIGHUP, forwarded by the wrapper as SIGTERM) or
# someone outside orch sent SIGTERM/SIGHUP: no evidence against the job, so it is lost, not failed.
HANGUP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)
HANGUP_SIGNAL_NAMES = frozenset(s.name for s in HANGUP_SIGNALS)
HANGUP_EXIT_CODES = tuple(128 + s for s in HANGUP_SIGNALS)


def stopped_from_outside(
    outcome: AttemptOutcome, kill_reason: KillRequest | None, exit_record: dict[str, Any] | None,
    result: dict[str, Any] | None,
) -> bool:
    if outcome is not AttemptOutcome.FAILED or kill_reason or result is not None or exit_record is None:
        return False
    received = exit_record.get("received")
    if isinstance(received, list):  # the wrapper says which signals reached it: no guessing
        return any(name in HANGUP_SIGNAL_NAMES for name in received)
    # Records written before the wrapper named its signals: infer from the exit status.
    return exit_record.get("signal") in HANGUP_SIGNALS or exit_record.get("exit_code") in HANGUP_EXIT_CODES


@dataclass(frozen=True)
class NextStep:
    """What the job does after the attempt: its next state and the job columns written with
    the attempt's end, the words of its event, and (for a move down the ladder or a host-side
    step) the retry's record."""

    job_state: JobState
    job_fields: dict[str, Any]
    why: str
    retry: dict[str, Any] | None = None

    @property
    def counted(self) -> bool:
        """False: requeued without using up one of the job's max_attempts (a resume included)."""
        return "max_attempts" not in self.job_fields and "resumes" not in self.job_fields

    @property
    def next_level(self) -> int | None:
        """The ladder level a requeued job moves to; None where it stays."""
        level = self.job_fields.get("level")
        return level if isinstance(level, int) else None


def pruned_reason(job: Job) -> str:
    """The words of a pruned job's end: at which step and why (its `pruned` record)."""
    record = job.pruned
    if not record:
        return "pruned by early stopping"
    return describe_pruned(record)


MAX_GROUP_OOMS = 4  # halvings from the largest group (16) to 1: a job's group OOMs past these are its own


def fused_cap_after(members: int | None) -> int:
    """The most members a suite's fused group may have after a group of `members` ran out of
    memory: half as many, at least 1 (where a job runs alone and its OOM is its own)."""
    return max(1, (members or 2) // 2)


def bounded_group_oom(verdict: EndVerdict, group_ooms_so_far: int) -> EndVerdict:
    """The verdict as it is decided and stored: a fused group's OOM of a job that had
    MAX_GROUP_OOMS of them already (more than halving 16 down to 1 takes) is its own OOM, so the
    attempt is kept as `oom`, goes down the ladder and lowers no suite's cap again."""
    outcome = verdict.classification
    if outcome.outcome is not AttemptOutcome.GROUP_OOM or group_ooms_so_far < MAX_GROUP_OOMS:
        return verdict
    own = Classification(AttemptOutcome.OOM, f"{outcome.reason}, its job's group OOM number "
                                             f"{group_ooms_so_far + 1}: taken as its own OOM")
    return replace(verdict, classification=own)


def _uncounted(job: Job, why: str) -> NextStep:
    return NextStep(JobState.QUEUED, {"reason": None, "max_attempts": job.max_attempts + 1}, why)


def _resume(job: Job, checkpoint: CheckpointLeft) -> NextStep:
    """A death after progress (a checkpoint at a later step): resumed without using up one of
    its max_attempts, at most `max_resumes` times; a job killed over and over before its next
    save uses up its attempts instead (the counted rules)."""
    if job.resumes >= job.max_resumes:
        reason = (f"killed by SIGKILL again after {job.resumes} resumes from a checkpoint, "
                  f"the most its suite allows (max_resumes: {job.max_resumes})")
        return NextStep(JobState.FAILED, {"reason": reason}, f"failed: {reason}")
    return NextStep(JobState.QUEUED, {"reason": None, "resumes": job.resumes + 1},
                    f"killed by SIGKILL with a checkpoint left: resumes from {checkpoint.path} "
                    f"(resume {job.resumes + 1} of at most {job.max_resumes}), not counted")


def decide_next(
    job: Job, levels: Sequence[Level], level: Level, verdict: EndVerdict, *, hung_retries_so_far: int = 0,
    ran_alone: bool = False, resumed_from: str | None = None, group_ooms_so_far: int = 0,
    trial_fence_mib: int | None = None,
) -> NextStep:
    """The job's next step after an attempt at `level` (of its ladder `levels`) ended as
    `verdict`. `job.attempt_count` counts the attempt that ended (`job.counted_attempts`: those
    that use up its max_attempts); `hung_retries_so_far`: its job's earlier attempts killed as
    hung; `ran_alone`: no other attempt was on its card; `resumed_from`: the checkpoint the
    attempt was given, if any; `group_ooms_so_far`: its job's earlier attempts ended as their
    fused group's OOM (bounded_group_oom); `trial_fence_mib`: the attempt started on trial into that
    much room, less than its prediction, fenced there by MPS (orchestrator.scheduling.packing.trial)."""
    verdict = bounded_group_oom(verdict, group_ooms_so_far)
    outcome, kill_reason, remote_end = verdict.classification, verdict.kill_reason, verdict.remote_end
    if verdict.disk_full is not None:
        # Not the job's fault: requeued unchanged and not counted; it waits while the disk is full.
        return _uncounted(job, "requeued unchanged, not counted: waits until the disk has space")
    if verdict.not_the_jobs is not None and kill_reason is None:
        return _uncounted(job, f"requeued unchanged, not counted: {verdict.not_the_jobs}")
    if outcome.outcome is AttemptOutcome.SUCCEEDED:
        # its worker finished before a cancel or retry could stop it: the result is kept
        return NextStep(JobState.SUCCEEDED, {"reason": None}, "succeeded")
    if kill_reason is KillRequest.RETRY:
        return NextStep(JobState.QUEUED, {"reason": None}, "stopped by orch retry; requeued")
    if kill_reason is KillRequest.CANCEL:  # whatever ended it, the user wants it to run no more
        return NextStep(JobState.CANCELLED, {"reason": "cancelled by user"}, "cancelled")
    if kill_reason is KillRequest.PRUNE:  # whatever ended it, its setting is stopped: never retried
        why = pruned_reason(job)
        return NextStep(JobState.PRUNED, {"reason": why}, why)
    if outcome.outcome is AttemptOutcome.GROUP_OOM:
        # its group's memory, not its own: same level, uncounted, from its last checkpoint if any;
        # the suite's groups are made smaller (bounded: at a cap of 1 an OOM is the job's own)
        cap = fused_cap_after(outcome.group_members)
        return _uncounted(job, f"requeued unchanged, not counted: {outcome.reason}; "
                               f"fused groups of suite {job.suite} now have at most {cap} member{'s' * (cap != 1)}")
    if outcome.outcome is AttemptOutcome.OOM and trial_fence_mib is not None:
        # orch's gamble, not the job's: it was given less than its prediction asked. Its shape's
        # record now holds the OOM, so its next start waits for the room its prediction asks.
        return _uncounted(job, f"requeued unchanged, not counted: it ran out of memory in the "
                               f"{trial_fence_mib / 1024:.1f} GiB it was started into on trial (its MPS fence, "
                               "less than its prediction); it starts next where its prediction fits")
    resumes_from = verdict.resumes_from
    if resumes_from is not None and resumes_from.progress:
        return _resume(job, resumes_from)
    attempts_left = job.counted_attempts < job.max_attempts
    if remote_end is not None and remote_end.next_mem_mib and attempts_left:
        # Slurm's OUT_OF_MEMORY: the same level again with twice the host memory it was given
        slurm = {**job.slurm, "mem_mib": remote_end.next_mem_mib, "mem_per_gpu_mib": None}
        return NextStep(JobState.QUEUED, {"reason": None, "slurm_json": json.dumps(slurm, sort_keys=True)},
                        f"requeued at level {level.index} with --mem={remote_end.next_mem_mib}M")
    if remote_end is not None and not remote_end.counted:
        # preempted, or stopped at a time limit it resumes from: not the job's fault
        return _uncounted(job, "requeued unchanged, not counted")
    if outcome.outcome is AttemptOutcome.CANCELLED:
        return NextStep(JobState.CANCELLED, {"reason": "cancelled by user"}, "cancelled")
    refused = (outcome.outcome is AttemptOutcome.FAILED
               and outcome.reason.startswith(REASON_CONFIG_ERROR))
    if refused and resumed_from is not None and attempts_left:
        # its worker refused the checkpoint (cut short, another run's): the next attempt starts
        # fresh, from none of the checkpoints so far; a config error then fails it for good
        return NextStep(JobState.QUEUED, {"reason": None, "fresh_after_attempt": job.attempt_count},
                        "requeued to start fresh: its worker refused the checkpoint it resumed "
                        f"from ({outcome.reason})")
    host = job_host_settings(job)
    decision = retry_decision(
        outcome.outcome, outcome.reason, job.counted_attempts, levels, level.index,
        job.max_attempts,
        retryable=outcome.retryable, hung_retries_so_far=hung_retries_so_far, host=host,
        strict=job_ladder(job).strict, ran_alone=ran_alone,
    )
    if decision.action != "requeue" or decision.level is None:
        # the attempt's reason is said once in the event: "job failed" when the job's is the same
        why = "job failed" if decision.why == outcome.reason else f"failed: {decision.why}"
        return NextStep(JobState.FAILED, {"reason": decision.why}, why)
    fields: dict[str, Any] = {"level": decision.level.index, "reason": None}
    moved, stepped = decision.level.index != level.index, decision.host != host
    if not (moved or stepped):
        return NextStep(JobState.QUEUED, fields, f"requeued unchanged at level {level.index}")
    retry: dict[str, Any] = {"from_level": level.index, "to_level": decision.level.index, "why": outcome.reason}
    if stepped:  # a host OOM's step: kept by every later attempt, whatever its level
        fields["host_steps_json"] = json.dumps(decision.host.to_records(), sort_keys=True)
        retry["host_step"] = decision.host.steps[-1].to_record()
    why = f"requeued at {as_received(job, with_host_settings(decision.level, decision.host)).describe()}"
    return NextStep(JobState.QUEUED, fields, why, retry)

