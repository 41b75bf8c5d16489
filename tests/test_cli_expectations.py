"""What a researcher expects of each command: reads never create, bare groups print help,
input that cannot work is refused at submit, messages in people's words."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest
import yaml

from orchestrator.cli import _register, cli
from orchestrator.store import Store
from tests.conftest import OrchRunner
from tests.test_hostile_input import tree

SUBMIT = ("submit", "--suite", "demo", "--pairs", "87:glue_rte")


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("orch: error: ") and "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------- reads never create


@pytest.mark.parametrize(
    "args",
    [("status", "--once"), ("status", "--json"), ("daemon", "status"), ("daemon", "status", "--json"),
     ("plan", "show"), ("jobs",), ("results",), ("memory",), ("memory", "--json"),
     ("report", "--out", "sweep.html")],
    ids=" ".join,
)
def test_a_read_command_creates_nothing(orch_inproc: OrchRunner, tmp_path: Path, args: tuple[str, ...]) -> None:
    missing = tmp_path / "nonexistent" / "dir" / "state.db"
    result = orch_inproc(*args, "--db", str(missing))
    assert result.rc == 2
    assert f"no state database at {missing}" in one_error_line(result.stderr)
    assert not (tmp_path / "nonexistent").exists()
    # and in an empty folder, with the default ./state.db
    before = tree(tmp_path)
    result = orch_inproc(*args, "--db", "state.db")
    assert result.rc == 2 and "no state database at state.db" in one_error_line(result.stderr)
    assert tree(tmp_path) == before


def test_status_names_the_database_when_no_daemon_runs(orch_inproc: OrchRunner, db_path: Path) -> None:
    assert orch_inproc(*SUBMIT).rc == 0
    frame = orch_inproc("status", "--once")
    assert frame.rc == 0
    assert f"daemon not running for {db_path}" in " ".join(frame.stdout.split())
    assert f"not running for {db_path}" in orch_inproc("daemon", "status").stdout


def test_daemon_stop_without_a_daemon_succeeds(orch_inproc: OrchRunner, db_path: Path) -> None:
    Store(db_path).close()
    result = orch_inproc("daemon", "stop")
    assert result.rc == 0, result.stderr
    assert "no daemon is running" in result.stdout


# ---------------------------------------------------------------- bare groups print help


@pytest.mark.parametrize("args", [(), ("daemon",), ("plan",)], ids=lambda a: "orch " + " ".join(a))
def test_a_bare_group_prints_its_help(orch_inproc: OrchRunner, args: tuple[str, ...]) -> None:
    result = orch_inproc(*args)
    assert result.rc == 0
    assert result.stderr == ""
    assert result.stdout == orch_inproc(*args, "--help").stdout
    assert result.stdout.startswith("Usage: orch") and "Commands:" in result.stdout
    assert len(result.stdout.splitlines()) > 5


def test_every_option_has_help_text() -> None:
    _register()
    missing: list[str] = []

    def walk(group: click.Group, prefix: str) -> None:
        for name, command in sorted(group.commands.items()):
            path = f"{prefix} {name}".strip()
            if not command.help:
                missing.append(path)
            missing.extend(f"{path} {p.opts[0]}" for p in command.params
                           if isinstance(p, click.Option) and not p.help)
            if isinstance(command, click.Group):
                walk(command, path)

    walk(cli, "")
    assert missing == []


# ---------------------------------------------------------------- refused at submit


def _bad_ladder_plans(root: Path) -> Path:
    (root / "suites").mkdir(parents=True)
    (root / "configs" / "laddered").mkdir(parents=True)
    (root / "configs" / "laddered" / "a.yaml").write_text(yaml.safe_dump({"batch_size": 4}))
    suite = {"worker": "sim", "mem_gib": 1, "configs": ["a"], "ladder": ["checkpointing", {"halve_bach": True}]}
    (root / "suites" / "laddered.yaml").write_text(yaml.safe_dump(suite))
    return root


@pytest.mark.parametrize(
    ("extra", "env", "needle"),
    [
        (("--gpu-plan", "0,0"), {}, "0 slots"),
        (("--gpu-plan", "0"), {}, "0 slots"),
        (("--gpus", "0 1", "--gpu-plan", "0"), {}, "0 slots"),
        (("--gpu-plan", "2,,1"), {}, "empty entry"),
        (("--gpu-plan", "2,1,"), {}, "empty entry"),
        (
            ("--gpus", "0 5"),
            {"ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "2x24GiB"},
            "GPU 5, which this machine does not have",
        ),
        (("--plans", "<bad-ladder>"), {}, "unknown action 'halve_bach'"),
    ],
    ids=[
        "plan-all-zero",
        "plan-single-zero",
        "plan-zero-on-gpus",
        "plan-empty-entry",
        "plan-trailing-comma",
        "gpus-missing",
        "ladder-bad-rung",
    ],
)
def test_input_that_cannot_work_is_refused_at_submit(
    orch_inproc: OrchRunner,
    tmp_path: Path,
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: tuple[str, ...],
    env: dict[str, str],
    needle: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plans = _bad_ladder_plans(tmp_path / "plans-bad-ladder")
    args = [str(plans) if a == "<bad-ladder>" else a for a in extra]
    suite = ("--suite", "laddered") if "<bad-ladder>" in extra else ("--suite", "demo")
    before = tree(tmp_path)
    result = orch_inproc("submit", *suite, "--pairs", "87:glue_rte", *args)
    assert result.rc == 2
    assert needle in one_error_line(result.stderr)
    assert tree(tmp_path) == before and not db_path.exists()


def test_gpus_checked_against_the_daemons_last_reading(orch_inproc: OrchRunner, db_path: Path) -> None:
    assert orch_inproc(*SUBMIT).rc == 0
    with Store(db_path) as store, store.write():
        gpus = [{"index": i, "uuid": f"GPU-{i}"} for i in range(3)]
        store.execute("INSERT OR REPLACE INTO daemon (id, gpus_json) VALUES (1, ?)", [json.dumps(gpus)])
    before = db_path.read_bytes()
    refused = orch_inproc("submit", "--suite", "demo", "--pairs", "1:glue_rte", "--gpus", "2 3")
    assert refused.rc == 2 and "GPU 3, which this machine does not have (its GPUs: 0 1 2)" in refused.stderr
    assert db_path.read_bytes() == before
    assert orch_inproc("submit", "--suite", "demo", "--pairs", "1:glue_rte", "--gpus", "2").rc == 0


def test_plan_set_speaks_of_its_own_argument(
    orch_inproc: OrchRunner, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    monkeypatch.setenv("ORCH_SIM_GPUS", "4x24GiB")  # GPU 3 exists
    Store(db_path).close()
    result = orch_inproc("plan", "set", "2,2", "--gpus", "0")
    assert result.rc == 2
    line = one_error_line(result.stderr)
    assert "--gpu-plan" not in line and "PLAN has 2 entries" in line
    # taking one GPU out of use is still possible
    assert orch_inproc("plan", "set", "0", "--gpus", "3").rc == 0


# ---------------------------------------------------------------- words for people


def test_plan_is_described_in_words(orch_inproc: OrchRunner, db_path: Path) -> None:
    Store(db_path).close()
    broadcast = orch_inproc("plan", "set", "2")
    assert broadcast.stdout.strip() == "GPU plan set: at most 2 job(s) at a time on every GPU"
    assert "others:" not in broadcast.stdout
    db_path.unlink()
    Store(db_path).close()
    named = orch_inproc("plan", "set", "2,1")
    assert named.stdout.strip() == "GPU plan set: GPU 0: 2, GPU 1: 1 job(s) at a time; any other GPU: 1"


def test_show_prints_overrides_and_changes_as_yaml_words(orch_inproc: OrchRunner, db_path: Path) -> None:
    result = orch_inproc(*SUBMIT, "--set", "sim_seconds=45", "--set", "gradient_checkpointing=true")
    assert result.rc == 0, result.stderr
    with Store(db_path) as store, store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, ended_at, "
            "outcome, changes_json, predicted_peak_mib, prediction_source, reserved_mib) "
            "VALUES (1, 1, 1, 'checkpointing', 0, 'GPU-0', '/nonexistent', 1.0, 2.0, 'oom', ?, 100, 'declared', 0)",
            [json.dumps({"gradient_checkpointing": True, "logits_to_keep": None})],
        )
    shown = orch_inproc("show", "1").stdout
    assert "--set " in shown and "sim_seconds=45" in shown and "gradient_checkpointing=true" in shown
    assert "changed gradient_checkpointing=true, logits_to_keep=null" in shown
    assert "{'" not in shown and "True" not in shown and "None" not in shown


@pytest.mark.parametrize("command", [("results",), ("cancel",), ("retry",)])
def test_a_suite_this_database_has_no_job_of_is_an_error(orch_inproc: OrchRunner, db_path: Path,
                                                         command: tuple[str, ...]) -> None:
    """Before, `orch cancel --suite Demo` said it cancelled 0 jobs, exit 0, while the sweep ran on."""
    assert orch_inproc(*SUBMIT).rc == 0
    queued = json.loads(orch_inproc("jobs", "--state", "queued", "--json").stdout)
    before = db_path.read_bytes()
    result = orch_inproc(*command, "--suite", "dmeo")
    assert result.rc == 2, result
    assert one_error_line(result.stderr).endswith(" (did you mean 'demo'?) (its suites: demo)"), result.stderr
    assert "unknown suite 'dmeo' in " in result.stderr
    assert db_path.read_bytes() == before
    assert json.loads(orch_inproc("jobs", "--state", "queued", "--json").stdout) == queued  # nothing cancelled


@pytest.mark.parametrize("command", [("jobs", "--json"), ("curves", "--format", "json")])
def test_a_listing_of_a_suite_with_no_job_here_is_empty_and_says_why(orch_inproc: OrchRunner,
                                                                     command: tuple[str, ...]) -> None:
    """A script may list a suite before it submits: the listing is empty (exit 0), and a note says
    which suites there are (a misspelt name is answered)."""
    assert orch_inproc(*SUBMIT).rc == 0
    result = orch_inproc(*command, "--suite", "dmeo")
    assert result.rc == 0 and json.loads(result.stdout) == [], result
    assert result.stderr.strip().endswith("(did you mean 'demo'?) (its suites: demo)"), result.stderr


def test_daemon_log_has_no_libtmux_chatter(tmp_path: Path) -> None:
    """The daemon's own log lines, not one per tmux window libtmux creates."""
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    from tests.e2e_helpers import orch_env

    with orch_env(tmp_path) as orch:
        orch.write_suite("quick", {"a": {"sim_mem_gib": 1, "sim_seconds": 0.2}})
        orch.submit("quick", "1:glue_rte 2:glue_rte 3:glue_rte")
        orch.start_daemon()
        orch.wait_all_done(60)
        orch.stop_daemon()
        log = (tmp_path / "state.db.daemon.log").read_text()
    assert "window created" not in log
    assert os.path.getsize(tmp_path / "state.db.daemon.log") > 0


def test_ladder_levels_are_described_in_yaml_words() -> None:
    from orchestrator.prediction.ladder import Level

    level = Level(1, "checkpointing", changes={"gradient_checkpointing": True, "logits_to_keep": None})
    assert level.describe() == "level 1 (checkpointing): gradient_checkpointing=true, logits_to_keep=null"
