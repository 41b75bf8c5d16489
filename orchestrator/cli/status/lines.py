"""The dashboard's entries as text, one line each: running jobs' cells, paused suites and
configs, waiting jobs grouped by reason, ladder retries. Pure; shared by the live frame and the
piped text."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.executors.base import is_cluster_executor
from orchestrator.wording import fmt_changes, fmt_duration, fmt_setting, setting_pairs, short_keys
from orchestrator.wording import one_line as shown_one_line

RUNNING_COLUMNS = ("job", "config", "setting", "seed", "data", "GPU", "SM", "att", "lvl", "elapsed", "step",
                   "loss", "mem/pred", "shares")
# shown only where a running job has a value (SM: NVML's per-process figures; shares: a warm process)
SPARSE_COLUMNS = ("setting", "SM", "shares")
NOT_CONSIDERED = "not yet considered"


def clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def one_line(text: str) -> str:
    """Every run of whitespace (the newlines of a long OOM text included) as one space, and
    every other hidden character shown escaped (wording.one_line)."""
    return shown_one_line(" ".join(str(text).split()))


def _where(r: dict[str, Any]) -> str:
    """The GPU index; for an attempt in Slurm, its job id and state (with the pending reason)."""
    if is_cluster_executor(r.get("executor")):
        return f"{r['executor']} {r.get('executor_id') or '?'} {r.get('executor_state') or ''}".strip()
    return str(r["gpu"])


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def slots_cell(card: dict[str, Any]) -> str:
    """A card's plan slots taken of its slots, and its jobs where a fused process's members share
    one slot: `1/2 (3 jobs)`."""
    taken = card.get("slots_taken", card["running"])
    jobs = f" ({card['running']} jobs)" if card["running"] != taken else ""
    return f"{taken}/{card['slots']}{jobs}"


def slots_full(card: dict[str, Any]) -> bool:
    return bool(card.get("slots_taken", card["running"]) >= card["slots"] > 0)


def step_cell(progress: dict[str, Any]) -> str:
    """`12/40`, or `12` when the script does not say how many steps there are; `-` before any."""
    step, total = _number(progress.get("step")), _number(progress.get("total"))
    if step is None:
        return "-"
    return f"{step:.0f}/{total:.0f}" if total else f"{step:.0f}"


def setting_names(entries: list[dict[str, Any]]) -> dict[str, str]:
    """The short names of the setting keys of the jobs listed (`lr` for `learning_rate`)."""
    return short_keys(k for e in entries for k, _ in setting_pairs(e.get("overrides")))


def setting_cell(entry: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """A listed job's setting: `lr=0.001 bs=8` with `names`, else whole and one word
    (`learning_rate=0.001,batch_size=8`, for a pipe); `-` for none."""
    return fmt_setting(entry.get("overrides"), names, " " if names is not None else ",")


def sm_cell(r: dict[str, Any]) -> str:
    """The job's share of its card's SMs (`37%`), `-` where NVML gives none (simulated GPUs)."""
    sm = _number(r.get("sm_pct"))
    return "-" if sm is None else f"{sm:.0f}%"


def running_cells(r: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    progress = r["progress"] or {}
    loss = _number(progress.get("loss"))
    return [
        str(r["id"]), r["config"], setting_cell(r, names), str(r["seed"]), r["data"], _where(r),
        sm_cell(r),
        str(r["attempt"]), str(r["level"]),
        fmt_duration(r["elapsed_s"]), step_cell(progress), "-" if loss is None else f"{loss:.3f}",
        memory_cell(r),
        r.get("shares") or "-",
    ]


def memory_cell(r: dict[str, Any]) -> str:
    """What the job holds against its prediction (`7.4/13.6G`); one started on trial also names its
    MPS fence, the room it got (`7.4/13.6G, fence 7.3G`): it may not grow past that."""
    cell = f"{r['held_mib'] / 1024:.1f}/{r['predicted_mib'] / 1024:.1f}G"
    fence = _number(r.get("trial_fence_mib"))
    return cell if fence is None else f"{cell}, fence {fence / 1024:.1f}G"


def shown_columns(rows: list[list[str]], sparse: tuple[str, ...] = SPARSE_COLUMNS) -> list[str]:
    """The running table's columns, without a `sparse` one that no row has a value in."""
    return [c for c in RUNNING_COLUMNS
            if c not in sparse or any(row[RUNNING_COLUMNS.index(c)] != "-" for row in rows)]


