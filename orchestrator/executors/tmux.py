"""The tmux executor, on libtmux: one private server, session "orch", one window per attempt.

The server listens on its own socket (`tmux -L <socket_name>`), so orch's windows never mix with
the user's sessions. tmux puts named sockets in `$TMUX_TMPDIR/tmux-<uid>/` (default /tmp), a
directory tmux creates 0700 and refuses to use when another user owns it or can read it: only
this user can reach the server. The attempt's command is the window's initial command (a
shlex-quoted argv run by /bin/sh -c, never keys typed into a shell), and windows keep their pane
after the command exits (`remain-on-exit`) so the last output stays visible.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import libtmux
from libtmux import exc as tmux_exc
from libtmux.common import tmux_cmd

from orchestrator import faults
from orchestrator.errors import LauncherError, OrchShortOf, is_orch_shortage
from orchestrator.executors.base import LaunchHandle, LaunchSpec, LocalExecutor
from orchestrator.executors.launch_gate import LaunchGate, launch_file
from orchestrator.executors.lost_marker import mark_lost
from orchestrator.executors.wrapper.run import wrapper_argv
from orchestrator.rundir_files import TOKEN_VAR
from orchestrator.store.rows import Attempt

log = logging.getLogger(__name__)

SESSION = "orch"
SESSION_DEADLINE_S = 10.0
# tmux refuses commands larger than its message size (16 KiB in 3.x); keep well below it.
MAX_COMMAND_BYTES = 12_000
MAX_ARG_BYTES = 131_072  # Linux's MAX_ARG_STRLEN: no process may be given one longer argument
# A tmux server out of file descriptors accepts no client and leaves it waiting for ever (seen
# with a daemon's `ulimit -n`, which its server inherits): every command is given up after this.
TMUX_ANSWER_S = 20.0


def too_big_for_tmux(job_id: int, argv: list[str], command_bytes: int, env_bytes: int, socket_name: str) -> str:
    """Why tmux refuses job `job_id`'s window, with the way out that works for what is big."""
    said = (f"the command and environment of job {job_id} take {command_bytes + env_bytes} bytes, "
            f"more than tmux accepts ({MAX_COMMAND_BYTES})")
    if env_bytes > command_bytes:  # an environment the server does not share (it predates it)
        return (f"{said}, most of it environment: restart orch's tmux server (`tmux -L {socket_name} "
                "kill-server`, with no workers running) so it inherits the current environment")
    longest = max((len(a.encode()) for a in argv), default=0)
    through_config = "pass large values through {config} (the attempt's config.yaml) instead of {cfg.KEY}"
    if longest > MAX_ARG_BYTES:
        return f"{said}; one argument has {longest} bytes, more than any process may be given: {through_config}"
    return (f"{said}: {through_config}, or run the daemon without tmux "
            "(`orch daemon stop`, then `orch daemon start --launcher subprocess`)")


def window_identity(attempt_id: int, token: str | None) -> str:
    """The end of an attempt's window name, which no other attempt's window has. tmux numbers
    windows (@1, @2...) per server: a restarted server, or the server of the same database
    reached by another path, gives an id again to another attempt's window, so a window is
    closed or believed only when its name ends with this."""
    return f".a{attempt_id}" + (f".{token[:12]}" if token else "")


def _attempt_identity(attempt: Attempt) -> str:
    return window_identity(attempt.id, attempt.token)


# what tmux says when the window (or its whole server) is already gone
WINDOW_NOT_FOUND = "can't find window"  # the server answered: no such window
WINDOW_GONE = (
    WINDOW_NOT_FOUND, "no server running", "server exited",
    "Connection refused", "No such file or directory",  # a dead server's socket, stale or removed
)
KILL_RETRY_S = 2.0
KILL_RETRY_POLL_S = 0.1


def _says_gone(stderr: list[str]) -> bool:
    """Whether tmux's refusal says the window (or its whole server) is gone."""
    told = " ".join(stderr)
    return any(gone in told for gone in WINDOW_GONE)


