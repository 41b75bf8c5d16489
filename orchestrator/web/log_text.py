"""A worker's log as a reader wants it: each `\r` redraw (tqdm's progress bars) collapsed to its
last state, so the result or the traceback is not buried under a line per redraw. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def _last_state(line: str) -> str:
    """What a terminal shows of one line after its carriage-return redraws: the last non-empty
    one (`a\r` and a Windows `a\r` line ending keep `a`)."""
    if "\r" not in line:
        return line
    drawn = [part for part in line.split("\r") if part]
    return drawn[-1] if drawn else ""


def collapse_redraws(text: str) -> str:
    """Every line at its last redraw; lines without `\r` as they are."""
    return "\n".join(_last_state(line) for line in text.split("\n"))


def log_tail(text: str, max_lines: int, *, cut_at_start: bool) -> str:
    """The last `max_lines` lines after collapsing redraws; `cut_at_start`: the text is the end
    of a longer file, so its first line is a piece of one and is left out."""
    lines = collapse_redraws(text).split("\n")
    if cut_at_start and len(lines) > 1:
        lines = lines[1:]
    return "\n".join(lines[-max_lines:])


def collapsed_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A whole log, read chunk by chunk, with each line's redraws collapsed. A line being
    redrawn holds at most its last two states in memory, however many redraws it has."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if lines:
            yield b"".join(_last_state(line.decode("utf-8", errors="replace")).encode() + b"\n" for line in lines)
        if pending.count(b"\r") > 1:
            pending = b"\r".join(pending.split(b"\r")[-2:])
    if pending:
        yield _last_state(pending.decode("utf-8", errors="replace")).encode()
