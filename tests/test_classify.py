"""Failure classification: the corpus in tests/data/failures and the priority rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.attempts.classify import (
    MEANINGFUL_LINE_CHARS,
    REASON_SIGKILL,
    classify_attempt,
    classify_log_tail,
    clip_reason,
    parse_oom_detail,
)
from orchestrator.lifecycle import REASON_HUNG, AttemptOutcome

CORPUS = Path(__file__).parent / "data" / "failures"
CORPUS_FILES = sorted(CORPUS.glob("*.txt"))
PREFIXES = ("host_oom_", "oom_", "failed_", "succeeded_")  # host_oom_ before oom_: longest first


def _expected(path: Path) -> AttemptOutcome:
    for prefix in PREFIXES:
        if path.name.startswith(prefix):
            return AttemptOutcome(prefix.rstrip("_"))
    raise AssertionError(f"{path.name}: no outcome prefix")


def _read_case(path: Path) -> tuple[dict[str, str], str]:
    header: dict[str, str] = {}
    body: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not body and line.startswith("#! "):
            key, _, value = line[3:].partition(":")
            header[key.strip()] = value.strip()
        else:
            body.append(line)
    return header, "".join(body)


def _optional_int(value: str | None, default: int | None) -> int | None:
    if value is None:
        return default
    return None if value == "null" else int(value)


def test_corpus_is_large_and_covers_every_outcome() -> None:
    assert len(CORPUS_FILES) >= 24
    seen = {_expected(path) for path in CORPUS_FILES}
    assert {AttemptOutcome.OOM, AttemptOutcome.HOST_OOM, AttemptOutcome.FAILED} <= seen


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_corpus_case(path: Path) -> None:
    header, log_tail = _read_case(path)
    got = classify_attempt(
        exit_code=_optional_int(header.get("exit_code"), 1),
        signal=_optional_int(header.get("signal"), None),
        result=None,
        log_tail=log_tail,
        kernel_oom_kill=header.get("kernel_oom_kill") == "true",
    )
    assert got.outcome is _expected(path), got.reason
    if "reason" in header:
        assert header["reason"].lower() in got.reason.lower()
    assert got.retryable is (header.get("retryable", "true") == "true")
    for field in ("tried_mib", "free_mib", "total_mib", "process_in_use_mib"):
        if field in header:
            assert got.oom_detail is not None
            assert getattr(got.oom_detail, field) == pytest.approx(float(header[field]), abs=0.01)


def test_torch_message_numbers_are_parsed() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
        "capacity of 23.52 GiB of which 28.00 MiB is free. Process 81236 has 3.80 GiB memory in use. "
        "Including non-PyTorch memory, this process has 11.44 GiB memory in use."
    )
    detail = parse_oom_detail(text)
    assert detail is not None
    assert (detail.tried_mib, detail.free_mib) == (20.0, 28.0)
    assert detail.total_mib == pytest.approx(23.52 * 1024)
    assert detail.process_in_use_mib == pytest.approx(11.44 * 1024)
    assert detail.needed_mib() == pytest.approx(11.44 * 1024 + 20.0)
    assert parse_oom_detail("KeyError: 'label'") is None


def _classify(**overrides: Any) -> Any:
    arguments: dict[str, Any] = {"exit_code": 1, "signal": None, "result": None, "log_tail": ""}
    arguments.update(overrides)
    return classify_attempt(**arguments)


def test_cancelled_wins_over_everything() -> None:
    got = _classify(cancelled=True, result={"status": "oom"}, exit_code=3)
    assert got.outcome is AttemptOutcome.CANCELLED


def test_no_exit_record_and_no_result_is_lost() -> None:
    got = _classify(exit_code=None, exit_record_present=False, log_tail="CUDA out of memory")
    assert got.outcome is AttemptOutcome.LOST
    # result.json is enough to know what happened even without the wrapper's record
    got = _classify(exit_code=None, exit_record_present=False, result={"status": "succeeded"})
    assert got.outcome is AttemptOutcome.SUCCEEDED


def test_result_json_is_trusted_over_exit_code_and_log() -> None:
    got = _classify(exit_code=1, result={"status": "succeeded"}, log_tail="KeyError: 'x'")
    assert got.outcome is AttemptOutcome.SUCCEEDED
    got = _classify(exit_code=0, result={"status": "oom", "error": "Tried to allocate 2.00 GiB"})
    assert got.outcome is AttemptOutcome.OOM
    assert got.oom_detail is not None and got.oom_detail.tried_mib == 2048.0


def test_result_without_status_goes_by_the_exit_code() -> None:
    metrics = {"metrics": {"test": {"accuracy": 0.6}}}
    got = _classify(exit_code=0, result=metrics)
    assert (got.outcome, got.reason) == (AttemptOutcome.SUCCEEDED, "exit code 0")
    got = _classify(exit_code=1, result=metrics, log_tail="ValueError: bad label")
    assert got.outcome is AttemptOutcome.FAILED and "bad label" in got.reason


@pytest.mark.parametrize("status", ["done", "", 7, None])
def test_result_with_an_unknown_status_fails_naming_the_known_ones(status: object) -> None:
    got = _classify(exit_code=0, result={"status": status})
    assert got.outcome is AttemptOutcome.FAILED
    assert got.reason == (f"result.json: status {status!r} is not one of succeeded, failed, oom, config_error"
                          " (leave it out to go by the exit code)")


def test_result_config_error_is_failed_and_not_retryable() -> None:
    got = _classify(exit_code=4, result={"status": "config_error", "error": "lora.r must be > 0"})
    assert got.outcome is AttemptOutcome.FAILED
    assert got.retryable is False
    assert got.reason == "config error: lora.r must be > 0"


def test_result_failed_with_oom_error_text_counts_as_oom() -> None:
    error = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 MiB."
    got = _classify(result={"status": "failed", "error": error})
    assert got.outcome is AttemptOutcome.OOM
    got = _classify(result={"status": "failed", "error": "ValueError: bad label"})
    assert got.outcome is AttemptOutcome.FAILED
    assert "bad label" in got.reason


def test_result_failed_reads_the_log_for_a_chained_memory_cause() -> None:
    error = "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly"
    log_tail = (
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n\n"
        "The above exception was the direct cause of the following exception:\n\n" + error + "\n"
    )
    got = _classify(exit_code=1, result={"status": "failed", "error": error}, log_tail=log_tail)
    assert got.outcome is AttemptOutcome.HOST_OOM
    # a plain failure stays one, whatever the log says about it
    plain = "Traceback (most recent call last):\nValueError: bad label\n"
    got = _classify(exit_code=1, result={"status": "failed", "error": "ValueError: bad label"}, log_tail=plain)
    assert got.outcome is AttemptOutcome.FAILED


def test_exit_zero_without_result_succeeds() -> None:
    assert _classify(exit_code=0).outcome is AttemptOutcome.SUCCEEDED


def test_exit_3_is_oom_even_with_an_empty_log() -> None:
    got = _classify(exit_code=3)
    assert got.outcome is AttemptOutcome.OOM


def test_sigkill_needs_evidence_to_be_host_oom() -> None:
    assert _classify(exit_code=None, signal=9).outcome is AttemptOutcome.FAILED
    got = _classify(exit_code=None, signal=9, kernel_oom_kill=True)
    assert got.outcome is AttemptOutcome.HOST_OOM
    assert _classify(exit_code=1, log_tail="Killed\n").outcome is AttemptOutcome.FAILED


@pytest.mark.parametrize("printed", [
    "Killed\n",
    "run.sh: line 14: 40213 Killed   python train.py\n",
    "[ 812.5] Memory cgroup out of memory: Killed process 40213 (python) total-vm:98765432kB\n",
    "[ 812.5] oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=40213,uid=1000\n",
    "python invoked oom-killer: gfp_mask=0xcc0, order=0\nOut of memory: Killed process 40213\n",
])
def test_printed_oom_killer_words_are_no_evidence(printed: str) -> None:
    """Only the kernel's own record (the cgroup's memory.events, the kernel log) makes a
    SIGKILL a host OOM; a worker can print the OOM killer's lines about itself."""
    got = _classify(exit_code=137, log_tail=printed)
    assert (got.outcome, got.reason) == (AttemptOutcome.FAILED, REASON_SIGKILL)
    got = _classify(exit_code=None, signal=9, log_tail=printed, kernel_oom_kill=True)
    assert got.outcome is AttemptOutcome.HOST_OOM  # the kernel's word still counts


