"""The scheduling pass's view of multi-GPU attempts and of the host: rows and readings in,
packing values out. Only `free_port` touches the machine."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping

from orchestrator.gpu.host import HostSnapshot
from orchestrator.scheduling.packing.gang import HostState
from orchestrator.scheduling.packing.types import RunningAttempt
from orchestrator.store.rows import Attempt


def running_attempts(
    live: Iterable[Attempt], index_of_uuid: Mapping[str, int],
    expected_end_s: Callable[[Attempt], float | None],
    fused_of: Callable[[Attempt], tuple[str | None, int]] | None = None,
) -> list[RunningAttempt]:
    """One RunningAttempt per card a live attempt runs on, holding what its tree holds there.
    `fused_of`: a live attempt's fused group and that group's cap ((None, 1): none); a member
    reserves, while it ramps up, what it was placed with (its own needs where it joined)."""
    out: list[RunningAttempt] = []
    for a in live:
        group, cap = fused_of(a) if fused_of is not None else (None, 1)
        uuids = a.cards
        held = {str(k): int(v) for k, v in a.held_by_gpu.items() if isinstance(v, int)}
        end = expected_end_s(a)
        for n, uuid in enumerate(uuids):
            index = a.gpu_index if n == 0 else index_of_uuid.get(uuid)
            if index is None:
                continue  # a card no longer read: nothing to pack there
            out.append(RunningAttempt(
                job_id=a.job_id, gpu_index=index,
                # a fused member that joined a process, or a start on trial: what it was placed with
                predicted_peak_mib=a.predicted_peak_mib if group is None and a.trial_fence_mib is None
                else min(a.predicted_peak_mib, a.reserved_mib),
                held_mib=held.get(uuid, a.held_mib if len(uuids) == 1 else 0),
                reached_peak=a.reached_peak, run_alone=a.run_alone, expected_end_s=end,
                fuse_group=group, fuse_cap=cap, base_mib=a.share_base_mib if group is not None else None,
                opened_process=group is None or a.reserved_mib >= a.predicted_peak_mib,
                fuse_process=a.fuse_process if group is not None else None,
            ))
    return out


def predict_host_mib(
    learned_mib: int | None, running_peak_mib: int | None, declared_mib: int | None
) -> tuple[int, str]:
    """Host RAM to expect of a job: learned from finished attempts of its shape, else the
    config's `host_mem_gib`, else what running attempts of its shape hold, else nothing known."""
    if learned_mib:
        return learned_mib, "measured"
    if declared_mib:
        return max(declared_mib, running_peak_mib or 0), "declared"
    if running_peak_mib:
        return running_peak_mib, "running"
    return 0, "unknown"


def host_state(
    snapshot: HostSnapshot, reserve_mib: int, live: Iterable[Attempt], cpus_of_job: Mapping[int, int | None],
    count_cpus: bool,
) -> HostState:
    """What the pass may spend: available memory minus the reserve minus what attempts still
    ramping up are expected to take; cores not promised to running attempts (when counted)."""
    outstanding = 0
    promised = 0
    for a in live:
        if not a.reached_peak:
            outstanding += max(0, a.predicted_host_mib - a.host_held_mib)
        promised += cpus_of_job.get(a.job_id) or 0
    return HostState(
        available_mib=snapshot.available_mib - reserve_mib - outstanding, total_mib=snapshot.total_mib - reserve_mib,
        free_cpus=snapshot.cpus - promised if count_cpus else None,
    )


def free_port(taken: set[int]) -> int:
    """A TCP port free on this host now and not given to a live attempt (torchrun's rendezvous)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port
    raise OSError("no free TCP port for the rendezvous")
