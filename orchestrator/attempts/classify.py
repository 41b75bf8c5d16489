"""Why did an attempt end? A pure classifier of the worker's exit, result.json and log tail.

The worker's own result.json is trusted first; for foreign scripts the exit status and the
last relevant error line of the log tail decide. Signatures are matched as error lines (at the
start of a line or right after an exception label such as `RuntimeError:`), so a config dump
that merely mentions "CUDA out of memory" is not taken for an OOM. The LAST relevant line wins:
an OOM caught and logged early, followed by a crash on something else, is a plain failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.attempts.fused_lessons import MAX_MEMBERS
from orchestrator.gpu.mps import MPS_FAILURES, REASON_MPS
from orchestrator.lifecycle import REASON_HUNG, AttemptOutcome

# The exit codes of our workers' protocol, as workers.harness defines them (a test checks they
# agree). Not imported from there: this classifier stays a pure module of orch's own, and a
# foreign script that exits 3 or 4 is read the same way.
EXIT_OOM = 3  # workers.harness.EXIT_OOM
EXIT_CONFIG_ERROR = 4  # workers.harness.EXIT_CONFIG_ERROR
# `share_base: fused`: every member of a group of N >= 2 jobs that ran out of memory in one step
# exits with this code and prints GROUP_OOM_LINE (the LoRA worker's fused protocol).
EXIT_GROUP_OOM = 75
GROUP_OOM_LINE = re.compile(r"orch: fused group of ([0-9]{1,2}) members ran out of memory")
SIGKILL = 9
# A SIGKILL nothing explains (an admin, a watchdog; the kernel's OOM killer where its word could
# not be read): a death, resumed from a checkpoint where one is left (attempts.next_step).
REASON_SIGKILL = "killed by SIGKILL without OOM evidence"
REASON_CONFIG_ERROR = "config error"  # how the reason of a worker's refusal of its settings starts
# result.json's `status`, optional: without it the exit code decides, as for a script writing no result.json
RESULT_STATUSES = ("succeeded", "failed", "oom", "config_error")

# At the start of a line, or right after an error label. The label is case-sensitive on purpose:
# Python exception names are CamelCase, so `on_error: CUDA out of memory` in a config is no label.
_AT_ERROR = r"(?:^\s*|(?:[A-Z]\w*(?:Error|Exception)|ERROR|FATAL|CRITICAL)\]?\s*:\s*)"


@dataclass(frozen=True)
class _Signature:
    outcome: AttemptOutcome
    reason: str
    pattern: re.Pattern[str]


def _sig(outcome: AttemptOutcome, reason: str, regex: str) -> _Signature:
    return _Signature(outcome, reason, re.compile(regex))


_OOM = AttemptOutcome.OOM
_HOST = AttemptOutcome.HOST_OOM
_FAILED = AttemptOutcome.FAILED

# Checked in order on each line; the first hit names the line. Failures that only look like
# OOMs come first. Numbers refer to the signature table of the OOM research note (section 2.4).
_SIGNATURES: tuple[_Signature, ...] = (
    _sig(
        _FAILED,
        "bogus allocation size (more than 1EB): a bug, not an OOM",
        r"(?i:more than 1EB memory)",
    ),
    _sig(
        _FAILED,
        "Triton OutOfResources (shared memory): the kernel config is too big for this GPU model",
        r"(?i:OutOfResources\b|out of resource: shared memory)",
    ),
    # a broken MPS server fails its clients whatever they run: said as such (the daemon turns MPS
    # off for that card), never read as an OOM of the job's own
    _Signature(_FAILED, REASON_MPS, MPS_FAILURES),
    _sig(_FAILED, "NCCL watchdog timeout", r"(?i:Watchdog caught collective operation timeout)"),
    _sig(
        _OOM,
        "CUDA out of memory",
        _AT_ERROR + r"(?i:(?:cuda |hip |xpu )?out of memory\. tried to allocate)",
    ),
    _sig(
        _OOM,
        "CUDA out of memory (cudaMallocAsync)",
        r"(?i:would exceed allowed memory\. \(out of memory\))",
    ),
    _sig(_OOM, "CUDA error: out of memory", _AT_ERROR + r"(?i:cuda error: out of memory)"),
    _sig(_OOM, "CUDA out of memory", _AT_ERROR + r"(?i:cuda runtime error \(2\) : out of memory)"),
    _sig(_OOM, "CUDA out of memory", _AT_ERROR + r"(?i:(?:cuda|hip|xpu) out of memory)"),
    _sig(_OOM, "MPS backend out of memory", _AT_ERROR + r"(?i:mps backend out of memory)"),
    _sig(_OOM, "torch.OutOfMemoryError", r"^\s*(?:[\w.]+\.)?OutOfMemoryError\b"),
    _sig(_OOM, "Triton Error [CUDA]: out of memory", r"(?i:triton error \[cuda\]: out of memory)"),
    _sig(
        _OOM, "cuBLAS allocation failed (CUBLAS_STATUS_ALLOC_FAILED)", r"CUBLAS_STATUS_ALLOC_FAILED"
    ),
    _sig(_OOM, "cuDNN allocation failed (CUDNN_STATUS_ALLOC_FAILED)", r"CUDNN_STATUS_ALLOC_FAILED"),
    _sig(
        _OOM,
        "cuDNN refused the size (CUDNN_STATUS_NOT_SUPPORTED, batch-related)",
        r"(?i:cudnn error: )CUDNN_STATUS_NOT_SUPPORTED",
    ),
    _sig(_OOM, "NCCL: Cuda failure 'out of memory'", r"(?i:cuda failure 'out of memory')"),
    _sig(
        _OOM,
        "CUDA caching allocator failure under memory pressure (probable OOM)",
        r"(?i:internal assert failed at .*CUDACachingAllocator|cuda driver error: device not ready)",
    ),
    _sig(
        _HOST,
        "host RAM exhausted (DefaultCPUAllocator)",
        r"(?i:DefaultCPUAllocator: (?:can't allocate memory|not enough memory))",
    ),
    _sig(
        _HOST,
        "a DataLoader worker was killed (host OOM)",
        r"(?i:DataLoader worker \(pid[^)]*\) is killed by signal: Killed)",
    ),
    _sig(
        _HOST,
        "/dev/shm exhausted in a DataLoader worker",
        r"(?i:Unexpected bus error encountered in worker|is killed by signal: Bus error)",
    ),
    _sig(_HOST, "host RAM exhausted (MemoryError)", r"^\s*MemoryError\b"),
    # No signature for a SIGKILL: the kernel's OOM-killer lines or a shell's `Killed` in the log
    # are words anyone can print. Only the kernel's own record (the attempt's cgroup
    # memory.events, the kernel log) makes a SIGKILL a host OOM (classify_attempt's
    # `kernel_oom_kill`).
)

# A Python exception's last traceback line, e.g. `KeyError: 'label'`: a relevant error line
# that no signature names, so an earlier OOM line is not the last word.
_GENERIC_ERROR = re.compile(
    r"^\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::.*)?$"
)
# Launchers that re-raise a child's failure: they say nothing about why.
_WRAPPER_ERRORS = re.compile(r"ChildFailedError|CalledProcessError")
# Python's chained-exception separators: the cause above may be the real story.
_CHAIN_MARKER = re.compile(
    r"^\s*(?:The above exception was the direct cause of the following exception"
    r"|During handling of the above exception, another exception occurred)"
)

_SIZE = r"([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b"
_UNIT_MIB: dict[str, float] = {
    "bytes": 1 / 1024**2, "b": 1 / 1024**2, "kib": 1 / 1024, "kb": 1 / 1024,
    "mib": 1.0, "mb": 1.0, "gib": 1024.0, "gb": 1024.0, "tib": 1024.0**2, "tb": 1024.0**2,
}  # fmt: skip
_TRIED = re.compile(r"Tried to allocate " + _SIZE, re.I)
_TOTAL_FREE_NEW = re.compile(
    r"total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + " is free", re.I
)
_PROCESS_IN_USE = re.compile(r"this process has " + _SIZE + " memory in use", re.I)
_OLD_FORM = re.compile(r"\(GPU \d+; " + _SIZE + r" total capacity; .*?; " + _SIZE + " free", re.I)
_ASYNC_REQUESTED = re.compile(r"Requested\s*:\s*" + _SIZE, re.I)
_ASYNC_LIMIT = re.compile(r"Device limit\s*:\s*" + _SIZE, re.I)
_ASYNC_FREE = re.compile(r"Free \(according to CUDA\)\s*:\s*" + _SIZE, re.I)


@dataclass(frozen=True)
class OomDetail:
    """Numbers parsed from an OOM message; None where the message does not say."""

    tried_mib: float | None = None
    free_mib: float | None = None
    total_mib: float | None = None
    process_in_use_mib: float | None = None

    def needed_mib(self) -> float | None:
        """What the process held plus what it asked for: a floor for the next prediction."""
        if self.process_in_use_mib is None:
            return None
        return self.process_in_use_mib + (self.tried_mib or 0.0)


@dataclass(frozen=True)
class Classification:
    outcome: AttemptOutcome
    reason: str
    retryable: bool = True  # False for config errors: the same config fails again
    oom_detail: OomDetail | None = None
    group_members: int | None = None  # a fused group's OOM: the members it had at that step


def group_oom_members(exit_code: int | None, log_tail: str) -> int | None:
    """N of a fused group's OOM: exit code 75 and, as a whole line of the log tail, `orch: fused
    group of N members ran out of memory` with 2 <= N <= 16 (the last such line). None otherwise:
    a line anyone prints without that exit code, or an N out of range, is not one."""
    if exit_code != EXIT_GROUP_OOM:
        return None
    for line in reversed(log_tail.splitlines()[-400:]):
        match = GROUP_OOM_LINE.fullmatch(line.strip())
        if match is not None:
            members = int(match.group(1))
            return members if 2 <= members <= MAX_MEMBERS else None
    return None


def _mib(match: re.Match[str] | None, group: int = 1) -> float | None:
    if match is None:
        return None
    return round(float(match.group(group)) * _UNIT_MIB[match.group(group + 1).lower()], 2)


def parse_oom_detail(text: str) -> OomDetail | None:
    """Tried/free/total/in-use MiB from any of torch's OOM message forms, or None."""
    tried = _mib(_TRIED.search(text)) or _mib(_ASYNC_REQUESTED.search(text))
    total = free = None
    if (new := _TOTAL_FREE_NEW.search(text)) is not None:
        total, free = _mib(new, 1), _mib(new, 3)
    elif (old := _OLD_FORM.search(text)) is not None:
        total, free = _mib(old, 1), _mib(old, 3)
    else:
        total, free = _mib(_ASYNC_LIMIT.search(text)), _mib(_ASYNC_FREE.search(text))
    in_use = _mib(_PROCESS_IN_USE.search(text))
    if tried is None and total is None and free is None and in_use is None:
        return None
    return OomDetail(tried_mib=tried, free_mib=free, total_mib=total, process_in_use_mib=in_use)


_Hit = tuple[int, "_Signature | None", str]


def _scan_back(lines: list[str], end: int) -> _Hit | None:
    """(index, signature or None for a generic error, line) of the last error line before `end`."""
    for index in range(end - 1, -1, -1):
        line = lines[index]
        for signature in _SIGNATURES:
            if signature.pattern.search(line):
                return index, signature, line
        if _GENERIC_ERROR.match(line) and not _WRAPPER_ERRORS.search(line):
            return index, None, line
    return None


def _last_relevant_error(lines: list[str]) -> _Hit | None:
    """The last error line; a generic error raised while handling a named one yields to it
    (`DataLoader worker exited unexpectedly` chained from `... is killed by signal: Killed`)."""
    last = _scan_back(lines, len(lines))
    hit = last
    while hit is not None and hit[1] is None:
        cause = _scan_back(lines, hit[0])
        if cause is None or not any(_CHAIN_MARKER.match(line) for line in lines[cause[0] : hit[0]]):
            break
        if cause[1] is not None:
            return cause
        hit = cause
    return last


def classify_log_tail(log_tail: str) -> Classification | None:
    """The classification the log tail alone supports, or None when it shows no error line."""
    lines = log_tail.splitlines()
    found = _last_relevant_error(lines)
    if found is None:
        return None
    index, signature, line = found
    if signature is None:
        return Classification(AttemptOutcome.FAILED, clip_reason(printable_line(line)))
    detail = None
    if signature.outcome is AttemptOutcome.OOM:
        detail = parse_oom_detail("\n".join(lines[index : index + 12]))
    return Classification(signature.outcome, signature.reason, oom_detail=detail)


def _from_result(result: dict[str, Any], log_tail: str) -> Classification:
    status = result["status"]
    error = str(result.get("error") or "")
    if status not in RESULT_STATUSES:
        allowed = ", ".join(RESULT_STATUSES)
        return Classification(AttemptOutcome.FAILED, clip_reason(
            f"result.json: status {status!r} is not one of {allowed} (leave it out to go by the exit code)"))
    if status == "succeeded":
        return Classification(AttemptOutcome.SUCCEEDED, "result.json: succeeded")
    if status == "config_error":
        return Classification(
            AttemptOutcome.FAILED, f"{REASON_CONFIG_ERROR}: {error}".rstrip(": "), retryable=False
        )
    if status == "oom":
        detail = parse_oom_detail(error) or parse_oom_detail(log_tail)
        return Classification(
            AttemptOutcome.OOM, clip_reason(f"result.json: oom: {error}"), oom_detail=detail
        )
    # "failed": an OOM in its error text still counts as one.
    from_error = classify_log_tail(error)
    if from_error is not None and from_error.outcome in (
        AttemptOutcome.OOM,
        AttemptOutcome.HOST_OOM,
    ):
        return from_error
    # result.json holds the last exception line only; the cause may be chained above it in the
    # log (a DataLoader worker "killed by signal: Killed" surfaces as "exited unexpectedly").
    from_log = classify_log_tail(log_tail)
    if from_log is not None and from_log.outcome in (AttemptOutcome.OOM, AttemptOutcome.HOST_OOM):
        return from_log
    shown = error.strip().splitlines()[-1] if error.strip() else "status 'failed'"
    return Classification(AttemptOutcome.FAILED, clip_reason(f"result.json: {shown}"))


def died_of_sigkill(exit_code: int | None, signal: int | None) -> bool:
    """The process died of SIGKILL: the wrapper saw the signal, or a shell between them reported
    it as exit code 137 (128 + 9), or Python's subprocess as -9."""
    return signal == SIGKILL or exit_code in (128 + SIGKILL, -SIGKILL)


def classify_attempt(
    *,
    exit_code: int | None,
    signal: int | None,
    result: dict[str, Any] | None,
    log_tail: str,
    cancelled: bool = False,
    exit_record_present: bool = True,
    kernel_oom_kill: bool = False,
    hung: bool = False,
    fused: bool = False,
) -> Classification:
    """Outcome of one attempt. `hung`: the daemon killed it for missing heartbeats. `fused`: its
    job has `share_base: fused`; only then may its (untrusted) exit and log say its fused group ran
    out of memory (requeued uncounted, the suite's cap lowered): any other job's is read as before."""
    if cancelled:
        return Classification(AttemptOutcome.CANCELLED, "cancelled")
    wrote = result is not None
    if result is not None and "status" not in result:
        result = None  # its status is optional: the exit code and log decide, as without result.json
    if hung and result is None:
        # Killed by orch for silence. A worker that ignored SIGTERM died of the SIGKILL before
        # its wrapper could write exit.json: still hung, not lost (which would retry it again
        # and again instead of once).
        return Classification(AttemptOutcome.FAILED, REASON_HUNG)
    if not exit_record_present and result is None:
        return Classification(AttemptOutcome.LOST, "no exit record and no result.json"
                              + (" status" if wrote else ""))
    # before the CUDA OOM signatures: the group's CUDA OOM is in this log too, but the job's own
    # need is not what ran out
    members = group_oom_members(exit_code, log_tail) if fused else None
    if members is not None and (result is None or result.get("status") != "succeeded"):
        return Classification(AttemptOutcome.GROUP_OOM, f"its fused group of {members} members ran out of memory",
                              group_members=members)
    if result is not None:
        return _from_result(result, log_tail)
    if exit_code == 0 and signal is None:
        return Classification(AttemptOutcome.SUCCEEDED, "exit code 0")
    if exit_code == EXIT_CONFIG_ERROR:
        last_line = log_tail.strip().splitlines()[-1] if log_tail.strip() else "exit code 4"
        return Classification(
            AttemptOutcome.FAILED,
            clip_reason(f"{REASON_CONFIG_ERROR}: {last_line}"),
            retryable=False,
        )
    sigkilled = died_of_sigkill(exit_code, signal)
    from_log = classify_log_tail(log_tail)
    if exit_code == EXIT_OOM:
        detail = from_log.oom_detail if from_log is not None else parse_oom_detail(log_tail)
        reason = (
            from_log.reason
            if from_log is not None and from_log.outcome is _OOM
            else "exit code 3 (OOM)"
        )
        return Classification(AttemptOutcome.OOM, reason, oom_detail=detail)
    if from_log is not None and from_log.outcome is not AttemptOutcome.FAILED:
        return from_log
    if kernel_oom_kill:
        return Classification(
            AttemptOutcome.HOST_OOM, "killed by the kernel OOM killer (oom_kill event)"
        )
    if from_log is not None:
        return from_log
    if sigkilled:
        return Classification(AttemptOutcome.FAILED, REASON_SIGKILL)
    if signal is not None:
        return Classification(AttemptOutcome.FAILED, f"killed by signal {signal}")
    if exit_code is None:
        return Classification(AttemptOutcome.FAILED, "no exit status recorded")
    said = last_meaningful_line(log_tail)
    return Classification(AttemptOutcome.FAILED, f"exit code {exit_code}" + (f": {said}" if said else ""))


# ANSI escape sequences (colours, cursor moves) and other control characters a script prints.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")
# Lines that say nothing on their own: tqdm bars redrawn with \r, separators, a bare prompt.
_NO_WORDS = re.compile(r"^[\W_]*$")
MEANINGFUL_LINE_CHARS = 200


REASON_CHARS = 300


def clip_reason(text: str, max_chars: int = REASON_CHARS) -> str:
    """`text` whole when it fits, else cut at its last sentence or clause boundary in the first
    `max_chars` (at a word when there is none past the middle) and ended with "…", so a reason
    never reads as if it ended mid-sentence."""
    if len(text) <= max_chars:
        return text
    head = text[: max_chars - 1]
    cut = max(head.rfind(sep) for sep in (". ", "; ", ", ", ": "))
    if cut < max_chars // 2:
        cut = head.rfind(" ")
    return (head[:cut] if cut > 0 else head).rstrip(" .,;:") + "…"


def printable_line(text: str) -> str:
    """`text` without escape sequences or control characters, stripped."""
    return _CONTROL.sub("", _ANSI.sub("", text)).strip()


def last_meaningful_line(log_tail: str, max_chars: int = MEANINGFUL_LINE_CHARS) -> str:
    """The last line of the log tail with words in it, as one printable line of at most
    `max_chars` (the log is written by user code: escapes and control characters removed), or
    "" when there is none. It tells why a script exited without an error line we know
    (`python: can't open file '/w/trian.py': [Errno 2] No such file or directory`)."""
    for raw in reversed(log_tail.splitlines()):
        line = printable_line(raw)
        if line and not _NO_WORDS.match(line):
            return line if len(line) <= max_chars else line[: max_chars - 1] + "…"
    return ""
