"""Jobs that share a warm LoRA worker process (`share_base`): which live attempts name one
process in their share.json, and each suite's cap on fused group size after a group ran out of
memory (kept across daemon restarts)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.lifecycle import AttemptOutcome
from orchestrator.plans.model import ShareBase
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event
from orchestrator.store.rows import Attempt


@dataclass(frozen=True)
class LiveShare:
    """A live attempt whose job a warm process trains, as its share.json said."""

    job_id: int
    gpu_index: int
    mode: str
    process: str
    pid: int
    base_mib: int | None


def live_shares(store: Store) -> list[LiveShare]:
    """Every live attempt that names a warm process, in job order."""
    rows = store.query(
        "SELECT job_id, gpu_index, share_mode, share_process, share_pid, share_base_mib FROM attempts "
        "WHERE outcome IS NULL AND share_process IS NOT NULL AND share_pid IS NOT NULL ORDER BY job_id"
    )
    return [LiveShare(int(r["job_id"]), int(r["gpu_index"]), str(r["share_mode"]), str(r["share_process"]),
                      int(r["share_pid"]), r["share_base_mib"]) for r in rows]


def members_now(store: Store, process: str, pid: int, attempt_id: int) -> int:
    """How many attempts the process trains now: the live ones naming it, with `attempt_id`
    (which may be ending) counted once."""
    rows = store.query(
        "SELECT count(*) AS n FROM attempts WHERE share_process = ? AND share_pid = ? "
        "AND (outcome IS NULL OR id = ?)", [process, pid, attempt_id],
    )
    return max(1, int(rows[0]["n"]))


def group_ooms_before(store: Store, attempt: Attempt) -> int:
    """Earlier attempts of the attempt's job that ended as their fused group's OOM."""
    return int(store.query("SELECT count(*) AS n FROM attempts WHERE job_id = ? AND outcome = ? AND id != ?",
                           [attempt.job_id, AttemptOutcome.GROUP_OOM.value, attempt.id])[0]["n"])


def fused_caps(store: Store) -> dict[str, int]:
    """Suite -> the most members its fused groups may have now (only suites whose groups ran
    out of memory; the others keep their `fused_members`)."""
    return {str(r["suite"]): int(r["cap"]) for r in store.query("SELECT suite, cap FROM fused_caps")}


def lower_fused_cap(store: Store, suite: str, cap: int, reason: str) -> bool:
    """Make the suite's fused groups at most `cap` members (never raised here), with an event
    when it went down; False when it was that low already."""
    with store.write():
        rows = store.query("SELECT cap FROM fused_caps WHERE suite = ?", [suite])
        if rows and int(rows[0]["cap"]) <= cap:
            return False
        store.execute(
            "INSERT INTO fused_caps (suite, cap, lowered_at, reason) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(suite) DO UPDATE SET cap = excluded.cap, lowered_at = excluded.lowered_at, "
            "reason = excluded.reason", [suite, cap, store.now_s(), reason],
        )
        add_event(store, "fused", f"suite {suite}: fused groups now have at most {cap} "
                                  f"member{'s' * (cap != 1)} ({reason})")
    return True


def shares_label(mode: str | None, process: str | None, job_ids: list[int]) -> str:
    """`fused ab12-0 · jobs 3,4,5` (the running jobs of one process) or `warm ab12-0` (a
    sequential warm process, one job at a time); "" where the attempt trains in its own."""
    if not mode or not process:
        return ""
    short = process if len(process) <= 12 else f"{process.split('-')[0][:4]}-{process.rsplit('-', 1)[-1]}"
    if mode == ShareBase.FUSED.value:
        return f"fused {short} · jobs {','.join(str(j) for j in sorted(job_ids))}"
    return f"warm {short}"


def slots_taken(attempts: Iterable[Attempt]) -> int:
    """The plan slots these attempts of one card take: the members of one fused process take one
    between them (the daemon places a fused group's joiners without a slot), told by the process
    the daemon placed them in (`fuse_process`, from their start) or else by the one their
    share.json names (written seconds later); every other attempt one."""
    processes: set[tuple[str | int, ...]] = set()
    alone = 0
    for a in attempts:
        if a.fuse_process is not None:
            processes.add(("placed", a.fuse_process))
        elif a.share_mode == ShareBase.FUSED.value and a.share_process and a.share_pid is not None:
            processes.add((a.share_process, a.share_pid))
        else:
            alone += 1
    return alone + len(processes)


def share_labels(live: Iterable[Attempt]) -> dict[int, str]:
    """Attempt id -> its `shares` label (shares_label), for the live attempts that name a warm
    process; a process is told by its name and pid together (a name is reused by the next)."""
    attempts = [a for a in live if a.share_mode and a.share_process and a.share_pid is not None]
    jobs: dict[tuple[str | None, int | None], list[int]] = {}
    for a in attempts:
        jobs.setdefault((a.share_process, a.share_pid), []).append(a.job_id)
    return {a.id: shares_label(a.share_mode, a.share_process, jobs[(a.share_process, a.share_pid)])
            for a in attempts}
