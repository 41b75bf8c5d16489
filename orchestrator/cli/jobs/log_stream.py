"""`orch logs` in constant memory: a log is copied in blocks (never read whole), its last lines
are found by reading back from its end, and what a worker printed reaches the terminal without
its control sequences (a clipboard write, a title change, a terminal query, cursor moves), colours
kept, unless the user asks for the raw bytes. The log is written by user code: untrusted."""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Callable

from orchestrator.attempts.log_sequences import FINISHED, INTRODUCER, MAX_PENDING_CHARS, SEQUENCE

BLOCK_BYTES = 64 * 1024


def _keep_colours(match: re.Match[str]) -> str:
    return match.group(1) or ""


class TerminalText:
    """Bytes of a log in, text safe for a terminal out, chunk by chunk: a sequence split across
    two chunks is held back until its end arrives."""

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        self._pending = ""

    def feed(self, data: bytes, final: bool = False) -> str:
        text = self._pending + self._decode(data, final)
        self._pending = ""
        if not final and (open_at := _first_unfinished(text)) is not None:
            text, self._pending = text[:open_at], text[open_at:]  # its end may come with the next block
        return SEQUENCE.sub(_keep_colours, text)


def _first_unfinished(text: str) -> int | None:
    """Where a sequence begins that the end of `text` leaves unfinished (in its last
    MAX_PENDING_CHARS characters), if one does."""
    position = max(0, len(text) - MAX_PENDING_CHARS)
    while True:
        found = INTRODUCER.search(text, position)
        if found is None:
            return None
        finished = FINISHED.match(text, found.start())
        if finished is None:
            return found.start()
        position = finished.end()


def tail_offset(fd: int, lines: int) -> int:
    """Where the last `lines` lines of the file begin, found by reading blocks back from its end
    (a final line without a newline counts as a line)."""
    end = os.lseek(fd, 0, os.SEEK_END)
    position, newlines = end, 0
    if end and os.pread(fd, 1, end - 1) == b"\n":
        position -= 1  # the newline that ends the last line does not start one
    while position > 0:
        size = min(BLOCK_BYTES, position)
        block = os.pread(fd, size, position - size)
        for index in range(len(block) - 1, -1, -1):
            if block[index] == 0x0A:
                newlines += 1
                if newlines == lines:
                    return position - size + index + 1
        position -= size
    return 0


def copy_from(fd: int, offset: int, write: Callable[[bytes], None]) -> int:
    """Copy the file from `offset` to its current end in blocks; returns where it stopped."""
    while True:
        block = os.pread(fd, BLOCK_BYTES, offset)
        if not block:
            return offset
        offset += len(block)
        write(block)
