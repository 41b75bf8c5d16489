"""The one boundary where run-dir files enter orch: read without following links, size limited, parsed, and
every field checked for type and range. Everything in a run dir can be written by user code (a buggy training
script, a hostile one), so what comes out of here is either a value of the documented type and range or absent,
and each thing refused is named in `problems` ("pid.json: pid must be an integer from 1 to 4194304, not 'abc'"),
for the attempt's reason. Nothing here raises for bad content.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.attempts.field_checks import MAX_PID, Check
from orchestrator.attempts.field_checks import int_in as _int_in
from orchestrator.attempts.field_checks import is_number as _is_number
from orchestrator.attempts.field_checks import leftovers as _leftovers
from orchestrator.attempts.field_checks import names_list as _names
from orchestrator.attempts.field_checks import number_in as _number_in
from orchestrator.attempts.field_checks import short_text as _short_text
from orchestrator.attempts.fused_lessons import MAX_MEMBERS
from orchestrator.executors.runs_tree import (
    FileProblem,
    RunTreeError,
    file_mtime,
    open_run_dir,
    read_file,
)
from orchestrator.rundir_files import RunDir
from orchestrator.wording import MAX_METRIC

MAX_RECORD_BYTES = 64 * 1024  # pid.json, exit.json
MAX_RESULT_BYTES = 4 * 1024 * 1024  # result.json (metrics of many evals)
PROGRESS_TAIL_BYTES = 8192
CURVE_TAIL_BYTES = 1024 * 1024  # progress.jsonl read for a loss curve
MAX_CURVE_POINTS = 400
LOG_TAIL_BYTES = 16384
MAX_TEXT_CHARS = 4000  # an error message kept from result.json
MAX_MIB = 1 << 30  # 1 PiB: far above any GPU, far below SQLite's integer range
MAX_COUNT = 10**12  # steps, totals, tokens
MAX_METRIC_DEPTH = 4
MAX_GPU_PEAK_BYTES = 4096  # gpu_peak.json
MAX_PEAK_MIB = 16 * 1024 * 1024  # 16 TiB: anything larger is not a reading

# field -> (check, what it must be); a field failing its check is dropped and named.
PID_FIELDS: dict[str, tuple[Check, str]] = {
    "pid": (_int_in(1, MAX_PID), f"an integer from 1 to {MAX_PID}"),
    "pgid": (_int_in(1, MAX_PID), f"an integer from 1 to {MAX_PID}"),
    "child_pid": (_int_in(1, MAX_PID), f"an integer from 1 to {MAX_PID}"),
    "create_time": (_number_in(0.0, 1e11), "a time in seconds"),
    "started_at": (_short_text(64), "a timestamp"),
}
EXIT_FIELDS: dict[str, tuple[Check, str]] = {
    "exit_code": (_int_in(0, 255), "an integer from 0 to 255"),
    "signal": (lambda v: v is None or _int_in(1, 64)(v), "a signal number or null"),
    "signal_name": (lambda v: v is None or _short_text(32)(v), "a signal name or null"),
    "received": (_names, "a short list of signal names"),
    "forwarded": (_names, "a short list of signal names"),
    "error": (_short_text(MAX_TEXT_CHARS), "a short text"),
    "ended_at": (_short_text(64), "a timestamp"),
    "leftovers": (_leftovers, "a short list of {pid, name}"),
    "token": (_short_text(64), "a short text"),
    "tracking": (_names, "a short list of names"),
    "oom_kills": (lambda v: v is None or _int_in(0, MAX_COUNT)(v), "a count or null"),  # its cgroup's, by the kernel
}
RESULT_FIELDS: dict[str, tuple[Check, str]] = {
    # optional; any value is kept (a long one shortened below): attempts.classify names one it does not know
    "status": (lambda v: True, "any value"),
    "error": (lambda v: v is None or isinstance(v, str), "a text or null"),
    "peak_mem_mib": (lambda v: v is None or _number_in(0, MAX_MIB)(v), f"a number of MiB from 0 to {MAX_MIB} or null"),
    "longest_tokens": (lambda v: v is None or _int_in(1, MAX_COUNT)(v), "a positive integer or null"),
    "samples_per_s": (lambda v: v is None or _number_in(0, 1e12)(v), "a finite number or null"),
    "steps": (lambda v: v is None or _int_in(0, MAX_COUNT)(v), "a non-negative integer or null"),
    "best_step": (lambda v: v is None or _int_in(0, MAX_COUNT)(v), "a non-negative integer or null"),
    "seconds": (lambda v: v is None or _number_in(0, 1e10)(v), "a finite number or null"),
    "metrics": (lambda v: isinstance(v, dict), "a mapping"),
    # true: the test metrics were scored on the split that also chose the best epoch
    "test_is_val": (lambda v: isinstance(v, bool), "true or false"),
    # > 0: a halved micro-batch draws other LoRA dropout masks (an equivalent draw, not bit-equal)
    "lora_dropout": (lambda v: v is None or _number_in(0, 1)(v), "a number from 0 to 1 or null"),
    "token": (_short_text(64), "a short text"),
    # the LoRA worker's `share_base` (sequential, fused) and, fused, the largest group it trained in:
    # a fused run is marked in results (not bit-equal to a run of its own)
    "share_base": (_short_text(32), "a short text"),
    "fused_members_max": (lambda v: v is None or _int_in(1, MAX_MEMBERS)(v),
                          f"an integer from 1 to {MAX_MEMBERS} or null"),
    # our workers' own records, each checked where it is used (attempts.divergence,
    # attempts.provenance_reads): dropped here, they were never judged or shown
    "loss_summary": (lambda v: v is None or isinstance(v, dict), "a mapping or null"),
    "provenance": (lambda v: v is None or isinstance(v, dict), "a mapping or null"),
}
PROGRESS_FIELDS: dict[str, tuple[Check, str]] = {
    "t": (_number_in(0, 1e11), "a time in seconds"),
    "step": (_int_in(0, MAX_COUNT), "a non-negative integer"),
    "total": (_int_in(0, MAX_COUNT), "a non-negative integer"),
    "loss": (lambda v: v is None or _number_in(-1e30, 1e30)(v), "a finite number or null"),
    "samples_per_s": (lambda v: v is None or _number_in(0, 1e12)(v), "a finite number or null"),
    "peak_mem_mib": (lambda v: v is None or _number_in(0, MAX_MIB)(v), "a number of MiB or null"),
}
IGNORED_FILES = "ignored invalid run-dir files: "  # how an attempt's end names the files it refused
REQUIRED = {RunDir.PID: ("pid", "pgid", "create_time"), RunDir.EXIT: ("exit_code",)}


def shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate(name: str, data: Any, fields: dict[str, tuple[Check, str]], problems: list[str]) -> dict[str, Any] | None:
    """The record with every known field checked (bad ones dropped and named); unknown fields
    are dropped silently. None when it is not a JSON object or lacks a required field."""
    if not isinstance(data, dict):
        problems.append(f"{name}: not a JSON object")
        return None
    clean: dict[str, Any] = {}
    for key, (check, what) in fields.items():
        if key not in data:
            continue
        if check(data[key]):
            clean[key] = data[key]
        else:
            problems.append(f"{name}: {key} must be {what}, not {shown(data[key])}")
    missing = [key for key in REQUIRED.get(name, ()) if key not in clean]
    if missing:
        if not any(p.startswith(f"{name}: {missing[0]} ") for p in problems):
            problems.append(f"{name}: no valid {', '.join(missing)}")
        return None
    return clean


def clean_metrics(value: Any, depth: int = 0) -> dict[str, Any]:
    """Metrics keep string keys and numbers (nested a few levels): every number, NaN and the
    infinities included. Every reader leaves out of its numbers those that are not finite or are
    beyond wording.MAX_METRIC (attempts.reported names them, so a table can say which metric was
    not finite or too large). The rest is dropped."""
    if not isinstance(value, dict) or depth > MAX_METRIC_DEPTH:
        return {}
    out: dict[str, Any] = {}
    for key, item in list(value.items())[:1000]:
        if not isinstance(key, str) or len(key) > 200:
            continue
        if isinstance(item, dict):
            out[key] = clean_metrics(item, depth + 1)
        elif _is_number(item):  # an int no float holds is kept as it is, to be named
            out[key] = float(item) if isinstance(item, int) and 2**53 < abs(item) <= MAX_METRIC else item
        elif isinstance(item, float) and not math.isfinite(item):
            out[key] = item
    return out


def _parse_json(raw: bytes, name: str, problems: list[str], constants: bool = False) -> Any:
    """`constants`: NaN, Infinity and -Infinity read as floats (Python's json.dump writes them
    for a metric gone non-finite; every field check refuses them, metrics name them)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=float if constants else _no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        problems.append(f"{name}: not valid JSON ({type(exc).__name__})")
        return None


