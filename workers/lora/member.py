"""One job handed to a fused group (`share_base: fused`), and how it ends without an answer.
No torch here: a fused warm process answers its clients (accepted, or full: try the next slot)
before it imports torch, so that the processes of one sweep start side by side, not one after
another's imports."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.harness import Heartbeat

# Not an exit code: the job ends with no answer from this process (its client prints that the warm
# process ended while it trained the job, exit 1: orch counts one process death for its members).
PROCESS_ENDED = -1


@dataclass
class MemberSpec:
    """One job handed to the group: where its output goes, how it is stopped, who hears its end."""

    run_dir: Path
    config_path: Path
    env: dict[str, str] = field(default_factory=dict)
    out: Any = None  # its stdout and stderr, a text stream (None: as they are)
    stop: threading.Event = field(default_factory=threading.Event)
    done: Callable[[int], None] = lambda exit_code: None
    heartbeat: Callable[[Path, threading.Event], Heartbeat] = lambda run_dir, stop: Heartbeat(run_dir)
    # set once the job's stop is in the hands of code that honours it (the trainer saw it, or the
    # job trains alone under its own heartbeat), or the job ended: a hang is timed from there
    seen: threading.Event = field(default_factory=threading.Event)
    _claim: threading.Lock = field(default_factory=threading.Lock)
    _training: bool = False
    _withdrawn: bool = False

    def claim(self) -> bool:
        """The trainer takes the job up (False: it was withdrawn, stopped while it waited)."""
        with self._claim:
            self._training = not self._withdrawn
            return self._training

    def unclaim(self) -> None:
        """The job waits again (to train alone after the group)."""
        with self._claim:
            self._training = False

    def withdraw(self) -> bool:
        """Its stop, while it waits (queued, or to train alone): True when nothing trains it now
        and nothing will; the caller ends it."""
        with self._claim:
            self._withdrawn = self._withdrawn or not self._training
            return self._withdrawn
