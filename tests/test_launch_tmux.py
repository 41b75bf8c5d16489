"""tmux specifics on a private server: remain-on-exit panes, liveness, kill, attach, races."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import psutil
import pytest
from e2e_helpers import wait_until
from rows_helpers import attempt_of

from orchestrator.errors import LauncherError, OrchShortOf
from orchestrator.executors import tmux as tmux_module
from orchestrator.executors.base import LaunchSpec
from orchestrator.executors.tmux import SESSION, TmuxExecutor

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs the tmux binary"),
]


def spec(tmp_path: Path, name: str, code: str, env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(
        job_id=1,
        attempt_id=1,
        window_name=name,
        argv=[sys.executable, "-c", code],
        env=env or {},
        run_dir=tmp_path / name,
    )


def pane_text(tmux: TmuxExecutor, window_id: str) -> str:
    """The pane's screen and scrollback (tmux may scroll a dead pane's text off the screen)."""
    return "\n".join(tmux.server.cmd("capture-pane", "-p", "-S", "-", "-t", window_id).stdout)


def _listed(tmux: TmuxExecutor, window_id: str) -> bool:
    """The window is on the server (a dead pane kept by remain-on-exit counts)."""
    return any(window.window_id == window_id for window in tmux.server.windows)


def test_window_lifecycle_remain_on_exit_and_kill(tmux: TmuxExecutor, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    code = (
        "import os, time; print('hello pane', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    )
    s = spec(tmp_path, "job1-E1-87-qnli", code)
    handle = tmux.submit(s)
    window_id = handle.executor_id
    assert handle.executor == "tmux" and window_id is not None and window_id.startswith("@")
    wait_until(lambda: (s.run_dir / "pid.json").exists())
    assert tmux.window_alive(window_id)
    window = tmux.server.windows.get(window_id=window_id)
    assert window is not None and window.window_name == "job1-E1-87-qnli.a1"  # the attempt id: who it is
    assert window.session.session_name == SESSION

    gate.touch()  # lets the worker exit on its own
    wait_until(lambda: (s.run_dir / "exit.json").exists())
    wait_until(lambda: not tmux.window_alive(window_id))
    assert _listed(tmux, window_id)  # remain-on-exit keeps the dead pane
    wait_until(lambda: "hello pane" in pane_text(tmux, window_id))

    tmux.kill_window(window_id)
    assert not _listed(tmux, window_id)
    tmux.kill_window(window_id)  # already gone: no error
    assert not tmux.window_alive("@99999")


def test_env_set_after_the_server_started_still_reaches_the_worker(
    tmux: TmuxExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = spec(tmp_path, "first", "pass")
    tmux.submit(first)  # starts the server with the environment of that moment
    wait_until(lambda: (first.run_dir / "exit.json").exists())

    monkeypatch.setenv("ORCH_TEST_LATE", "late value")
    code = "import os; print('late=' + os.environ.get('ORCH_TEST_LATE', 'missing'))"
    second = spec(tmp_path, "second", code)
    tmux.submit(second)
    wait_until(lambda: (second.run_dir / "exit.json").exists())
    assert "late=late value" in (second.run_dir / "stdout.log").read_text()


def test_concurrent_launchers_share_one_session(tmux: TmuxExecutor, tmp_path: Path) -> None:
    others = [TmuxExecutor(tmux.socket_name) for _ in range(4)]
    errors: list[BaseException] = []

    def go(launcher: TmuxExecutor, index: int) -> None:
        try:
            launcher.submit(spec(tmp_path, f"race{index}", "pass"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(launcher, i)) for i, launcher in enumerate(others)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert [s.session_name for s in tmux.server.sessions] == [SESSION]
    exits = [tmp_path / f"race{index}" / "exit.json" for index in range(4)]
    wait_until(lambda: all(path.exists() for path in exits))


def test_attach_command_targets_the_private_socket(tmux: TmuxExecutor) -> None:
    argv = tmux.attach(attempt_of(executor="tmux", executor_id="@3"))
    assert argv[:3] == ["tmux", "-L", tmux.socket_name]
    assert "@3" in argv and "attach-session" in argv


def test_killing_a_running_window_stops_the_worker_and_records_it(
    tmux: TmuxExecutor, tmp_path: Path
) -> None:
    s = spec(tmp_path, "doomed", "import time; print('ready', flush=True); time.sleep(60)")
    handle = tmux.submit(s)
    assert handle.executor_id is not None
    log = s.run_dir / "stdout.log"
    wait_until(lambda: log.exists() and "ready" in log.read_text())
    child_pid = json.loads((s.run_dir / "pid.json").read_text())["child_pid"]

    tmux.kill_window(handle.executor_id)
    # the wrapper records the end after its sampler and tee threads stop: on a loaded 2-core
    # machine (the full suite, four test processes) that once took longer than 15 s
    wait_until(lambda: (s.run_dir / "exit.json").exists(), 60, "the wrapper's exit.json")
    record = json.loads((s.run_dir / "exit.json").read_text())
    assert record["signal"] in (1, 15), record  # not the worker's own end, 60 s later
    wait_until(
        lambda: not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == "zombie"
    )


def test_launch_many_opens_every_window_in_one_call_with_values_kept_exactly(
    tmux: TmuxExecutor, tmp_path: Path
) -> None:
    # Values tmux's command syntax would otherwise read: quotes, $VAR, ;, #, braces, ~, %if.
    tricky = "a'b\"c $HOME; d #e {f} ~g \\h %if"
    code = "import os, pathlib; pathlib.Path(os.environ['ORCH_RUN_DIR'], 'seen').write_text(os.environ['TRICKY'])"
    specs = [
        spec(
            tmp_path,
            f"job{i}-many",
            code,
            {"TRICKY": f"{tricky} {i}", "ORCH_RUN_DIR": str(tmp_path / f"job{i}-many")},
        )
        for i in range(12)
    ]
    # a newline cannot go through a command file: that window is opened on its own
    specs.append(
        spec(
            tmp_path,
            "job12-many",
            code,
            {"TRICKY": "two\nlines", "ORCH_RUN_DIR": str(tmp_path / "job12-many")},
        )
    )
    handles = tmux.submit_many(specs)
    assert len(handles) == len(specs)
    assert all(not isinstance(h, Exception) for h in handles)
    assert len({h.executor_id for h in handles if not isinstance(h, Exception)}) == len(specs)
    for i, s in enumerate(specs):
        seen = s.run_dir / "seen"
        # written by a plain write_text: created empty first, so wait for its content too
        wait_until(lambda seen=seen: seen.exists() and seen.stat().st_size > 0, 20, f"window {i} ran")
        assert seen.read_text() == s.env["TRICKY"]
    handle = handles[3]
    assert not isinstance(handle, Exception) and handle.pid is not None
    # the pid printed for a window is its pane's: the wrapper that ran job 3
    assert json.loads((specs[3].run_dir / "pid.json").read_text())["pid"] == handle.pid


def test_launch_many_reports_a_window_tmux_refuses_and_opens_the_rest(tmux: TmuxExecutor, tmp_path: Path) -> None:
    code = "print('ok')"
    too_big = spec(tmp_path, "job2-big", code, {"BIG": "x" * 20_000})
    handles = tmux.submit_many([spec(tmp_path, "job1-ok", code), too_big, spec(tmp_path, "job3-ok", code)])
    assert isinstance(handles[1], Exception) and "more than tmux" in str(handles[1])
    assert not isinstance(handles[0], Exception) and not isinstance(handles[2], Exception)
    assert handles[0].executor_id != handles[2].executor_id


def test_many_windows_close_in_one_call_past_one_already_gone(tmux: TmuxExecutor, tmp_path: Path) -> None:
    handles = [tmux.submit(spec(tmp_path, f"w{i}", "pass")) for i in range(3)]
    ids = [h.executor_id for h in handles]
    assert all(ids) and all(_listed(tmux, w) for w in ids)
    tmux.kill_window(ids[1])  # closed by someone else first
    calls: list[tuple[str, ...]] = []
    real_cmd = tmux.server.cmd
    tmux.server.cmd = lambda *args: calls.append(args) or real_cmd(*args)  # type: ignore[method-assign]
    tmux.kill_windows([w for w in ids if w])
    assert [c[0] for c in calls] == ["source-file"]
    assert not any(_listed(tmux, w) for w in ids)


@pytest.mark.parametrize(("refused_first", "said"), [
    (("list-panes", "kill-window"), "error connecting to server (Resource temporarily unavailable)"),
    # words that also mean "gone" (a dead server's socket): taken at once, they left the worker
    # running its full length in a loaded run
    (("kill-window",), "error connecting to /tmp/tmux (Connection refused)"),
])
def test_a_kill_that_tmux_refuses_for_a_moment_is_asked_again(
    tmux: TmuxExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_first: tuple[str, ...], said: str
) -> None:
    """A tmux client that cannot reach its server for a moment (a loaded machine) must not make
    the kill a no-op, silent or raised: the worker would run to its end."""
    s = spec(tmp_path, "stubborn", "import time; print('ready', flush=True); time.sleep(60)")
    handle = tmux.submit(s)
    assert handle.executor_id is not None
    log = s.run_dir / "stdout.log"
    wait_until(lambda: log.exists() and "ready" in log.read_text())
    real_cmd = tmux._cmd
    refused: list[str] = []

    def flaky(*args: str) -> object:
        if args[0] in refused_first and not refused:
            refused.append(args[0])
            proc = real_cmd("display-message", "-p", "x")
            proc.returncode, proc.stdout = 1, []
            proc.stderr = [said]
            return proc
        return real_cmd(*args)

    monkeypatch.setattr(tmux, "_cmd", flaky)
    tmux.kill_window(handle.executor_id)
    assert refused and not _listed(tmux, handle.executor_id)
    wait_until(lambda: (s.run_dir / "exit.json").exists(), 60, "the wrapper's exit.json")
    assert json.loads((s.run_dir / "exit.json").read_text())["signal"] in (1, 15)


def test_a_window_tmux_cannot_list_for_a_moment_is_not_taken_for_gone(
    tmux: TmuxExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launching attempt whose window tmux cannot list (a client that cannot reach its server)
    is not judged lost on that: the executor says it cannot tell (the watcher then waits out the
    launch grace); a window that is gone is still gone."""
    s = spec(tmp_path, "listed", "import time; print('ready', flush=True); time.sleep(60)")
    handle = tmux.submit(s)
    assert handle.executor_id is not None
    attempt = attempt_of(executor="tmux", executor_id=handle.executor_id)
    real_cmd = tmux._cmd

    def unreachable(*args: str) -> object:
        if args[0] != "list-panes":
            return real_cmd(*args)
        proc = real_cmd("display-message", "-p", "x")
        proc.returncode, proc.stdout = 1, []
        proc.stderr = ["error connecting to server (Resource temporarily unavailable)"]
        return proc

    monkeypatch.setattr(tmux, "_cmd", unreachable)
    with pytest.raises(LauncherError, match="could not list window"):
        tmux.window_alive(handle.executor_id)
    monkeypatch.undo()
    assert tmux.window_alive(handle.executor_id)
    tmux.kill_window(handle.executor_id)
    assert not tmux.window_alive(handle.executor_id)  # gone: no error
    assert tmux.started_alive(attempt) is False


