"""`orch daemon run|start` options, declared once (cli/daemon/options.py): every option reaches
the `run` that `start` spawns, and the executor names come from one registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest

from orchestrator.cli.daemon.command import daemon_run, daemon_start
from orchestrator.daemon.options import DaemonOptions
from orchestrator.errors import UsageError
from orchestrator.executors.backends import EXECUTOR_NAMES

# A value other than its default for every option (a test fails here when one is added without)
CHANGED: dict[str, Any] = {
    "executor_kind": "slurm",
    "partition": "gpu-a",
    "account": "lab.1",
    "shard_mib": 1024,
    "max_in_queue": 3,
    "slurm_poll_s": 7.5,
    "exit_grace_s": 12.25,
    "backend": "sim",
    "poll_s": 0.2,
    "headroom_fraction": 0.3,
    "headroom_max_gib": 2.5,
    "order": "fifo",
    "notify_urls": ("ntfy://a", "json://localhost/b"),
    "host_reserve_gib": 0.5,
    "min_free_mib": 7,
    "warn_free_mib": 9,
    "mps": True,
    "overlap": True,
    "db_path": Path("/tmp/some where/state.db"),
}


def _parsed_by(command: click.Command, argv: list[str]) -> DaemonOptions:
    """What `command` makes of `argv` (click's own parsing, nothing run)."""
    context = command.make_context(command.name, list(argv))
    return DaemonOptions(**context.params)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("ORCH_DB", "ORCH_NOTIFY", "ORCH_MPS", "ORCH_OVERLAP", "ORCH_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_every_option_has_a_changed_value_here() -> None:
    assert set(CHANGED) == {f.name for f in dataclasses.fields(DaemonOptions)}
    for name, value in CHANGED.items():
        assert value != getattr(DaemonOptions(), name), name


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_each_option_round_trips_through_starts_argv(
    name: str, clean_env: pytest.MonkeyPatch
) -> None:
    options = DaemonOptions(**{name: CHANGED[name]})
    for var, value in options.env().items():  # what `start` hands its child in the environment
        clean_env.setenv(var, value)
    assert _parsed_by(daemon_run, options.argv()) == options


def test_all_options_at_once_round_trip(clean_env: pytest.MonkeyPatch) -> None:
    options = DaemonOptions(**CHANGED)
    for var, value in options.env().items():
        clean_env.setenv(var, value)
    assert _parsed_by(daemon_run, options.argv()) == options
    assert "ntfy://a" not in " ".join(options.argv())  # tokens stay off the visible command line


def test_a_switch_is_passed_either_way_so_no_env_var_flips_it(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("ORCH_MPS", "1")
    off = DaemonOptions(mps=False)
    assert "--no-mps" in off.argv()
    assert _parsed_by(daemon_run, off.argv()).mps is False


def test_run_and_start_take_the_same_options() -> None:
    def flags(command: click.Command) -> set[str]:
        return {flag for p in command.params for flag in (*p.opts, *p.secondary_opts)}

    assert flags(daemon_run) == flags(daemon_start)
    assert {p.name for p in daemon_run.params} == {
        f.name for f in dataclasses.fields(DaemonOptions)
    }


def test_the_settings_come_from_the_options() -> None:
    settings = DaemonOptions(**CHANGED).settings()
    assert settings.db_path == CHANGED["db_path"]
    assert settings.headroom_max_mib == 2560 and settings.host_reserve_mib == 512
    assert settings.poll_s == 0.2 and settings.order == "fifo" and settings.max_in_queue == 3
    assert settings.notify_urls == CHANGED["notify_urls"] and settings.mps and settings.overlap
    assert (settings.min_free_mib, settings.warn_free_mib, settings.headroom_fraction) == (
        7,
        9,
        0.3,
    )


def test_launcher_is_the_same_option_as_executor(clean_env: pytest.MonkeyPatch) -> None:
    assert _parsed_by(daemon_run, ["--launcher", "subprocess"]).executor_kind == "subprocess"
    assert _parsed_by(daemon_start, ["--executor", "tmux"]).executor_kind == "tmux"
    choice = next(p for p in daemon_run.params if p.name == "executor_kind").type
    assert isinstance(choice, click.Choice) and tuple(choice.choices) == EXECUTOR_NAMES


def test_slurm_flags_need_the_slurm_executor() -> None:
    with pytest.raises(UsageError, match="need --executor slurm"):
        DaemonOptions(partition="gpu").check_executor()
    with pytest.raises(UsageError, match="not a Slurm name"):
        DaemonOptions(executor_kind="slurm", account="a b").check_executor()
    DaemonOptions(executor_kind="slurm", partition="gpu", exit_grace_s=0.0).check_executor()
