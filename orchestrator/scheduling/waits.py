"""Why a job cannot start: the packing blockers and wait reasons as values, and their text,
rendered here and nowhere else. Pure."""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar


class Blocker(str, Enum):
    """Why one job cannot start on one card now."""

    PLAN = "plan"  # the plan gives the card 0 slots
    NEVER = "never"  # the job's peak exceeds the card's size
    HELD = "held"  # kept for a starving job or a waiting gang
    ALONE = "alone"  # a job running alone holds the card
    CAP = "cap"  # the plan's cap is reached
    OCCUPIED = "occupied"  # the job must run alone and the card is not empty
    GAIN = "gain"  # one more job would add less throughput than min_stack_gain
    PROBE = "probe"  # a job of its memory family, which has measured nothing yet, runs there
    MEMORY = "memory"  # not enough free memory beside the reservations and headroom


class WaitKind(str, Enum):
    """Why a queued job waits (the one reason shown for it)."""

    PAUSED = "paused"  # its suite is paused
    CONFIG_PAUSED = "config_paused"  # its config is paused (the crash-loop guard); `text`: "CONFIG of suite SUITE"
    DRAINING = "draining"  # the daemon is draining
    HOLD = "hold"  # the daemon holds every start (a full disk, ...): `text` says why
    NO_GPU = "no_gpu"  # its --gpus names no GPU of this machine
    NO_SLOTS = "no_slots"  # every allowed GPU has 0 slots in the plan
    NEVER_FITS = "never_fits"
    HELD_FOR_GANG = "held_for_gang"
    HELD_FOR_STARVING = "held_for_starving"
    MEMORY = "memory"
    GAIN = "gain"
    PROBE = "probe"  # its family's memory is being measured on every card it could use
    RUN_ALONE = "run_alone"
    CAP_OR_ALONE = "cap_or_alone"
    CAP = "cap"
    HOST_RAM = "host_ram"  # the host's available memory
    HOST_CPUS = "host_cpus"  # cores not promised to running jobs
    GANG = "gang"  # a multi-GPU job: not enough cards fit at once


@dataclass(frozen=True)
class Wait:
    """One waiting job's reason, with the figures its text shows."""

    kind: WaitKind
    gpu: int | None = None  # the limiting (or kept) GPU
    gpus: tuple[int, ...] = ()  # the job's allowed GPUs (NO_GPU), the cards that fit now (GANG)
    free_mib: int = 0
    reserved_mib: int = 0  # for ramping jobs, on `gpu`
    need_mib: int = 0  # the job's predicted peak (per rank)
    headroom_mib: int = 0
    largest_mib: int = 0  # NEVER_FITS: the largest usable card
    for_job: int | None = None  # HELD_*: the job the card is kept for
    ready_in_s: float = math.inf  # HELD_*: until the kept-for job is expected to fit
    runs_s: float | None = None  # HELD_*: this job's expected run time
    waited_s: float = 0.0  # HELD_FOR_STARVING with no expected fit: how long the kept-for job waited
    gain: float = 0.0
    min_gain: float = 0.0
    n_gpus: int = 1  # GANG: cards it needs
    usable: int = 0  # GANG: allowed cards that can ever fit a rank
    note: str = ""  # GANG: what is reserved for it
    kept_gpu: int | None = None  # a card now kept free for this (starving) job
    text: str = ""  # HOLD: said as given; PAUSED: the suite
    free_cpus: int = 0  # HOST_CPUS
    cpus: int = 0  # HOST_CPUS: cores the job asks for
    trial_held: bool = False  # MEMORY: no start on trial while one of its kind on trial shows its peak


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def minutes(seconds: float) -> str:
    return "an unknown time" if math.isinf(seconds) else f"~{max(0.0, seconds) / 60:.0f} min"


def _list(indices: tuple[int, ...] | list[int]) -> str:
    return ", ".join(map(str, sorted(indices)))


def render(w: Wait) -> str:
    """The one line the dashboard shows for a waiting job."""
    text = _render(w)
    return text if w.kept_gpu is None else f"{text}; GPU {w.kept_gpu} kept free for it"


