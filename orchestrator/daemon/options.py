"""The options of `orch daemon run` and `orch daemon start`, declared once: each field of
DaemonOptions carries its click option in its metadata, and from that one list come the click
options both commands take, the argv `start` passes on to the `run` it spawns, and the daemon's
settings. A flag added here reaches all three; none can be forgotten on the way."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from orchestrator.attempts.disk_space import DEFAULT_MIN_FREE_MIB, DEFAULT_WARN_FREE_MIB
from orchestrator.daemon.settings import DaemonSettings
from orchestrator.errors import UsageError
from orchestrator.executors.backends import EXECUTOR_NAMES

SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
NOTIFY_VAR = "ORCH_NOTIFY"  # the URLs carry tokens: `start` passes them in the environment


def _option(
    *flags: str,
    setting: str | None = None,
    to_setting: Callable[[Any], Any] | None = None,
    on_argv: bool = True,
    **click_kwargs: Any,
) -> dict[str, Any]:
    """A field's metadata: its click flags and keywords, the DaemonSettings field it sets (with
    a conversion), and whether `start` passes it on the command line (else in the environment)."""
    return {
        "flags": flags,
        "click": click_kwargs,
        "setting": setting,
        "to_setting": to_setting,
        "on_argv": on_argv,
    }


def _gib_to_mib(gib: float) -> int:
    return round(gib * 1024)


@dataclass(frozen=True)
class DaemonOptions:
    executor_kind: str | None = field(
        default=None,
        metadata=_option(
            "--executor",
            "--launcher",
            type=click.Choice(EXECUTOR_NAMES),
            help="Where attempts run (--launcher is the same; env ORCH_LAUNCHER for tmux or subprocess; "
            "default tmux when installed).",
        ),
    )
    partition: str | None = field(
        default=None,
        metadata=_option(
            "--partition", help="Slurm partition for every attempt (--executor slurm)."
        ),
    )
    account: str | None = field(
        default=None,
        metadata=_option("--account", help="Slurm account to charge (--executor slurm)."),
    )
    shard_mib: int | None = field(
        default=None,
        metadata=_option(
            "--shard-mib",
            type=click.IntRange(1, 10_000_000),
            help="MiB one Slurm GPU shard stands for (default: GPU size / shards per GPU).",
        ),
    )
    max_in_queue: int = field(
        default=16,
        metadata=_option(
            "--max-in-queue",
            setting="max_in_queue",
            type=click.IntRange(1, 100_000),
            show_default=True,
            help="Attempts kept submitted to Slurm at once (--executor slurm).",
        ),
    )
    slurm_poll_s: float | None = field(
        default=None,
        metadata=_option(
            "--slurm-poll",
            type=click.FloatRange(1.0, 3600.0),
            help="Seconds between questions to Slurm about our jobs (default 30; sooner after a "
            "submission).",
        ),
    )
    exit_grace_s: float | None = field(
        default=None,
        metadata=_option(
            "--exit-grace",
            type=click.FloatRange(0.0, 3600.0),
            help="Seconds a Slurm job out of the queue waits for its exit.json to show on the shared "
            "filesystem before it is lost (default 60).",
        ),
    )
    backend: str | None = field(
        default=None,
        metadata=_option(
            "--backend",
            type=click.Choice(["nvml", "sim"]),
            help="GPU backend (env ORCH_GPU_BACKEND; default NVML).",
        ),
    )
    poll_s: float = field(
        default=1.0,
        metadata=_option(
            "--poll",
            setting="poll_s",
            type=click.FloatRange(0.05, 60.0),
            show_default=True,
            help="Seconds between scheduling passes.",
        ),
    )
    headroom_fraction: float = field(
        default=0.10,
        metadata=_option(
            "--headroom",
            setting="headroom_fraction",
            type=click.FloatRange(0.0, 0.5),
            show_default=True,
            help="Fraction of each card kept free beside every job.",
        ),
    )
    headroom_max_gib: float = field(
        default=4.0,
        metadata=_option(
            "--headroom-max-gib",
            setting="headroom_max_mib",
            to_setting=_gib_to_mib,
            type=click.FloatRange(0.0, 1024.0),
            show_default=True,
            help="Cap on the headroom in GiB (10% of a 141 GiB card would be 14 GiB).",
        ),
    )
    order: str = field(
        default="longest_first",
        metadata=_option(
            "--order",
            setting="order",
            type=click.Choice(["longest_first", "fifo"]),
            show_default=True,
            help="Among equal priorities: longest expected run first (learned from finished jobs), "
            "or submission order.",
        ),
    )
    notify_urls: tuple[str, ...] = field(
        default=(),
        metadata=_option(
            "--notify",
            setting="notify_urls",
            to_setting=tuple,
            on_argv=False,
            multiple=True,
            envvar=NOTIFY_VAR,
            metavar="URL",
            help="Send a one-line summary here when a suite finishes or a job fails (Apprise URL, "
            "e.g. ntfy://TOPIC or slack://...; repeatable; env ORCH_NOTIFY, space-separated; "
            "needs orch[notify]).",
        ),
    )
    host_reserve_gib: float = field(
        default=2.0,
        metadata=_option(
            "--host-reserve-gib",
            setting="host_reserve_mib",
            to_setting=_gib_to_mib,
            type=click.FloatRange(0.0, 65536.0),
            show_default=True,
            help="Host RAM kept free of jobs: a job starts only when its predicted host RAM fits in "
            "the rest.",
        ),
    )
    min_free_mib: int = field(
        default=DEFAULT_MIN_FREE_MIB,
        metadata=_option(
            "--min-free-mib",
            setting="min_free_mib",
            type=click.IntRange(0, 1 << 30),
            show_default=True,
            help="Start nothing while the runs dir's filesystem has less free space than this.",
        ),
    )
    warn_free_mib: int = field(
        default=DEFAULT_WARN_FREE_MIB,
        metadata=_option(
            "--warn-free-mib",
            setting="warn_free_mib",
            type=click.IntRange(0, 1 << 30),
            show_default=True,
            help="Warn when the runs dir's filesystem has less free space than this.",
        ),
    )
    mps: bool = field(
        default=False,
        metadata=_option(
            "--mps/--no-mps",
            setting="mps",
            envvar="ORCH_MPS",
            show_default=True,
            help="Run a CUDA MPS control daemon for orch's GPUs (its own, next to the state database) "
            "and point every worker that shares a card at it; a worker whose shape has a measured "
            "peak is fenced at that peak plus 10 % (at least 512 MiB), one never measured is not fenced; "
            "a job whose prediction does not fit may start on trial into the room there is, fenced there, "
            "where that room holds the least it could need plus 2 % and the headroom. On simulated GPUs "
            "it is simulated: the sim worker keeps its fence (env ORCH_MPS).",
        ),
    )
    overlap: bool = field(
        default=False,
        metadata=_option(
            "--overlap/--no-overlap",
            setting="overlap",
            envvar="ORCH_OVERLAP",
            show_default=True,
            help="Start a job its learned start-up ahead of the running attempt whose end makes room "
            "for it (env ORCH_OVERLAP).",
        ),
    )
    db_path: Path = field(
        default=Path("state.db"),
        metadata=_option(
            "--db",
            setting="db_path",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar="ORCH_DB",
            show_default=True,
            help="State database (env ORCH_DB).",
        ),
    )

    @classmethod
    def click_options(cls, func: Any) -> Any:
        """Decorate a command with one click option per field; it receives them as keywords
        named as the fields (DaemonOptions(**kwargs) rebuilds the options)."""
        for spec in reversed(dataclasses.fields(cls)):
            meta = spec.metadata
            default = spec.default
            func = click.option(*meta["flags"], spec.name, default=default, **meta["click"])(func)
        return func

    def argv(self) -> list[str]:
        """The command-line arguments that give `orch daemon run` these options (all but those
        passed in the environment: env())."""
        args: list[str] = []
        for spec in dataclasses.fields(self):
            meta = spec.metadata
            value = getattr(self, spec.name)
            if not meta["on_argv"] or value is None:
                continue
            first = meta["flags"][0]
            if "/" in first:  # a --x/--no-x switch: said either way, so no env var can flip it
                on, off = first.split("/")
                args.append(on if value else off)
            else:
                args += [first, str(value)]
        return args

    def env(self) -> dict[str, str]:
        """What `start` passes in the environment: the notify URLs carry tokens, and a child's
        environment is its owner's alone, where its command line is anyone's to read."""
        return {NOTIFY_VAR: " ".join(self.notify_urls)} if self.notify_urls else {}

    def settings(self) -> DaemonSettings:
        """The daemon's settings these options set (the rest choose the executor and GPUs)."""
        given: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            meta = spec.metadata
            if meta["setting"] is None:
                continue
            value = getattr(self, spec.name)
            given[meta["setting"]] = meta["to_setting"](value) if meta["to_setting"] else value
        return DaemonSettings(**given)

    def check_executor(self) -> None:
        """Checked in the user's terminal (by `start`) and again by `run`."""
        for what, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not SLURM_NAME.fullmatch(value):
                raise UsageError(
                    f"{what} {value!r} is not a Slurm name (letters, digits, '_', '.', '-')"
                )
        slurm_only = (
            self.partition,
            self.account,
            self.shard_mib,
            self.slurm_poll_s,
            self.exit_grace_s,
        )
        if self.executor_kind != "slurm" and any(value is not None for value in slurm_only):
            raise UsageError(
                "--partition, --account, --shard-mib, --slurm-poll and --exit-grace "
                "need --executor slurm"
            )