def test_a_server_that_never_answers_is_given_up_on_with_a_shortage(
    tmux: TmuxExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tmux server out of file descriptors accepts no client, and libtmux's client waits for
    ever: a daemon waiting there launched, watched and stopped nothing. A stopped server answers
    no client either; each command is given up on after its deadline as orch's own shortage."""
    s = spec(tmp_path, "frozen", "import time; time.sleep(60)")
    handle = tmux.submit(s)
    assert handle.executor_id is not None
    server_pid = int(tmux.server.cmd("display-message", "-p", "#{pid}").stdout[0])
    monkeypatch.setattr(tmux_module, "TMUX_ANSWER_S", 1.0)
    os.kill(server_pid, signal.SIGSTOP)
    try:
        with pytest.raises(OrchShortOf, match=r"did not answer `list-panes` within 1 s"):
            tmux.window_alive(handle.executor_id)
        # for a while the server is not asked again: a pass over many windows waits once, not once each
        with pytest.raises(OrchShortOf, match="not asked of it for another"):
            tmux.window_alive(handle.executor_id)
        tmux.server.unanswered_until_s = 0.0  # that while over
        with pytest.raises(OrchShortOf, match="did not answer"):
            tmux.submit(spec(tmp_path, "never", "print('never')"))
    finally:
        os.kill(server_pid, signal.SIGCONT)
    monkeypatch.undo()
    tmux.server.unanswered_until_s = 0.0
    assert tmux.window_alive(handle.executor_id)  # answered again: the server was only slow
    tmux.kill_window(handle.executor_id)
    # the server carries out the launch it was sent once it runs again: that window's wrapper
    # finds its run dir marked lost (the attempt was requeued) and starts nothing
    never = tmp_path / "never"
    assert (never / "lost").exists()

    def never_window_ended() -> bool:
        listed = tmux.server.cmd("list-windows", "-a", "-F", "#{window_name} #{pane_dead}").stdout
        return any(line.startswith("never") and line.endswith(" 1") for line in listed)

    wait_until(never_window_ended, 30, "the late window's wrapper to end")
    assert not (never / "pid.json").exists() and "declared lost; not starting it" in pane_text(tmux, "never")