def _no_constant(token: str) -> float:
    raise ValueError(f"{token} is not a number JSON allows")


@dataclass
class RunFiles:
    """What the run dir holds, validated. `pid_file_present`: something named pid.json exists
    (valid or not), which matters to the lost-marker handshake."""

    pid_record: dict[str, Any] | None = None
    pid_file_present: bool = False
    exit_record: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    last_progress: dict[str, Any] | None = None
    last_progress_at: float | None = None
    problems: list[str] = field(default_factory=list)


def _record(
    dir_fd: int, name: str, limit: int, fields: dict[str, tuple[Check, str]], problems: list[str],
    constants: bool = False,
) -> tuple[dict[str, Any] | None, bool]:
    try:
        raw = read_file(dir_fd, name, limit)
    except FileProblem as exc:
        problems.append(str(exc))
        return None, True
    if raw is None:
        return None, False
    data = _parse_json(raw, name, problems, constants)
    if data is None:
        return None, True
    return validate(name, data, fields, problems), True


def read_result_in(dir_fd: int, problems: list[str]) -> dict[str, Any] | None:
    # a metric gone NaN must not cost the run its other metrics: the file is read, the NaN named
    result, _ = _record(dir_fd, RunDir.RESULT, MAX_RESULT_BYTES, RESULT_FIELDS, problems, constants=True)
    if result is None:
        return None
    status = result.get("status")
    if isinstance(status, (dict, list)) or (isinstance(status, str) and len(status) > 64):
        result["status"] = shown(status)  # not a status we know, said in a few characters
    result["metrics"] = clean_metrics(result.get("metrics", {}))
    if isinstance(result.get("error"), str):
        result["error"] = result["error"][-MAX_TEXT_CHARS:]
    if isinstance(result.get("peak_mem_mib"), float):
        result["peak_mem_mib"] = int(result["peak_mem_mib"])
    return result