def test_a_specific_gpu_oom_beats_the_kernel_flag() -> None:
    tail = "RuntimeError: CUDA error: out of memory\n"
    assert _classify(log_tail=tail, kernel_oom_kill=True).outcome is AttemptOutcome.OOM


def test_hung_is_a_failure_with_reason_hung() -> None:
    got = _classify(exit_code=None, signal=9, hung=True, log_tail="Killed\n")
    assert (got.outcome, got.reason) == (AttemptOutcome.FAILED, REASON_HUNG)


def test_last_error_line_wins() -> None:
    oom_then_keyerror = "RuntimeError: CUDA out of memory. Tried to allocate 2 MiB\nKeyError: 'a'\n"
    keyerror_then_oom = "KeyError: 'a'\nRuntimeError: CUDA out of memory. Tried to allocate 2 MiB\n"
    first = classify_log_tail(oom_then_keyerror)
    second = classify_log_tail(keyerror_then_oom)
    assert first is not None and first.outcome is AttemptOutcome.FAILED
    assert second is not None and second.outcome is AttemptOutcome.OOM
    assert classify_log_tail("step 1 loss 0.5\nstep 2 loss 0.4\n") is None


@pytest.mark.parametrize(
    "line",
    [
        "  source: 'CUDA out of memory. Tried to allocate'",
        '    if "CUDA out of memory" in str(e):',
        "    except torch.OutOfMemoryError:",
        "on_error: CUDA error: out of memory",
    ],
)
def test_mentions_are_not_errors(line: str) -> None:
    assert classify_log_tail(line + "\n") is None


