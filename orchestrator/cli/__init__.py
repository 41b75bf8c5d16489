"""`orch` command line. Commands live one per module; errors map to exit codes here, once."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import click

from orchestrator.errors import OrchError
from orchestrator.wording import one_line

# Which module registers each command. A command's module (and what it imports: the store,
# the scheduler, rich) is imported only when that command runs: every `orch` call paid ~0.7 s
# of imports for all of them.
COMMAND_MODULES: dict[str, str] = {
    "submit": "orchestrator.cli.submit",
    "jobs": "orchestrator.cli.jobs.command", "show": "orchestrator.cli.jobs.command",
    "logs": "orchestrator.cli.jobs.command",
    "plan": "orchestrator.cli.plan",
    "cancel": "orchestrator.cli.control", "retry": "orchestrator.cli.control",
    "resume": "orchestrator.cli.control", "attach": "orchestrator.cli.control",
    "daemon": "orchestrator.cli.daemon.command",
    "status": "orchestrator.cli.status.command", "gpus": "orchestrator.cli.status.command",
    "results": "orchestrator.cli.results",
    "curves": "orchestrator.cli.curves",
    "trials": "orchestrator.cli.trials",
    "demo": "orchestrator.cli.demo",
    "web": "orchestrator.cli.web_cmd", "report": "orchestrator.cli.web_cmd",
    "memory": "orchestrator.cli.memory",
}


class LazyGroup(click.Group):
    """A group whose commands are registered by their module on first use."""

    def _load(self, name: str) -> None:
        module = COMMAND_MODULES.get(name)
        if module is not None and name not in self.commands:
            importlib.import_module(module).register(self)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        for name in COMMAND_MODULES:
            self._load(name)
        return super().list_commands(ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="orch", prog_name="orch")
def cli() -> None:
    """orch: pack GPU sweeps of LoRA fine-tuning jobs by live memory, retry OOMs, show it live."""


def _register() -> None:
    """Register every command now (tests and tools that walk the whole tree)."""
    for name in COMMAND_MODULES:
        cli._load(name)


def _one_line(text: str) -> str:
    return one_line(" ".join(text.split())) or "error"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `orch` console script. Returns the exit code."""
    try:
        # a command's own exit code (click.exceptions.Exit) comes back as the return value here
        returned = cli.main(args=list(argv) if argv is not None else None, prog_name="orch", standalone_mode=False)
        if isinstance(returned, int) and not isinstance(returned, bool):
            return returned
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.exceptions.Abort:
        click.echo("orch: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:
        # `orch`, `orch daemon`, `orch plan` alone: the help a user asked for, as --help prints it.
        click.echo(exc.ctx.get_help() if exc.ctx else cli.get_help(click.Context(cli, info_name="orch")))
        return 0
    except click.UsageError as exc:
        command = f" {exc.ctx.command_path.split(' ', 1)[1]}" if exc.ctx and " " in exc.ctx.command_path else ""
        click.echo(f"orch: error: {_one_line(exc.format_message())} (see orch{command} --help)", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"orch: error: {_one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except OrchError as exc:
        click.echo(f"orch: error: {_one_line(str(exc))}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


def console_main() -> int:
    """The `orch` console script. sqlite-utils imports pandas and numpy when they are installed
    (about 2 s with the training extras); orch never gives it DataFrames or arrays, so a CLI
    process skips them. Only this entry point does it: library users keep their pandas."""
    for heavy in ("pandas", "numpy"):
        sys.modules.setdefault(heavy, None)  # type: ignore[arg-type]
    # Everything orch creates (state.db, logs, run dirs, simulated GPU dirs) is owner-only.
    os.umask(0o077)
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
