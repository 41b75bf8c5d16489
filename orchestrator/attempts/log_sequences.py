"""The terminal control sequences a worker's log may hold (written by user code: untrusted), as
one pattern: colours and text attributes (SGR), which `orch logs` keeps, and everything else a
terminal obeys (a clipboard write, a title change, a query, cursor moves, other control
characters). Pure."""

from __future__ import annotations

import re

MAX_PENDING_CHARS = 4096  # an escape sequence left open longer than this is dropped, not kept

# Colours and text attributes (SGR): the only sequences `orch logs` passes on (SEQUENCE's group 1).
_SGR = r"\x1b\[[0-9;:]*m"
_STRING_END = r"(?:\x07|\x1b\\|\x9c)"
_BOUNDED = ".{0," + str(MAX_PENDING_CHARS) + "}?"
_COMPLETE = (
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours (kept), cursor moves, erases, queries, modes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # the same, by its one-character introducer
    r"|\x1b[\]PX^_]" + _BOUNDED + _STRING_END  # strings: OSC (title, clipboard), DCS, APC...
    + r"|[\x9d\x90\x98\x9e\x9f]" + _BOUNDED + _STRING_END
    + r"|\x1b[ -/]*[0-OQ-WYZ\\`-~]"  # two-character escapes (not the introducers above)
)
SEQUENCE = re.compile(
    "(" + _SGR + ")|" + _COMPLETE
    + r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]",  # any other control character, a lone ESC too (tab, CR, LF kept)
    re.DOTALL,
)
FINISHED = re.compile(_COMPLETE, re.DOTALL)
INTRODUCER = re.compile("[\x1b\x9b\x9d\x90\x98\x9e\x9f]")


def plain_text(text: str) -> str:
    """Text without any control sequence, colours included: a log's lines for a page (tabs,
    line ends and carriage returns kept)."""
    return SEQUENCE.sub("", text)