class _BoundedCommand(tmux_cmd):
    """libtmux's tmux command, with a deadline: libtmux waits for the client without one."""

    def __init__(self, *args: Any, tmux_bin: str | None = None) -> None:
        self.cmd = [tmux_bin or shutil.which("tmux") or "tmux", *(str(arg) for arg in args)]
        try:
            done = subprocess.run(self.cmd, capture_output=True, text=True, encoding="utf-8",
                                  errors="backslashreplace", timeout=TMUX_ANSWER_S, check=False)
        except FileNotFoundError:
            raise tmux_exc.TmuxCommandNotFound from None
        except subprocess.TimeoutExpired:  # run() has killed the client
            socket = next((arg[2:] for arg in self.cmd if arg.startswith("-L")), "default")
            command = next((arg for arg in self.cmd[1:] if not arg.startswith("-")), "")
            raise OrchShortOf(
                f"tmux did not answer `{command}` within {TMUX_ANSWER_S:.0f} s: its server "
                f"may be out of file descriptors (`ulimit -n`) or stopped; check `tmux -L {socket} ls`"
            ) from None
        self.returncode = done.returncode
        stdout = done.stdout.split("\n")
        while stdout and stdout[-1] == "":
            stdout.pop()
        self.stderr = [line for line in done.stderr.split("\n") if line]
        # as libtmux: has-session's answer is read from stdout
        self.stdout = [self.stderr[0]] if "has-session" in self.cmd and self.stderr and not stdout else stdout


class _BoundedServer(libtmux.Server):
    """libtmux's server, every command of it (its own methods' too) run by _BoundedCommand. Once
    a command went unanswered, the server is not asked again for TMUX_ANSWER_S: the commands
    of that while fail at once, so a daemon's pass over many windows waits once, not once each."""

    unanswered_until_s = 0.0  # on the monotonic clock

    def cmd(self, cmd: str, *args: Any, target: str | int | None = None) -> tmux_cmd:
        left_s = self.unanswered_until_s - time.monotonic()
        if left_s > 0:
            raise OrchShortOf(f"tmux did not answer a moment ago; `{cmd}` is not asked of it for another "
                              f"{left_s:.0f} s (check `tmux -L {self.socket_name} ls`)")
        target_args = ["-t", str(target)] if target is not None else []
        # (orch's server is named by its socket only: libtmux's -S, -f and colour options are unused)
        tmux_bin = getattr(self, "tmux_bin", None)  # an attribute of libtmux's Server since 0.38
        try:
            return _BoundedCommand(f"-L{self.socket_name}", cmd, *target_args, *args, tmux_bin=tmux_bin)
        except OrchShortOf:
            self.unanswered_until_s = time.monotonic() + TMUX_ANSWER_S
            raise


