"""How `orch daemon run|start` set the daemon up: the command-line options they share, the GPU
backend (and the env workers need to see the same GPUs), and the executor attempts run on."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from orchestrator.api.daemon_process import resolve_backend  # noqa: F401 (the CLI's name for it)
from orchestrator.attempts.disk_space import DEFAULT_MIN_FREE_MIB, DEFAULT_WARN_FREE_MIB
from orchestrator.cli.common import db_option
from orchestrator.daemon.state import tmux_socket_name
from orchestrator.errors import UsageError
from orchestrator.executors.base import Executor


def backend_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--backend", type=click.Choice(["nvml", "sim"]), default=None,
        help="GPU backend (env ORCH_GPU_BACKEND; default NVML).",
    )(func)


def headroom_options(func):  # type: ignore[no-untyped-def]
    func = click.option(
        "--headroom-max-gib", "headroom_max_gib", type=click.FloatRange(0.0, 1024.0), default=4.0, show_default=True,
        help="Cap on the headroom in GiB (10% of a 141 GiB card would be 14 GiB).",
    )(func)
    return click.option(
        "--headroom", "headroom_fraction", type=click.FloatRange(0.0, 0.5), default=0.10, show_default=True,
        help="Fraction of each card kept free beside every job.",
    )(func)


def order_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--order", type=click.Choice(["longest_first", "fifo"]), default="longest_first", show_default=True,
        help="Among equal priorities: longest expected run first (learned from finished jobs), or submission order.",
    )(func)


def notify_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--notify", "notify_urls", multiple=True, envvar="ORCH_NOTIFY", metavar="URL",
        help="Send a one-line summary here when a suite finishes or a job fails (Apprise URL, "
             "e.g. ntfy://TOPIC or slack://...; repeatable; env ORCH_NOTIFY, space-separated; needs orch[notify]).",
    )(func)


def host_reserve_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--host-reserve-gib", "host_reserve_gib", type=click.FloatRange(0.0, 65536.0), default=2.0, show_default=True,
        help="Host RAM kept free of jobs: a job starts only when its predicted host RAM fits in the rest.",
    )(func)


def disk_options(func):  # type: ignore[no-untyped-def]
    func = click.option(
        "--warn-free-mib", "warn_free_mib", type=click.IntRange(0, 1 << 30), default=DEFAULT_WARN_FREE_MIB,
        show_default=True, help="Warn when the runs dir's filesystem has less free space than this.",
    )(func)
    return click.option(
        "--min-free-mib", "min_free_mib", type=click.IntRange(0, 1 << 30), default=DEFAULT_MIN_FREE_MIB,
        show_default=True, help="Start nothing while the runs dir's filesystem has less free space than this.",
    )(func)


def mps_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--mps/--no-mps", "mps", default=False, envvar="ORCH_MPS", show_default=True,
        help="Run a CUDA MPS control daemon for orch's GPUs (its own, next to the state database) and point "
             "every worker that shares a card at it, each fenced at its prediction plus a margin (env ORCH_MPS).",
    )(func)


def overlap_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--overlap/--no-overlap", "overlap", default=False, envvar="ORCH_OVERLAP", show_default=True,
        help="Start a job its learned start-up ahead of the running attempt whose end makes room for it "
             "(env ORCH_OVERLAP).",
    )(func)


def check_mps(mps: bool, backend: str | None) -> None:
    """In the user's terminal: --mps needs NVIDIA's control binary and real GPUs."""
    if not mps:
        return
    if (backend or os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower() == "sim":
        raise UsageError("--mps needs real GPUs (NVML): simulated GPUs have no MPS")
    from orchestrator.gpu.mps import require_binary

    require_binary()


def poll_option(func):  # type: ignore[no-untyped-def]
    return click.option("--poll", "poll_s", type=click.FloatRange(0.05, 60.0), default=1.0, show_default=True,
                        help="Seconds between scheduling passes.")(func)


SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def executor_options(func: Any) -> Any:
    for option in reversed((
        click.option("--executor", "executor_kind", type=click.Choice(["tmux", "subprocess", "slurm"]), default=None,
                     help="Where attempts run (default: --launcher's choice, tmux when installed)."),
        click.option("--partition", default=None, help="Slurm partition for every attempt (--executor slurm)."),
        click.option("--account", default=None, help="Slurm account to charge (--executor slurm)."),
        click.option("--shard-mib", "shard_mib", type=click.IntRange(1, 10_000_000), default=None,
                     help="MiB one Slurm GPU shard stands for (default: GPU size / shards per GPU)."),
        click.option("--max-in-queue", "max_in_queue", type=click.IntRange(1, 100_000), default=16, show_default=True,
                     help="Attempts kept submitted to Slurm at once (--executor slurm)."),
        click.option("--slurm-poll", "slurm_poll_s", type=click.FloatRange(1.0, 3600.0), default=None,
                     help="Seconds between questions to Slurm about our jobs (default 30; sooner after a submission)."),
        click.option("--exit-grace", "exit_grace_s", type=click.FloatRange(0.0, 3600.0), default=None,
                     help="Seconds a Slurm job out of the queue waits for its exit.json to show on the "
                          "shared filesystem before it is lost (default 60)."),
    )):
        func = option(func)
    return func


def launcher_option(func: Any) -> Any:
    return click.option("--launcher", "launcher_kind", type=click.Choice(["tmux", "subprocess"]), default=None,
                        help="How workers run (env ORCH_LAUNCHER; default tmux when installed).")(func)


def daemon_settings_options(func: Any) -> Any:
    """What `orch daemon run` takes and `orch daemon start` passes on to it, in one list."""
    for option in reversed((executor_options, backend_option, poll_option, headroom_options, launcher_option,
                            order_option, notify_option, host_reserve_option, disk_options, mps_option, overlap_option,
                            db_option)):
        func = option(func)
    return func


def executor_args(executor_kind: str | None, partition: str | None, account: str | None,
                   shard_mib: int | None, max_in_queue: int, slurm_poll_s: float | None = None,
                   exit_grace_s: float | None = None) -> list[str]:
    """Checked here, in the user's terminal; passed on to `daemon run`."""
    for what, value in (("--partition", partition), ("--account", account)):
        if value is not None and not SLURM_NAME.fullmatch(value):
            raise UsageError(f"{what} {value!r} is not a Slurm name (letters, digits, '_', '.', '-')")
    if executor_kind != "slurm" and (partition or account or shard_mib or slurm_poll_s is not None or exit_grace_s is not None):
        raise UsageError("--partition, --account, --shard-mib, --slurm-poll and --exit-grace need --executor slurm")
    args = ["--max-in-queue", str(max_in_queue)]
    if executor_kind:
        args += ["--executor", executor_kind]
    named: tuple[tuple[str, str | int | float | None], ...] = (
        ("--partition", partition), ("--account", account), ("--shard-mib", shard_mib),
        ("--slurm-poll", slurm_poll_s), ("--exit-grace", exit_grace_s),
    )
    for flag, given in named:
        if given is not None:
            args += [flag, str(given)]
    return args


def make_daemon_executor(executor_kind: str | None, launcher_kind: str | None, db_path: Path, probe: Any,
                   partition: str | None, account: str | None, shard_mib: int | None, max_in_queue: int,
                   slurm_poll_s: float | None = None, exit_grace_s: float | None = None) -> Executor:
    from orchestrator.executors.factory import make_executor
    from orchestrator.executors.slurm.executor import SlurmOptions

    if executor_kind == "slurm":
        gpu_mib = max((s.total_mib for s in probe.snapshot()), default=None)
        options = SlurmOptions(partition, account, shard_mib, max_in_queue)
        if slurm_poll_s is not None:
            options = replace(options, poll_s=slurm_poll_s)
        if exit_grace_s is not None:
            options = replace(options, exit_grace_s=exit_grace_s)
        return make_executor("slurm", tmux_socket_name(db_path), options, gpu_mib)
    return make_executor(executor_kind or launcher_kind, tmux_socket_name(db_path))
