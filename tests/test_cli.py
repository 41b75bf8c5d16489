"""Every `orch` command through its entry point on a temp database: exit codes, --json shapes,
and what each writes (or must not write)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from orchestrator.cli import _register, cli
from orchestrator.store import Store
from tests.conftest import OrchRunner

REPO_ROOT = Path(__file__).resolve().parent.parent
PAIRS = "87:glue-tvt_qnli 127:glue-tvt_rte"


def submit_demo(orch_inproc: OrchRunner, *extra: str) -> dict:
    result = orch_inproc("submit", "--suite", "demo", "--pairs", PAIRS, "--json", *extra)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("orch: error: ")
    assert "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------- submit


def test_submit_json_shape_and_resubmit(orch_inproc: OrchRunner, db_path: Path) -> None:
    payload = submit_demo(orch_inproc, "--gpus", "0 1", "--gpu-plan", "2,1")
    assert {"suite", "dry_run", "created", "existing", "jobs"} <= set(payload)
    assert payload["suite"] == "demo" and payload["dry_run"] is False
    assert payload["created"] == 6 and payload["existing"] == 0
    job = payload["jobs"][0]
    assert {"id", "identity", "config", "seed", "data", "created", "state"} <= set(job)
    assert [j["id"] for j in payload["jobs"]] == [1, 2, 3, 4, 5, 6]
    assert [(j["config"], j["seed"]) for j in payload["jobs"][:2]] == [("demo_large", 87), ("demo_large", 127)]
    assert all(j["state"] == "queued" and j["created"] for j in payload["jobs"])
    assert db_path.exists()

    again = submit_demo(orch_inproc)
    assert again["created"] == 0 and again["existing"] == 6
    assert [j["id"] for j in again["jobs"]] == [1, 2, 3, 4, 5, 6]
    text = orch_inproc("submit", "--suite", "demo", "--pairs", PAIRS)
    assert text.rc == 0 and "queued 0 job(s)" in text.stdout and "6 already present (queued" in text.stdout


def test_submit_force_duplicates(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    assert submit_demo(orch_inproc, "--force")["created"] == 6
    jobs = json.loads(orch_inproc("jobs", "--json").stdout)
    assert len(jobs) == 12


def test_dry_run_creates_no_database(orch_inproc: OrchRunner, db_path: Path) -> None:
    payload = submit_demo(orch_inproc, "--dry-run", "--gpu-plan", "2")
    assert payload["dry_run"] is True and payload["created"] == 6
    assert all(j["id"] is None and j["state"] == "would be queued" for j in payload["jobs"])
    assert not db_path.exists()


def test_dry_run_on_an_existing_db_changes_nothing(orch_inproc: OrchRunner, db_path: Path) -> None:
    submit_demo(orch_inproc, "--pairs", "1:other")  # later --pairs wins in click: 3 jobs of 1:other
    before = db_path.read_bytes()
    payload = submit_demo(orch_inproc, "--dry-run", "--gpu-plan", "3")
    assert payload["created"] == 6
    assert db_path.read_bytes() == before
    assert json.loads(orch_inproc("plan", "show", "--json").stdout)["gpus"] == {}


def test_submit_round_uses_the_given_plan(orch_inproc: OrchRunner) -> None:
    payload = json.loads(
        orch_inproc(
            "submit", "--suite", "E1", "--pairs", PAIRS, "--gpus", "0 1 2 3 4 5 6",
            "--gpu-plan", "2,2,2,2,1,1,1", "--round", "2", "--json",
        ).stdout
    )
    assert payload["created"] == 11
    # Jobs 12..22 of 88 (1-based): the 12th is the 6th config at the second pair.
    assert payload["jobs"][0]["config"] == "E1_QKVO_r10_alpha20"
    assert payload["jobs"][0]["seed"] == 127


def test_submit_bad_input_is_one_line_exit_2(orch_inproc: OrchRunner, db_path: Path) -> None:
    result = orch_inproc("submit", "--suite", "demo", "--pairs", "87")
    assert result.rc == 2
    assert "not SEED:DATA" in one_error_line(result.stderr)
    assert not db_path.exists()


def test_submit_refuses_a_config_key_that_is_not_a_string(orch_inproc: OrchRunner, db_path: Path,
                                                           tmp_path: Path) -> None:
    (tmp_path / "p" / "suites").mkdir(parents=True)
    (tmp_path / "p" / "configs" / "w").mkdir(parents=True)
    (tmp_path / "p" / "suites" / "w.yaml").write_text("worker: sim\nmem_gib: 1\nconfigs: [c]\n")
    (tmp_path / "p" / "configs" / "w" / "c.yaml").write_text("sim_mem_gib: 1\nclass_weights: {0: 1.0, 1: 2.5}\n")
    result = orch_inproc("submit", "--plans", str(tmp_path / "p"), "--suite", "w", "--seeds", "1")
    assert result.rc == 2
    assert one_error_line(result.stderr).endswith(
        "c.yaml: class_weights has a key 0 that is not a string: quote it ('0') or use a list")
    assert not db_path.exists()


# ---------------------------------------------------------------- reading


def test_jobs_filters(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    assert orch_inproc("cancel", "2", "--json").rc == 0
    every = json.loads(orch_inproc("jobs", "--json").stdout)
    assert [j["id"] for j in every] == [1, 2, 3, 4, 5, 6]
    assert {"id", "state", "suite", "config", "seed", "data", "gpu", "attempt", "level"} <= set(every[0])
    cancelled = json.loads(orch_inproc("jobs", "--state", "cancelled", "--json").stdout)
    assert [j["id"] for j in cancelled] == [2]
    assert json.loads(orch_inproc("jobs", "--suite", "E1", "--json").stdout) == []
    assert len(json.loads(orch_inproc("jobs", "--suite", "demo", "--json").stdout)) == 6
    table = orch_inproc("jobs")
    assert table.rc == 0 and "demo_large" in table.stdout


def test_show_json(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    payload = json.loads(orch_inproc("show", "1", "--json").stdout)
    assert payload["id"] == 1 and payload["state"] == "queued"
    assert payload["attempts"] == []
    assert [e["kind"] for e in payload["events"]] == ["submitted"]
    assert payload["events"][0]["to"] == "queued"
    assert payload["config_content"]["seed"] == 87 and payload["config_content"]["data"] == "glue-tvt_qnli"
    text = orch_inproc("show", "1")
    assert text.rc == 0 and "history" in text.stdout
    missing = orch_inproc("show", "99")
    assert missing.rc == 2 and "no job 99" in one_error_line(missing.stderr)


def test_logs_without_attempt(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    result = orch_inproc("logs", "1")
    assert result.rc == 2
    assert "has not started yet" in one_error_line(result.stderr)


def test_status_json_on_empty_db(orch_inproc: OrchRunner, db_path: Path) -> None:
    Store(db_path).close()
    result = orch_inproc("status", "--json")
    assert result.rc == 0
    payload = json.loads(result.stdout)
    assert {"daemon", "gpus", "counts", "jobs"} <= set(payload)
    assert payload["daemon"]["alive"] is False
    assert payload["counts"] == {"queued": 0, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0,
                                 "pruned": 0}
    assert payload["jobs"] == [] and payload["gpus"] == []


def test_status_once_lists_queued(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    payload = json.loads(orch_inproc("status", "--json").stdout)
    assert payload["counts"]["queued"] == 6
    assert orch_inproc("status", "--once").rc == 0


def test_daemon_status_when_none_runs(orch_inproc: OrchRunner, db_path: Path) -> None:
    Store(db_path).close()
    result = orch_inproc("daemon", "status", "--json")
    assert result.rc == 0
    assert json.loads(result.stdout)["alive"] is False
    text = orch_inproc("daemon", "status")
    assert text.rc == 3 and "not running" in text.stdout and not text.stderr


# ---------------------------------------------------------------- plan


def test_plan_set_and_show(orch_inproc: OrchRunner, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    monkeypatch.setenv("ORCH_SIM_GPUS", "6x24GiB")  # GPUs 3, 4 and 5 exist
    Store(db_path).close()
    shown = json.loads(orch_inproc("plan", "show", "--json").stdout)
    assert shown == {"gpus": {}, "default_slots": 1}
    stored = json.loads(orch_inproc("plan", "set", "2,0,1", "--gpus", "3 4 5", "--json").stdout)
    assert stored == {"gpus": {"3": 2, "4": 0, "5": 1}, "default_slots": None}
    assert json.loads(orch_inproc("plan", "show", "--json").stdout)["gpus"] == {"3": 2, "4": 0, "5": 1}
    broadcast = json.loads(orch_inproc("plan", "set", "2", "--json").stdout)
    assert broadcast == {"gpus": {}, "default_slots": 2}
    bad = orch_inproc("plan", "set", "2,2", "--gpus", "0")
    assert bad.rc == 2 and "2 entries" in one_error_line(bad.stderr)


# ---------------------------------------------------------------- changing jobs


def test_cancel_and_retry(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    assert json.loads(orch_inproc("cancel", "1", "--json").stdout) == {
        "cancelled": [1],
        "stopping": [],
        "finished": [],
        "skipped": [],
    }
    again = json.loads(orch_inproc("cancel", "1", "--json").stdout)
    assert again["cancelled"] == [] and again["skipped"] == [{"id": 1, "state": "cancelled"}]
    assert json.loads(orch_inproc("retry", "1", "--json").stdout) == {"requeued": [1], "restarting": []}
    payload = json.loads(orch_inproc("show", "1", "--json").stdout)
    assert payload["state"] == "queued"
    assert [e["kind"] for e in payload["events"]] == ["submitted", "cancel", "retry"]
    not_retriable = orch_inproc("retry", "1")
    assert not_retriable.rc == 2 and "only failed, cancelled, pruned or running" in one_error_line(not_retriable.stderr)


def test_cancel_suite_and_all(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    orch_inproc("submit", "--suite", "E1", "--pairs", "87:glue_rte")
    by_suite = json.loads(orch_inproc("cancel", "--suite", "demo", "--json").stdout)
    assert by_suite["cancelled"] == [1, 2, 3, 4, 5, 6]
    everything = json.loads(orch_inproc("cancel", "--all", "--json").stdout)
    assert everything["cancelled"] == list(range(7, 51))
    counts = json.loads(orch_inproc("status", "--json").stdout)["counts"]
    assert counts["cancelled"] == 50 and counts["queued"] == 0
    requeued = json.loads(orch_inproc("retry", "--suite", "demo", "--json").stdout)["requeued"]
    assert requeued == [1, 2, 3, 4, 5, 6]
    neither = orch_inproc("cancel")
    assert neither.rc == 2 and "exactly one" in one_error_line(neither.stderr)


def test_submit_config_queues_only_that_config_and_refuses_one_the_suite_lacks(
    orch_inproc: OrchRunner, db_path: Path
) -> None:
    payload = submit_demo(orch_inproc, "--config", "demo_large")
    assert payload["created"] == 2 and {j["config"] for j in payload["jobs"]} == {"demo_large"}
    missing = orch_inproc("submit", "--suite", "demo", "--pairs", PAIRS, "--config", "demo_hug")
    assert missing.rc == 2
    assert "suite demo has no config 'demo_hug' (its configs: demo_large," in one_error_line(missing.stderr)
    assert len(json.loads(orch_inproc("jobs", "--json").stdout)) == 2  # nothing written


def test_a_succeeded_jobs_retry_names_the_command_that_runs_it_alone_again(
    orch_inproc: OrchRunner, db_path: Path
) -> None:
    from orchestrator.actions.user_actions import _succeeded_already
    from orchestrator.store.queries import get_job

    submit_demo(orch_inproc)
    with Store(db_path) as store:
        said = _succeeded_already(get_job(store, 1), "job 1 succeeded")
    command = said.split("`")[1]
    assert command == "orch submit --suite demo --config demo_large --pairs 87:glue-tvt_qnli --force"
    again = orch_inproc(*command.split()[1:], "--json")  # run as suggested: that job alone, queued again
    assert again.rc == 0, again.stderr
    assert [(j["config"], j["seed"], j["data"]) for j in json.loads(again.stdout)["jobs"]] == [
        ("demo_large", 87, "glue-tvt_qnli")]


def test_resubmit_after_cancel_queues_a_new_job(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    orch_inproc("cancel", "1")
    again = submit_demo(orch_inproc)
    assert again["created"] == 1 and again["existing"] == 5
    assert [j["id"] for j in again["jobs"] if j["created"]] == [7]


def test_commands_that_read_refuse_a_missing_db(orch_inproc: OrchRunner, db_path: Path) -> None:
    for args in (("jobs",), ("show", "1"), ("cancel", "--all"), ("results",), ("status", "--once"),
                 ("status", "--json"), ("daemon", "status"), ("plan", "show"), ("daemon", "stop")):
        result = orch_inproc(*args)
        assert result.rc == 2, args
        assert "no state database" in one_error_line(result.stderr)
    assert not db_path.exists()


def test_corrupt_db_is_one_line(orch_inproc: OrchRunner, db_path: Path) -> None:
    db_path.write_bytes(b"\x00garbage" * 1000)
    result = orch_inproc("jobs")
    assert result.rc == 1
    assert "corrupt" in one_error_line(result.stderr)


def test_locked_db_is_one_line(orch_inproc: OrchRunner, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    import orchestrator.store.db as store_db

    submit_demo(orch_inproc)
    monkeypatch.setattr(store_db, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(str(db_path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = orch_inproc("cancel", "1")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.rc == 1
    assert "locked" in one_error_line(result.stderr)
    assert json.loads(orch_inproc("show", "1", "--json").stdout)["state"] == "queued"


# ---------------------------------------------------------------- help and README


def _all_command_paths() -> list[list[str]]:
    _register()
    paths: list[list[str]] = []

    def walk(group: click.Group, prefix: list[str]) -> None:
        for name, command in sorted(group.commands.items()):
            paths.append([*prefix, name])
            if isinstance(command, click.Group):
                walk(command, [*prefix, name])

    walk(cli, [])
    return paths


def test_every_command_has_help(orch_inproc: OrchRunner) -> None:
    assert orch_inproc("--version").stdout.startswith("orch, version")
    paths = _all_command_paths()
    expected = {"submit", "jobs", "show", "logs", "plan", "cancel", "retry", "status", "daemon", "gpus", "results"}
    assert expected <= {p[0] for p in paths}
    top = orch_inproc("--help")
    assert top.rc == 0 and "submit" in top.stdout
    for path in paths:
        result = orch_inproc(*path, "--help")
        assert result.rc == 0, path
        assert result.stdout.startswith("Usage: orch " + " ".join(path)), path


# ---------------------------------------------------------------- the real console entry point
# Each interpreter start costs about a second on a busy 2-core machine, so the subprocess runs
# cover a representative set; every command also runs through the same `main()` in-process above.


@pytest.mark.parametrize(
    ("args", "rc", "needle"),
    [
        (("--help",), 0, "Usage: orch"),
        (("show", "1", "--json"), 0, '"attempts": []'),
        (("logs", "1"), 2, "has not started yet"),
        (("plan", "set", "2,1", "--json"), 0, '"0": 2'),
        (("cancel", "1", "--json"), 0, '"cancelled": [\n    1\n  ]'),
        (("daemon", "status", "--json"), 0, '"alive": false'),
        (("status", "--json"), 0, '"queued": 6'),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else None,
)
def test_console_entry_point(
    orch_cli: OrchRunner, orch_inproc: OrchRunner, args: tuple[str, ...], rc: int, needle: str
) -> None:
    submit_demo(orch_inproc)
    result = orch_cli(*args)
    assert result.rc == rc, result.stderr
    if rc == 0:
        assert needle in result.stdout
    else:
        assert needle in one_error_line(result.stderr)


def test_console_submit(orch_cli: OrchRunner, db_path: Path) -> None:
    result = orch_cli("submit", "--suite", "demo", "--pairs", PAIRS, "--json")
    assert result.rc == 0, result.stderr
    assert json.loads(result.stdout)["created"] == 6
    assert db_path.exists()


def test_other_commands_in_process(orch_inproc: OrchRunner) -> None:
    submit_demo(orch_inproc)
    queued = json.loads(orch_inproc("results", "--json").stdout)  # every submitted seed has its row
    assert queued and all(r["n"] == 0 and r["unfinished"] and r["mean"] is None for r in queued)
    assert {st["status"] for r in queued for st in r["seed_states"]} == {"queued"}
    for args, needle in ((("resume", "demo"), "is not paused"), (("attach", "1"), "has no tmux window")):
        result = orch_inproc(*args)
        assert result.rc == 2 and needle in one_error_line(result.stderr), args


def test_attach_to_a_job_whose_attempt_ended_points_to_its_logs(orch_inproc: OrchRunner, db_path: Path) -> None:
    submit_demo(orch_inproc)
    with Store(db_path) as store, store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, ended_at, "
            "outcome, executor, executor_id, predicted_peak_mib, prediction_source, reserved_mib) "
            "VALUES (1, 1, 0, 'as configured', 0, 'GPU-0', '/nonexistent', 1.0, 2.0, 'oom', "
            "'tmux', '@3', 100, 'declared', 0)"
        )
    result = orch_inproc("attach", "1")
    assert result.rc == 2 and result.stdout == ""
    assert (
        one_error_line(result.stderr)
        == "orch: error: job 1's attempt 1 has ended (oom): its output is in `orch logs 1`"
    )


def test_attach_without_a_terminal_says_so_in_one_line(
    orch_inproc: OrchRunner, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tmux said only `open terminal failed: not a terminal`, outside orch's errors
    monkeypatch.setattr("os.isatty", lambda fd: False)  # never a terminal, whoever runs the tests
    submit_demo(orch_inproc)
    with Store(db_path) as store, store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, "
            "executor, executor_id, predicted_peak_mib, prediction_source, reserved_mib) "
            "VALUES (1, 1, 0, 'as configured', 0, 'GPU-0', '/nonexistent', 1.0, 'tmux', '@3', 100, 'declared', 0)"
        )
    result = orch_inproc("attach", "1")
    line = one_error_line(result.stderr)
    assert result.rc == 2 and result.stdout == ""
    assert line.startswith("orch: error: orch attach needs a terminal, and its input is not one: `orch logs 1 -f`")
    assert "from a terminal: tmux -L " in line and "@3" in line


def test_a_read_command_imports_only_what_it_runs(tmp_path: Path) -> None:
    """Each command's module is imported when it runs: `orch jobs` loads neither the other
    commands nor the submit path and user actions (their imports cost every call ~0.3 s)."""
    import subprocess
    import sys

    probe = ("import sys; from orchestrator.cli import main; main(['jobs', '--db', sys.argv[1]]); "
             "print(sorted(m for m in sys.modules if m.startswith(('orchestrator.cli.', 'orchestrator.actions', "
             "'orchestrator.submit', 'orchestrator.api.sweep'))))")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "none.db")], capture_output=True, text=True,
                         check=False).stdout
    loaded = json.loads(out.strip().splitlines()[-1].replace("'", '"'))
    assert "orchestrator.cli.jobs.command" in loaded
    assert not [
        m
        for m in loaded
        if m.startswith(
            (
                "orchestrator.actions",
                "orchestrator.submit",
                "orchestrator.api.s",
                "orchestrator.cli.demo",
                "orchestrator.cli.web_cmd",
                "orchestrator.cli.results",
            )
        )
    ], loaded