def _render(w: Wait) -> str:
    k = w.kind
    if k is WaitKind.PAUSED:
        # The pause's cause is said once, on the suite (orch status); each job only points to it.
        return f"suite {w.text} is paused"
    if k is WaitKind.CONFIG_PAUSED:
        return f"config {w.text} is paused"
    if k is WaitKind.DRAINING:
        return "daemon is draining: nothing new starts"
    if k is WaitKind.HOLD:
        return w.text
    if k is WaitKind.HOST_RAM:
        return f"host RAM: {_gib(max(0, w.free_mib))} free, needs {_gib(w.need_mib)}"
    if k is WaitKind.HOST_CPUS:
        return f"CPU cores: {max(0, w.free_cpus)} free, needs {w.cpus}"
    if k is WaitKind.NO_GPU:
        return f"GPU {_list(w.gpus)} does not exist on this machine"
    if k is WaitKind.NO_SLOTS:
        return "all allowed GPUs have 0 slots in the plan"
    if k is WaitKind.NEVER_FITS:
        return f"no GPU can ever fit {_gib(w.need_mib)} (largest card {_gib(w.largest_mib)})"
    if k is WaitKind.HELD_FOR_GANG or (k is WaitKind.HELD_FOR_STARVING and not math.isinf(w.ready_in_s)):
        whom = "multi-GPU job" if k is WaitKind.HELD_FOR_GANG else "job"
        runs = "its run time is not known yet" if w.runs_s is None else f"it would run {minutes(w.runs_s)}"
        return (f"held back: GPU {w.gpu} reserved for {whom} {w.for_job} (ready in {minutes(w.ready_in_s)}); "
                f"backfilling only jobs that end before then, {runs}")
    if k is WaitKind.HELD_FOR_STARVING:
        return f"held back: GPU {w.gpu} kept free for job {w.for_job} (waiting {w.waited_s / 60.0:.0f} min)"
    if k is WaitKind.MEMORY:
        ramping = f" ({_gib(w.reserved_mib)} reserved for ramping jobs)" if w.reserved_mib else ""
        trial = "; no start on trial until one of its kind started on trial shows its peak" if w.trial_held else ""
        return (f"GPU {w.gpu}: {_gib(max(0, w.free_mib))} free{ramping}, "
                f"needs {_gib(w.need_mib)} + {_gib(w.headroom_mib)} headroom{trial}")
    if k is WaitKind.GAIN:
        return (f"GPU {w.gpu}: one more job would add {w.gain:.0%} throughput "
                f"(measured), below min_stack_gain {w.min_gain:.0%}")
    if k is WaitKind.PROBE:
        return (f"GPU {w.gpu}: a job of the same memory family is measuring its peak "
                "(nothing of the family measured yet)")
    if k is WaitKind.RUN_ALONE:
        return "waiting to run alone on a GPU"
    if k is WaitKind.CAP_OR_ALONE:
        return "all allowed GPUs at their plan cap or running a job alone"
    if k is WaitKind.CAP:
        return "all allowed GPUs at their plan cap"
    assert k is WaitKind.GANG
    need = f"needs {w.n_gpus} GPUs with {_gib(w.need_mib)} + headroom free each"
    if w.usable < w.n_gpus:
        return f"{need}, but only {w.usable} allowed GPU(s) can ever fit a rank"
    reason = f"{need}: {len(w.gpus)} fit now" + (f" (GPU {_list(w.gpus)})" if w.gpus else "")
    return reason + (f"; {w.note}" if w.note else "")


def gang_note(cards: list[int], waiting: list[int], ready_in_s: float) -> str:
    """What a waiting gang has reserved, for its reason."""
    note = f"GPUs {_list(cards)} reserved for it"
    if waiting:
        note += (f" as they free up (GPU {_list(waiting)} busy; ready in {minutes(ready_in_s)}); "
                 "backfilling only jobs that end before then")
    return note


def held(suite: str, paused: Container[str], draining: bool, hold: str | None, *, config: str = "",
         paused_configs: Container[tuple[str, str]] = frozenset()) -> Wait | None:
    """Why no job of this suite (and config) may start on any executor now, or None."""
    if suite in paused:
        return Wait(WaitKind.PAUSED, text=suite)
    if (suite, config) in paused_configs:
        return Wait(WaitKind.CONFIG_PAUSED, text=f"{config} of suite {suite}")
    if hold:
        return Wait(WaitKind.HOLD, text=hold)
    if draining:
        return Wait(WaitKind.DRAINING)
    return None


def held_reason(suite: str, paused: Container[str], draining: bool, hold: str | None, *, config: str = "",
                paused_configs: Container[tuple[str, str]] = frozenset()) -> str | None:
    """The same as text, for a scheduling pass that does not pack (a cluster's queue)."""
    wait = held(suite, paused, draining, hold, config=config, paused_configs=paused_configs)
    return None if wait is None else render(wait)


class _Explained(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def wait_reason(self) -> str | None: ...


Row = TypeVar("Row", bound=_Explained)


def rows_to_explain(handed: Sequence[Row], reasons: Container[int], *, whole_queue: bool,
                    reason_left: Iterable[Row] = ()) -> list[Row]:
    """The queued jobs whose waiting reason a pass writes: after a pass over the whole queue,
    those handed to `pack` and `reason_left` (others whose old reason no longer stands); after a
    pass over the head only, those `pack` gave a reason (the rest keep theirs)."""
    if whole_queue:
        return [*handed, *reason_left]
    return [r for r in handed if r.id in reasons]


def changed_wait_reasons(rows: Iterable[_Explained], reasons: Mapping[int, str],
                         placed: Container[int]) -> list[tuple[str | None, int]]:
    """(new reason or None, job id) for each row not placed whose shown reason changes."""
    return [(reasons.get(r.id), r.id) for r in rows if r.id not in placed and reasons.get(r.id) != r.wait_reason]