def paused_line(p: dict[str, Any]) -> str:
    """A paused suite, or one paused config of it (`config` set)."""
    what = f"config {p['config']} of suite {p['suite']}" if p.get("config") else f"suite {p['suite']}"
    return (f"{what} paused: {p['reason']} (orch resume {p['suite']})"
            + (f"; {p['queued']} queued job(s) wait for it" if p.get("queued") else ""))


def paused_lines(snapshot: dict[str, Any]) -> list[str]:
    """Paused suites first, then the configs paused in suites that still run."""
    suites = {p["suite"] for p in snapshot["paused_suites"]}
    configs = [p for p in snapshot.get("paused_configs", []) if p["suite"] not in suites]
    return [paused_line(p) for p in [*snapshot["paused_suites"], *configs]]


def _is_paused(w: dict[str, Any], snapshot: dict[str, Any]) -> bool:
    return w.get("suite") in {p["suite"] for p in snapshot["paused_suites"]} or (
        w.get("suite"),
        w.get("config"),
    ) in {(p["suite"], p["config"]) for p in snapshot.get("paused_configs", [])}


def paused_queued(snapshot: dict[str, Any]) -> int:
    suites = {p["suite"] for p in snapshot["paused_suites"]}
    return (sum(p.get("queued") or 0 for p in snapshot["paused_suites"])
            + sum(p.get("queued") or 0 for p in snapshot.get("paused_configs", []) if p["suite"] not in suites))


def waiting_entries(snapshot: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The waiting jobs to list, and how many more are queued. A paused suite's or config's
    jobs are counted on its line, not repeated one by one."""
    waiting = [w for w in snapshot["waiting"] if not _is_paused(w, snapshot)]
    return waiting, snapshot["counts"]["queued"] - len(waiting) - paused_queued(snapshot)


def _ids(first: int, last: int, n: int) -> str:
    if n == 1:
        return f"job {first}"
    return f"jobs {first}–{last}" if last - first + 1 == n else f"jobs {first} … {last}"


def _group_settings(group: dict[str, Any], snapshot: dict[str, Any]) -> str:
    """`: 9 lr=0.001, 10 lr=0.003`: each job's setting, when the group's jobs are all among the
    first waiting ones the snapshot lists and one of them has a setting; else nothing."""
    listed = [w for w in snapshot.get("waiting", [])
              if group["first_id"] <= int(w["id"]) <= group["last_id"] and w.get("reason") == group["reason"]]
    if len(listed) != group["jobs"] or not any(w.get("overrides") for w in listed):
        return ""
    names = setting_names(listed)
    return ": " + ", ".join(f"{w['id']} {setting_cell(w, names)}" for w in listed)


def waiting_group_lines(snapshot: dict[str, Any]) -> list[str]:
    """One line per waiting reason, the largest group first: `7 waiting: all allowed GPUs at
    their plan cap (jobs 6–12)`. From `waiting_groups` (the head of the queue outside paused
    suites and configs), else from the few first jobs that `waiting` lists."""
    groups = snapshot.get("waiting_groups")
    if groups is None:
        waiting, _ = waiting_entries(snapshot)
        by_reason: dict[str | None, list[int]] = {}
        for w in waiting:
            by_reason.setdefault(w["reason"], []).append(int(w["id"]))
        groups = [{"reason": reason, "jobs": len(ids), "first_id": min(ids), "last_id": max(ids)}
                  for reason, ids in by_reason.items()]
        groups.sort(key=lambda g: (-g["jobs"], g["first_id"]))
    lines = [one_line(f"{g['jobs']} waiting: {g['reason'] or NOT_CONSIDERED} "
                      f"({_ids(g['first_id'], g['last_id'], g['jobs'])}{_group_settings(g, snapshot)})")
             for g in groups]
    rest = snapshot["counts"]["queued"] - paused_queued(snapshot) - sum(g["jobs"] for g in groups)
    if lines and rest > 0:
        lines.append(f"... and {rest} more queued (orch jobs --state queued)")
    return lines


def retry_move(retry: dict[str, Any]) -> str:
    """`level 0 -> 1`, or the host step a host-RAM OOM took while the level stayed."""
    step = retry.get("host_step")
    if isinstance(step, dict) and retry.get("from_level") == retry.get("to_level"):
        changes = fmt_changes(step.get("changes"))
        alone = "run alone" if step.get("run_alone") else ""
        return f"level {retry['to_level']} + host step {step.get('step')}" + (
            f": {changes or alone}" if changes or alone else ""
        )
    return f"level {retry['from_level']} -> {retry['to_level']}"
