"""The daemon's half of the lost-marker handshake with the wrapper (wrapper.run.claim_run_dir).

The daemon creates the run dir's lost marker (O_EXCL) and then looks for pid.json; the wrapper
creates pid.json exclusively and then looks for the marker. Each writes its flag before reading
the other's, so at most one goes on: either the wrapper never starts the worker, or the daemon
sees pid.json and treats the attempt as started. Used before an attempt without pid.json is
declared lost (attempts.reconcile), and when a launch was given up on while tmux may still open
its window (executors.tmux)."""

from __future__ import annotations

import logging
from pathlib import Path

from orchestrator.executors.runs_tree import RunTreeError, create_exclusive, exists, open_run_dir
from orchestrator.rundir_files import RunDir

log = logging.getLogger(__name__)


def mark_lost(run_dir: Path) -> bool:
    """Leave the lost marker, then look for pid.json. True: no worker can start for this run dir
    any more, the attempt may be closed as lost; False: a wrapper recorded itself first, so
    judge the attempt again on the next pass."""
    run_dir = Path(run_dir)
    try:
        with open_run_dir(run_dir, create=True) as dir_fd:
            create_exclusive(dir_fd, RunDir.LOST_MARKER)  # False: left by an earlier pass
            return not exists(dir_fd, RunDir.PID)
    except (RunTreeError, OSError) as exc:
        # A run dir we cannot write to (or reach safely) is one the wrapper cannot record itself in either.
        log.warning("cannot mark %s lost (%s); no wrapper can record itself there", run_dir, exc)
        return True