def test_exit_codes_agree_with_the_workers_harness() -> None:
    from orchestrator.attempts import classify
    from workers import harness

    assert (classify.EXIT_OOM, classify.EXIT_CONFIG_ERROR) == (harness.EXIT_OOM, harness.EXIT_CONFIG_ERROR)


# ---------------------------------------------------------------- a plain non-zero exit


def test_a_plain_exit_carries_the_last_line_the_script_printed() -> None:
    tail = "loading...\npython: can't open file '/w/trian.py': [Errno 2] No such file or directory\n\n----\n"
    verdict = classify_attempt(exit_code=2, signal=None, result=None, log_tail=tail)
    assert verdict.outcome is AttemptOutcome.FAILED
    assert verdict.reason == "exit code 2: python: can't open file '/w/trian.py': [Errno 2] No such file or directory"


def test_the_line_a_plain_exit_carries_is_printable_and_bounded() -> None:
    tail = "\x1b[31mboom\x1b[0m \x07in \u202eside\x00 " + "x" * 5000 + "\n"
    reason = classify_attempt(exit_code=1, signal=None, result=None, log_tail=tail).reason
    assert reason.startswith("exit code 1: boom in side")
    assert len(reason) <= len("exit code 1: ") + MEANINGFUL_LINE_CHARS
    assert not any(ord(ch) < 32 or ch == "\u202e" for ch in reason)
    assert classify_attempt(exit_code=1, signal=None, result=None, log_tail="\n \n").reason == "exit code 1"


def test_a_long_oom_reason_is_cut_at_a_clause_and_says_so() -> None:
    from orchestrator.attempts.classify import REASON_CHARS
    from workers.sim import oom_message

    error = oom_message(request_mib=2048, total_mib=24576, free_mib=100, own_mib=17408)
    assert len(error) > REASON_CHARS
    reason = classify_attempt(exit_code=3, signal=None, result={"status": "oom", "error": error},
                              log_tail="").reason
    assert len(reason) <= REASON_CHARS and reason.endswith("…"), reason
    kept = reason.removeprefix("result.json: oom: ").removesuffix("…")
    assert error.startswith(kept) and error[len(kept)] in ".,;:", reason  # cut where a clause ends
    assert clip_reason("short, whole.") == "short, whole."
