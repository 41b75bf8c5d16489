"""`orch logs`: any size in constant memory (the last lines found from the end), no terminal
control sequence a worker printed reaches the terminal (colours kept; `--raw` for the bytes),
and `--tail` checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import Orch, requires_tmux

from orchestrator.cli.jobs.log_stream import BLOCK_BYTES, TerminalText, tail_offset

HOSTILE = (b"step 1 \x1b[32mgreen\x1b[0m\n"
           b"clipboard \x1b]52;c;cm0gLXJmIH4=\x07written\n"
           b"title \x1b]0;pwned\x1b\\set\n"
           b"query \x1b[6n\x1b[c\x1b[2J\x1bc\x08done\n")


def _clean(data: bytes, block: int) -> str:
    text = TerminalText()
    out = "".join(text.feed(data[i:i + block]) for i in range(0, len(data), block))
    return out + text.feed(b"", final=True)


@pytest.mark.parametrize("block", [1, 3, 7, 4096])
def test_control_sequences_are_left_out_and_colours_kept_across_blocks(block: int) -> None:
    assert _clean(HOSTILE, block) == ("step 1 \x1b[32mgreen\x1b[0m\nclipboard written\ntitle set\n"
                                      "query done\n")


def test_an_unterminated_string_does_not_swallow_the_log() -> None:
    out = _clean(b"a \x1b]0;never ends\n" + b"x" * 10_000 + b"\x07 b\n", 4096)
    assert "never ends" in out and out.endswith(" b\n") and "\x1b" not in out and "\x07" not in out


@pytest.mark.parametrize("content", [b"", b"one", b"one\n", b"a\nb\nc", b"a\nb\nc\n", b"\n\n\n"])
def test_tail_offset_finds_the_last_lines(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        for lines in (1, 2, 5):
            expected = b"".join(content.splitlines(keepends=True)[-lines:])
            assert content[tail_offset(fd, lines):] == expected, (content, lines)
    finally:
        os.close(fd)


def test_tail_offset_reads_back_across_blocks(tmp_path: Path) -> None:
    line = b"y" * (BLOCK_BYTES // 3) + b"\n"
    content = line * 10
    path = tmp_path / "log"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert content[tail_offset(fd, 4):] == line * 4
    finally:
        os.close(fd)




def _max_rss_kib(orch: Orch, *args: str) -> tuple[int, bytes, bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], env=orch.env, cwd=orch.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@requires_tmux
@pytest.mark.tmux
def test_logs_of_a_hostile_and_large_log(orch: Orch) -> None:
    orch.write_suite("l", {"l": {"sim_mem_gib": 0.5, "sim_seconds": 0.5}}, mem_gib=1)
    orch.submit("l", "1:a")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "succeeded"}
    orch.stop_daemon()
    log = Path(orch.attempt_rows(1)[-1].run_dir) / "stdout.log"
    log.write_bytes(HOSTILE)
    shown = orch.run("logs", "1").stdout
    assert "\x1b]" not in shown and "\x1b[6n" not in shown and "\x07" not in shown and "\x1b[32m" in shown
    assert orch.run("logs", "1", "--raw").stdout.encode() == HOSTILE
    assert orch.run("logs", "1", "--tail", "1").stdout == "query done\n"
    for bad in ("0", "-5", "x"):
        proc = orch.run("logs", "1", "--tail", bad, check=False)
        assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc

    # 256 MiB of log: shown whole and by its tail without reading it into memory
    with log.open("wb") as out:
        chunk = (b"z" * 1023 + b"\n") * 1024
        for _ in range(256):
            out.write(chunk)
        out.write(b"the end\n")
    code = """
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "orchestrator", *sys.argv[1:]], stdout=subprocess.DEVNULL)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
    for args in (("logs", "1", "--tail", "3"), ("logs", "1")):
        said = subprocess.run([sys.executable, "-c", code, *args], env=orch.env, cwd=orch.root,
                              capture_output=True, text=True, timeout=300).stdout.split()
        assert said[0] == "0" and int(said[1]) < 128 * 1024, (args, said)  # KiB: well under the log's size
    assert orch.run("logs", "1", "--tail", "2").stdout == "z" * 1023 + "\nthe end\n"