def _last_progress(dir_fd: int, problems: list[str]) -> dict[str, Any] | None:
    try:
        raw = read_file(dir_fd, RunDir.PROGRESS, PROGRESS_TAIL_BYTES, tail=True)
    except FileProblem as exc:
        problems.append(str(exc))
        return None
    if raw is None:
        return None
    for line in reversed(raw.decode("utf-8", errors="replace").splitlines()):
        try:
            record = json.loads(line, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            continue  # a line being written, or noise
        if isinstance(record, dict):
            return validate(RunDir.PROGRESS, record, PROGRESS_FIELDS, problems)
    return None


def read_run_files(run_dir: Path, *, with_result: bool = False) -> RunFiles:
    """pid.json, exit.json, the last heartbeat (and result.json) of a run dir, validated."""
    files = RunFiles()
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            files.pid_record, files.pid_file_present = _record(
                dir_fd, RunDir.PID, MAX_RECORD_BYTES, PID_FIELDS, files.problems
            )
            files.exit_record, _ = _record(dir_fd, RunDir.EXIT, MAX_RECORD_BYTES, EXIT_FIELDS, files.problems)
            files.last_progress_at = file_mtime(dir_fd, RunDir.PROGRESS)
            if files.last_progress_at is not None:
                files.last_progress = _last_progress(dir_fd, files.problems)
            if with_result:
                files.result = read_result_in(dir_fd, files.problems)
    except FileNotFoundError:
        pass
    except (RunTreeError, OSError) as exc:
        files.problems.append(f"run dir: {exc}")
    return files


def read_progress(run_dir: Path, files: RunFiles) -> RunFiles:
    """`files` with the last heartbeat read again (its records as they were): for a worker
    that only appended progress lines since `files` was read."""
    fresh = replace(files, problems=[p for p in files.problems if not p.startswith(RunDir.PROGRESS)])
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            fresh.last_progress_at = file_mtime(dir_fd, RunDir.PROGRESS)
            fresh.last_progress = _last_progress(dir_fd, fresh.problems) if fresh.last_progress_at is not None else None
    except FileNotFoundError:
        return files
    except (RunTreeError, OSError) as exc:
        fresh.problems.append(f"run dir: {exc}")
    return fresh


def read_result(run_dir: Path, problems: list[str] | None = None) -> dict[str, Any] | None:
    """result.json, validated (metrics always a mapping); None when absent or unusable."""
    sink = problems if problems is not None else []
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            return read_result_in(dir_fd, sink)
    except FileNotFoundError:
        return None
    except (RunTreeError, OSError) as exc:
        sink.append(f"run dir: {exc}")
        return None


def read_log_tail(run_dir: Path | str, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last bytes of stdout.log as text; "" when it is absent or not a regular file."""
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            raw = read_file(dir_fd, RunDir.LOG, max_bytes, tail=True)
    except (FileNotFoundError, FileProblem, RunTreeError, OSError):
        return ""
    return (raw or b"").decode("utf-8", errors="replace")


# ---------------------------------------------------------------- the wrapper's GPU peak


def _read_gpu_peak(run_dir: Path) -> dict[str, Any]:
    """gpu_peak.json as a mapping; empty when absent, not a small regular file, or not JSON.
    Read through the run dir's own handle (no level of the path followed if a link)."""
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            raw = read_file(dir_fd, RunDir.GPU_PEAK, MAX_GPU_PEAK_BYTES)
        data = json.loads((raw or b"").decode("utf-8"))
    except (FileProblem, RunTreeError, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_gpu_peak_mib(run_dir: Path) -> int:
    """The wrapper's measured peak, or 0 when absent or not believable."""
    peak = _read_gpu_peak(run_dir).get("peak_mib")
    if isinstance(peak, bool) or not isinstance(peak, int) or not 0 <= peak <= MAX_PEAK_MIB:
        return 0
    return peak


def read_gpu_peak_card(run_dir: Path) -> tuple[str, int] | None:
    """The model and size (MiB) of the card the wrapper's peak was on, where it wrote them."""
    data = _read_gpu_peak(run_dir)
    name, total = data.get("gpu_name"), data.get("gpu_total_mib")
    if not isinstance(name, str) or not 0 < len(name) <= 128 or not name.isprintable():
        return None
    if isinstance(total, bool) or not isinstance(total, int) or not 0 < total <= MAX_PEAK_MIB:
        return None
    return name, total


# ---------------------------------------------------------------- following stdout.log
# Read every tick for workers without progress.jsonl: a stat and a pread of what was appended,
# straight by path (the file itself is never followed if a link, and must be regular).


@dataclass(frozen=True)
class OutputStat:
    size_bytes: int
    mtime_s: float


def stat_output(run_dir: Path, name: str = RunDir.LOG) -> OutputStat | None:
    """Size and modification time of the attempt's stdout.log (or another file it appends to,
    progress.jsonl); None when there is none (or it is not a regular file). Its growth is the
    worker's sign of life."""
    try:
        info = os.lstat(os.path.join(run_dir, name))  # no Path objects: read per attempt per pass
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return OutputStat(info.st_size, info.st_mtime)


def read_output(run_dir: Path, start: int, max_bytes: int, name: str = RunDir.LOG) -> bytes:
    """At most `max_bytes` of stdout.log (or `name`) from byte `start`: never the whole of a log
    that may be gigabytes."""
    try:
        fd = os.open(os.path.join(run_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.pread(fd, max(0, max_bytes), max(0, start))
    except OSError:
        return b""
    finally:
        os.close(fd)


def text_decoder() -> codecs.IncrementalDecoder:
    """A decoder of a run-dir file's bytes read piece by piece: UTF-8, undecodable bytes replaced
    (user code writes them), a character cut between two reads completed by the next."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def _text(raw: bytes) -> str:
    return text_decoder().decode(raw, final=True)


def head_and_tail_texts(run_dir: Path, name: str, head_bytes: int, tail_bytes: int) -> list[str] | None:
    """An appended file's first `head_bytes` and last `tail_bytes` as text (undecodable bytes
    replaced): one text when they meet, else two, each less the part line cut at the gap. None
    when there is no such file. Never more of a file that may be gigabytes."""
    found = stat_output(run_dir, name)
    if found is None:
        return None
    head = min(found.size_bytes, head_bytes)
    head_text = _text(read_output(run_dir, 0, head, name))
    tail_start = max(head, found.size_bytes - tail_bytes)
    tail_text = _text(read_output(run_dir, tail_start, found.size_bytes - tail_start, name))
    if tail_start == head:  # the whole file: one text
        return [head_text + tail_text]
    return [head_text.rsplit("\n", 1)[0], tail_text.partition("\n")[2]]