class TmuxExecutor(LocalExecutor):
    name = "tmux"

    def __init__(self, socket_name: str) -> None:
        if shutil.which("tmux") is None:
            raise LauncherError(
                "tmux is not installed: install it, or set ORCH_LAUNCHER=subprocess"
            )
        self.socket_name = socket_name
        self.server = _BoundedServer(socket_name=socket_name)
        # Learned on the first launch and kept: asking tmux again for every window cost several
        # subprocesses each; a launch is then one `tmux new-window`.
        self._ready = False
        self._server_env: dict[str, str] | None = None
        self._server_pid: str | None = None  # the tmux server's pid as last seen: a change is a restart
        self._gate = LaunchGate()

    def _session(self) -> None:
        """Session "orch", created on demand; another process may be creating it at the same time.
        Plain commands through _cmd (libtmux's session objects list the server without a deadline)."""
        deadline = time.monotonic() + SESSION_DEADLINE_S
        last_error = ""
        while time.monotonic() < deadline:
            if self._cmd("has-session", "-t", f"={SESSION}").returncode == 0:
                return
            created = self._cmd("new-session", "-d", "-s", SESSION, "-n", "orch")
            if created.returncode == 0:
                self._configure()
                return
            last_error = " ".join(created.stderr)  # lost a race with another creator, or the server is starting
            time.sleep(0.1)
        raise OrchShortOf(
            f"cannot create tmux session {SESSION!r} on socket {self.socket_name!r}: {last_error}; "
            f"check `tmux -L {self.socket_name} ls`, or set ORCH_LAUNCHER=subprocess"
        )

    def _cmd(self, *args: str) -> tmux_cmd:
        """One tmux command on our server; OrchShortOf when tmux cannot even be started, or its
        server does not answer."""
        try:
            return self.server.cmd(*args)
        except OSError as error:
            raise OrchShortOf(f"cannot run tmux: {error}") from None

    def _configure(self) -> None:
        # Server-wide on our private server: windows created later inherit these.
        for args in (
            ("set-option", "-g", "default-shell", "/bin/sh"),
            ("set-option", "-g", "-w", "remain-on-exit", "on"),
            ("set-option", "-g", "history-limit", "20000"),
        ):
            proc = self._cmd(*args)
            if proc.stderr:
                raise OrchShortOf(f"tmux {' '.join(args)} failed: {' '.join(proc.stderr)}")

    def _env_for_window(self, env: dict[str, str]) -> dict[str, str]:
        """Our environment where the server's global one differs (it may predate us), plus `env`."""
        if self._server_env is None:
            try:
                self._server_env = {k: str(v) for k, v in self.server.show_environment().items()}
            except tmux_exc.LibTmuxException:
                self._server_env = {}
        server_env = self._server_env
        inherited = {k: v for k, v in os.environ.items() if server_env.get(k) != v and k != "TMUX"}
        return {**inherited, **env}

    def _prepare(self) -> None:
        """Once per launcher: the session exists and the server has our options (a session
        another orch process created has them too; setting them again is harmless)."""
        if not self._ready:
            self._session()
            self._configure()
            self._ready = True

    def _new_window_args(self, spec: LaunchSpec, gate: Path | None = None) -> list[str]:
        """`new-window` for one attempt, printing its window id and pane pid; raises
        LauncherError when tmux would refuse it or its run dir cannot be made. `gate`: the
        pane first waits there until the batch's windows are all open (LaunchGate)."""
        # `exec`: the wrapper replaces /bin/sh, so the pane's pid is the wrapper's pid.
        command = "exec " + shlex.join(wrapper_argv(spec.run_dir, spec.argv))
        if gate is not None:  # `;`: a gate that cannot be opened holds nothing back
            command = f": <{shlex.quote(str(gate))}; {command}"
        # A hang-up (the server killed) before the wrapper takes its signals is ignored, not
        # fatal: the wrapper starts, and forwards the ones that reach it from then on.
        command = f"trap '' HUP; {command}"
        environment = self._env_for_window(spec.env)
        env_bytes = sum(len(k) + len(v) + 4 for k, v in environment.items())
        if len(command) + env_bytes > MAX_COMMAND_BYTES:
            raise LauncherError(too_big_for_tmux(spec.job_id, spec.argv, len(command), env_bytes, self.socket_name))
        try:
            spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            kind = OrchShortOf if is_orch_shortage(error) else LauncherError
            raise kind(f"cannot create run dir {spec.run_dir}: {error}") from None
        name = spec.window_name + window_identity(spec.attempt_id, spec.env.get(TOKEN_VAR))
        args = ["new-window", "-d", "-P", "-F", "#{window_id} #{pane_pid}", "-t", f"={SESSION}:",
                "-n", name, "-c", _format_literal(str(spec.cwd or Path.cwd()))]
        for key, value in environment.items():
            args += ["-e", f"{key}={value}"]
        return [*args, command]

    def _run(self, args: list[str], expected: int) -> list[str]:
        """Run a tmux command (sequence); the lines it printed, one per window opened."""
        proc = self._cmd(*args)
        lines = [line for line in proc.stdout if line.strip()]
        if proc.returncode != 0 and len(lines) < expected:
            self._ready = False  # the session may have gone: make it again on the next try
        return lines

    @staticmethod
    def _handle(line: str) -> LaunchHandle:
        window_id, _, pane_pid = line.strip().partition(" ")
        return LaunchHandle(executor="tmux", pid=int(pane_pid) if pane_pid.isdigit() else None, executor_id=window_id)

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        self._prepare()
        args = self._new_window_args(spec)
        try:
            lines = self._run(args, 1)
            if not lines:
                self._prepare()
                lines = self._run(args, 1)
        except OrchShortOf as short:
            given_up = _given_up(spec, short)
            if isinstance(given_up, OrchShortOf):
                raise given_up from None
            return given_up
        if not lines:
            raise OrchShortOf(
                f"tmux could not open a window for job {spec.job_id}; "
                f"check `tmux -L {self.socket_name} ls`, or set ORCH_LAUNCHER=subprocess"
            )
        return self._handle(lines[0])

    def submit_many(self, specs: Sequence[LaunchSpec]) -> list[LaunchHandle | Exception]:
        """Open many windows in one tmux call: their `new-window` commands written to a private
        temp file and run by `source-file` (a command line is limited to one client message,
        16 KiB, about a dozen windows). Each window prints its position, so a window tmux did
        not open is known, and tried again alone."""
        if len(specs) <= 1:
            return super().submit_many(specs)
        try:
            self._prepare()
        except OrchShortOf as error:  # nothing opened: each attempt is told why
            return [error for _ in specs]
        results: list[LaunchHandle | Exception | None] = [None] * len(specs)
        lines: list[str] = []
        batched: list[int] = []  # the specs whose windows the batch opens
        gate = self._gate.shut(specs[0].run_dir) if specs else None
        try:
            for i, spec in enumerate(specs):
                try:
                    args = self._new_window_args(spec, gate)
                except LauncherError as error:
                    results[i] = error
                    continue
                if any("\n" in a or "\r" in a for a in args):
                    continue  # not for a config file's syntax: launched alone below
                args[args.index("#{window_id} #{pane_pid}")] = f"#{{window_id}} #{{pane_pid}} {i}"
                lines.append(" ".join(_tmux_quote(a) for a in args))
                batched.append(i)
            if lines:
                try:
                    sourced = self._source(lines, self._gate.runs_dir(specs[0].run_dir))
                except OrchShortOf as short:  # before the gate opens: a window opened late starts nothing
                    for i in batched:
                        results[i] = _given_up(specs[i], short)
                    sourced = []
                faults.reach("mid_launch_batch")  # windows open, their attempts not yet recorded
                for line in sourced:
                    window_id, pane_pid, index = [*line.split(), "", "", ""][:3]
                    if index.isdigit() and int(index) < len(specs):
                        results[int(index)] = self._handle(f"{window_id} {pane_pid}")
        finally:
            self._gate.release()
        for i, spec in enumerate(specs):
            if results[i] is None:
                results[i] = self._submit_or_error(spec)
        return [r for r in results if r is not None]

    def _source(self, commands: list[str], runs_dir: Path | None = None) -> list[str]:
        """Run tmux commands from a file: in the runs dir where there is one (0700, ours; a file
        a killed daemon left there is swept when the next one starts), 0600: it holds the jobs'
        environment (suite secrets, attempt tokens)."""
        fd, name = launch_file(runs_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("\n".join(commands) + "\n")
            faults.reach("launch_file_written")
            proc = self._cmd("source-file", name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)
        return [line for line in proc.stdout if line.strip()]

    def _seen_server(self, pid: str) -> None:
        """Note the server's pid; a different one means orch's tmux server was restarted (the
        user's `tmux kill-server`): every window id of the old one is void, and the new server
        needs the session, options and environment set up again."""
        if self._server_pid is not None and pid != self._server_pid:
            log.warning("orch's tmux server was restarted (pid %s, now %s): windows of the old server are gone; "
                        "their attempts are judged by their run dirs", self._server_pid, pid)
            self._ready = False
            self._server_env = None
        self._server_pid = pid

    def _window(self, window_id: str) -> tuple[bool, str] | None:
        """(whether its command has exited, its name) of a window; None when there is none.
        LauncherError when tmux cannot say (a client that cannot reach its server on a loaded
        machine): a launching attempt is not taken for lost on that."""
        proc = self._cmd("list-panes", "-t", window_id, "-F", "#{pid} #{pane_dead} #{window_name}")
        if proc.returncode != 0:
            if _says_gone(proc.stderr):
                return None
            raise LauncherError(f"tmux could not list window {window_id}: {' '.join(proc.stderr)}")
        if not proc.stdout:
            return None
        pid, dead, name = [*proc.stdout[0].split(" ", 2), "", ""][:3]
        self._seen_server(pid)
        return dead == "1", name

    def _pane_dead(self, window_id: str, identity: str | None = None) -> bool | None:
        """None when the window does not exist (or, given `identity`, is another attempt's),
        else whether its command has exited."""
        window = self._window(window_id)
        if window is None or (identity is not None and not window[1].endswith(identity)):
            return None
        return window[0]

    def window_alive(self, window_id: str) -> bool:
        return self._pane_dead(window_id) is False

    def started_alive(self, attempt: Attempt) -> bool | None:
        """Whether the attempt's pane still runs its command (before its wrapper wrote pid.json);
        a window of that id that is another attempt's (a restarted server) is not its pane."""
        if attempt.executor != self.name or not attempt.executor_id:
            return None
        return self._pane_dead(attempt.executor_id, _attempt_identity(attempt)) is False

    def cleanup(self, attempts: Sequence[Attempt]) -> None:
        """Close the windows of attempts whose ends are recorded (their output is in stdout.log),
        so windows of finished attempts do not pile up. Only a window whose name is the
        attempt's is closed: after a server restart its id may be a new attempt's window."""
        wanted = {a.executor_id: _attempt_identity(a) for a in attempts if a.executor == self.name and a.executor_id}
        if not wanted:
            return
        proc = self._cmd("list-windows", "-a", "-F", "#{pid} #{window_id} #{window_name}")
        if proc.returncode != 0:
            return  # no server: no window left to close
        ours: list[str] = []
        for line in proc.stdout:
            pid, window_id, name = [*line.split(" ", 2), "", ""][:3]
            self._seen_server(pid)
            identity = wanted.get(window_id)
            if identity is not None and name.endswith(identity):
                ours.append(window_id)
        self.kill_windows(ours)

    def kill_window(self, window_id: str) -> None:
        """Kill the window (its pane's processes get SIGHUP); one already gone, or whose server
        is gone, is no error. Any other refusal is asked again for a moment, and so is one that
        says the server is gone (no server, a refused connection): on a loaded machine a tmux
        client can fail to reach its server in those words, and a kill skipped then left the
        window, and whatever still ran in it, in place. Only tmux's own "can't find window" is
        taken at once."""
        deadline = time.monotonic() + KILL_RETRY_S
        while True:
            proc = self._cmd("kill-window", "-t", window_id)
            if proc.returncode == 0 or WINDOW_NOT_FOUND in " ".join(proc.stderr):
                return
            if time.monotonic() >= deadline:
                if _says_gone(proc.stderr):  # still unreachable: the server is gone
                    return
                raise LauncherError(f"tmux could not kill window {window_id}: {' '.join(proc.stderr)}")
            time.sleep(KILL_RETRY_POLL_S)

    def kill_windows(self, window_ids: list[str]) -> None:
        """Remove many windows in one tmux call (`source-file` goes on past a window already
        gone): one by one, each cost two tmux subprocesses, and a pass that closed a card's
        worth of ended attempts held up the next hand-off by seconds on a busy machine."""
        if len(window_ids) <= 1:
            for window_id in window_ids:
                self.kill_window(window_id)
            return
        self._source([f"kill-window -t {_tmux_quote(window_id)}" for window_id in window_ids])

    def attach(self, attempt: Attempt) -> list[str]:
        if attempt.executor != self.name or not attempt.executor_id:
            return super().attach(attempt)
        # select the window first, then attach; `tmux -L` keeps us on the private server
        return [
            "tmux",
            "-L",
            self.socket_name,
            "select-window",
            "-t",
            attempt.executor_id,
            ";",
            "attach-session",
            "-t",
            SESSION,
        ]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kill_server()

    def kill_server(self) -> None:
        """Stop orch's tmux server (tests, and `orch daemon stop --all`); none running is no error."""
        self._cmd("kill-server")


def _given_up(spec: LaunchSpec, short: OrchShortOf) -> LaunchHandle | OrchShortOf:
    """A launch whose tmux command was given up on (no answer in time): the server may still
    open its window later. Its run dir is marked lost first, so that window's wrapper starts
    nothing and the attempt is requeued (`short`); where the wrapper already recorded itself, it
    runs: its handle, with no window to name (it is followed by its pid.json)."""
    if mark_lost(spec.run_dir):
        return short
    return LaunchHandle(executor="tmux", pid=None, executor_id=None)


def _format_literal(text: str) -> str:
    """`text` where tmux expands formats (`-c`: a folder named `exp #(id > f)` would run that
    command): every `#` doubled, which tmux reads as one literal `#`."""
    return text.replace("#", "##")


def _tmux_quote(text: str) -> str:
    """One word of tmux's command syntax that stands for `text` exactly: single quotes keep
    everything literal ($, ~, #, ;, braces); a quote itself is closed, escaped and reopened."""
    return "'" + text.replace("'", "'\\''") + "'"
