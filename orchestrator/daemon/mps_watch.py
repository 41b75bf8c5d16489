"""The daemon's side of CUDA MPS: start orch's control daemon with the daemon, watch it and the
cards under it every pass, stop it with the daemon. What MPS is and how it is run is
orchestrator.gpu.mps's; this module only says what happened, as events."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import MpsError
from orchestrator.gpu.mps import SPREAD_WINDOW_S, MpsState, describe, failed_cards, start_mps
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.store.card_failures import failures_since
from orchestrator.store.daemon_row import drop_daemon_mode
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event

log = logging.getLogger(__name__)


@dataclass
class MpsWatch:
    store: Store
    state: MpsState | None = None
    since_s: float = 0.0  # attempts that ended before this are not read again

    def start(self, db_path: Path, snapshots: tuple[GpuSnapshot, ...], now_s: float,
              simulated: bool = False) -> MpsState:
        """Start the control daemon for these cards (`simulated`: simulated cards, where none runs
        and the sim worker keeps its fence); raises MpsError (the daemon does not start)."""
        uuids = [s.uuid for s in snapshots]
        state, others = start_mps(db_path, uuids, simulated)
        self.state, self.since_s = state, now_s
        cards = ", ".join(str(s.index) for s in snapshots)
        started = (f"MPS simulated for GPU {cards} (no control daemon: the sim worker keeps its fence)"
                   if simulated else f"MPS control daemon started for GPU {cards} (pipe {state.control.dirs.pipe})")
        with self.store.write():
            add_event(self.store, "daemon", started)
            if others:
                add_event(self.store, "daemon", f"MPS daemons not orch's are running ({describe(others)}): "
                                                "left alone; their clients keep their server, ours use ours")
        return state

    def check(self, now_s: float, index_of: dict[str, int]) -> None:
        """Turn MPS off for a card whose server failed a worker, and for every card when the
        control daemon is gone; each with an event. Workers started later run without MPS there."""
        state = self.state
        if state is None or not state.cards:
            return
        if not state.control.alive():
            off = sorted(index_of.get(u, -1) for u in state.cards)
            state.cards.clear()
            with self.store.write():
                add_event(self.store, "daemon", f"MPS control daemon is gone: MPS off for GPU "
                                                f"{', '.join(map(str, off))}; new workers run without it")
                drop_daemon_mode(self.store, "mps")
            return
        # failures this close to the last read are read again: a spread fault's second worker
        # may end a pass after its first
        failures = [f for f in failures_since(self.store, self.since_s - SPREAD_WINDOW_S) if f.gpu_uuid in state.cards]
        self.since_s = now_s
        for uuid, why in sorted(failed_cards((f.gpu_uuid, f.ended_at, f.reason) for f in failures).items()):
            if state.turn_off(uuid):
                jobs = ", ".join(str(f.job_id) for f in failures if f.gpu_uuid == uuid)
                with self.store.write():
                    add_event(self.store, "daemon", f"{why} on GPU {index_of.get(uuid, '?')} (jobs {jobs}): MPS off "
                                                    "for that card; new workers there run without it")
                    if not state.cards:  # the last card: the daemon runs without MPS now
                        drop_daemon_mode(self.store, "mps")

    def stop(self) -> None:
        if self.state is None:
            return
        try:
            self.state.control.stop()
        except MpsError as exc:  # the daemon is stopping anyway: say it and go on
            log.warning("%s", exc)
        self.state = None
