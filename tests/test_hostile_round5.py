"""A fresh hostile pass over the surfaces round five fixed: what a worker prints, YAML values that
are not plain data, and `Sweep` arguments no repr or float() can show. Each case is one line of
error (or a line skipped), never a traceback. Pure: no daemon, tmux or database."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.api import arguments
from orchestrator.api.daemon_process import resolve_backend
from orchestrator.attempts.printed_metrics import StdoutProgress, parse_dict
from orchestrator.attempts.printed_results import parse_result
from orchestrator.errors import DaemonError, PlanError, UsageError
from orchestrator.executors.provenance import interpreter_versions
from orchestrator.plans.grid import given_grid, given_sets, parse_sets
from orchestrator.plans.inputs import parse_scalar, shown_repr
from orchestrator.plans.model import ConfigSpec
from orchestrator.plans.suite import load_suite
from orchestrator.submit.core import check_priority
from orchestrator.yaml_limits import load_yaml, read_yaml_file

# 2000 brackets fit the 4096 characters a printed dict may have, and pass json's recursion limit
DEEP_JSON_LINE = '{"loss": ' + "[" * 2000 + "]" * 2000 + "}"


def test_a_deeply_nested_json_line_a_worker_prints_is_no_metrics_line_not_an_error() -> None:
    # it raised RecursionError in the daemon's pass: a healthy job failed all its attempts
    assert parse_dict(DEEP_JSON_LINE) is None
    assert parse_result(f"{{'eval_accuracy': 0.5}}\n{DEEP_JSON_LINE}\n") == {"eval_accuracy": 0.5}
    parser = StdoutProgress()
    parser.feed(f'{{"step": 3, "loss": 0.5}}\n{DEEP_JSON_LINE}\n{{"step": 4, "loss": 0.25}}\n')
    snapshot = parser.snapshot()
    assert snapshot is not None and snapshot["step"] == 4


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("x: !!float abc", "a value cannot be read"),
        ("x: !!int abc", "a value cannot be read"),
        ("x: !!timestamp abc", "a value cannot be read"),
        ("x: " + "9" * 5000, "a value cannot be read"),
        ("x: " + ":".join(["59"] * 3000), "x: a whole number beyond 64 bits"),
        ("mem_gib: " + "9" * 400, "mem_gib: a whole number beyond 64 bits"),
        ("when: 2020-01-01", "when: a date value (quote it"),
        ("grid: {name: [2020-01-01]}", "grid.name[0]: a date value"),
        ("s: !!set {a, b}", "s: a set value"),
        ("b: !!binary QUFB", "b: a bytes value"),
        ("x: !!omap [a: 1, a: 2]", "x[0]: a tuple value"),
        ("r: &a [*a]", "r[0]: an alias that holds itself"),
        ("? 2020-01-01\n: 1", "a key: a date value"),
    ],
    ids=lambda case: case[:24],
)
def test_yaml_values_that_are_not_plain_data_are_one_line_refusals(text: str, said: str) -> None:
    # before: ValueError/AttributeError tracebacks, or TypeError/ValueError from json.dumps later
    with pytest.raises(PlanError) as raised:
        load_yaml(text, "config file c.yaml")
    message = str(raised.value)
    assert message.startswith("config file c.yaml: ") and said in message and "\n" not in message


def test_plain_yaml_with_shared_aliases_still_loads() -> None:
    loaded = load_yaml(
        "base: &b {lr: 0.1, mods: [q, v]}\nx: *b\ny: *b\nn: 9223372036854775807\n", "suite s"
    )
    assert (
        loaded["x"] == loaded["y"] == {"lr": 0.1, "mods": ["q", "v"]} and loaded["n"] == 2**63 - 1
    )


class _NoRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr fails")


def _nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels):
        value = [value]
    return value


def test_shown_repr_never_raises() -> None:
    assert shown_repr(10**5000) == "a whole number of 16610 bits"
    assert shown_repr(_NoRepr()) == "a _NoRepr value"
    assert shown_repr(_nested(100_000)) == "a list value"
    assert shown_repr([10**5000]) == "a list value"
    assert shown_repr(-(2**63)) == str(-(2**63))


CONFIGS = [
    ConfigSpec("small", Path("small.yaml"), {"batch_size": 8, "learning_rate": 0.1, "name": "x"})
]
KNOWN = {"batch_size", "learning_rate", "name"}


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: check_priority(10**5000), id="priority_huge_int"),
        pytest.param(lambda: arguments.seeds_text([10**5000]), id="seed_huge_int"),
        pytest.param(lambda: arguments.job_ids("jobs", [10**5000]), id="job_id_huge_int"),
        pytest.param(lambda: arguments.job_ids("jobs", [_NoRepr()]), id="job_id_no_repr"),
        pytest.param(
            lambda: given_grid("grid", {"batch_size": [10**5000]}, KNOWN, CONFIGS),
            id="grid_huge_int",
        ),
        pytest.param(
            lambda: given_sets("sets", {"batch_size": 10**5000}, KNOWN, CONFIGS), id="set_huge_int"
        ),
        pytest.param(
            lambda: given_sets("sets", {10**5000: 1}, KNOWN, CONFIGS), id="set_key_huge_int"
        ),
        pytest.param(
            lambda: given_sets("sets", {"batch_size": _NoRepr()}, KNOWN, CONFIGS), id="set_no_repr"
        ),
        pytest.param(
            lambda: given_grid("grid", {"batch_size": _NoRepr()}, KNOWN, CONFIGS),
            id="grid_list_no_repr",
        ),
        pytest.param(
            lambda: given_grid("grid", {_NoRepr(): [1]}, KNOWN, CONFIGS), id="grid_key_no_repr"
        ),
        pytest.param(
            lambda: given_grid("grid", {"batch_size": _nested(100_000)}, KNOWN, CONFIGS),
            id="grid_deep_list",
        ),
        pytest.param(lambda: arguments.number("poll_s", 10**400, positive=True), id="poll_10e400"),
        pytest.param(
            lambda: arguments.number("poll_s", float("inf"), positive=True), id="poll_inf"
        ),
        pytest.param(
            lambda: arguments.number("timeout_s", -float("inf"), optional=True),
            id="timeout_minus_inf",
        ),
    ],
)
def test_python_arguments_no_repr_or_float_can_show_are_one_line_usage_errors(call: object) -> None:
    # before: ValueError (int digits), RuntimeError, RecursionError or OverflowError escaped
    with pytest.raises(UsageError) as raised:
        call()  # type: ignore[operator]
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 200


def test_a_grid_of_millions_of_values_is_refused_before_one_is_read() -> None:
    values = [float(i) for i in range(3_000_000)]
    started_s = time.perf_counter()
    with pytest.raises(PlanError, match="3000000 values, at most 1000"):
        given_grid("grid", {"learning_rate": values}, KNOWN, CONFIGS)
    print(f"refused in {time.perf_counter() - started_s:.3f} s")  # 11.7 s before: each typed first
    iterated: list[bool] = []

    class Watched(list):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            iterated.append(True)
            return super().__iter__()

    with pytest.raises(PlanError, match="1001 values"):
        given_grid(
            "grid", {"learning_rate": Watched(float(i) for i in range(1001))}, KNOWN, CONFIGS
        )
    assert iterated == []  # no value read before the count was refused
    assert (
        json.dumps(given_grid("grid", {"learning_rate": [0.1, 0.2]}, KNOWN, CONFIGS))
        == '{"learning_rate": [0.1, 0.2]}'
    )


def _read_in_thread(path: Path) -> tuple[bool, list[BaseException]]:
    """read_yaml_file(path) in a thread: (did it end within 10 s, what it raised). A reader
    still blocked is released by opening the FIFO's other end, so the test fails, never hangs."""
    raised: list[BaseException] = []

    def read() -> None:
        try:
            read_yaml_file(path, "config file")
        except BaseException as exc:  # handed to the test to judge
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    ended = not reader.is_alive()
    if not ended:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    return ended, raised


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_config_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    # a FIFO held `orch submit` (and `orch retry`, a web retry) forever
    path = tmp_path / "small.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    ended, raised = _read_in_thread(path)
    assert ended, "reading the config blocked"
    assert len(raised) == 1 and isinstance(raised[0], PlanError)
    assert str(raised[0]) == f"config file {path} is not a regular file"


def _suite_with(tmp_path: Path, extra: str) -> Path:
    plans = tmp_path / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "suites" / "s.yaml").write_text(
        f"worker: sim\nmem_gib: 1\nconfigs: {{c: {{batch_size: 8}}}}\n{extra}"
    )
    return plans


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "ORCH_GPU_UUID", "ORCH_GPU_INDEX"])
def test_a_suite_cannot_set_the_variables_that_place_an_attempt_on_its_gpus(
    tmp_path: Path, name: str
) -> None:
    # `--set env.CUDA_VISIBLE_DEVICES=...` reached the worker over the card it was placed on:
    # the job ran on cards given to other jobs
    said = f"{name} is set by orch to the GPUs each attempt is placed on"
    with pytest.raises(PlanError, match=said):
        load_suite("s", _suite_with(tmp_path, f"env: {{{name}: '0,1'}}\n"))
    with pytest.raises(PlanError, match=said):
        parse_sets([f"env.{name}=0,1"], KNOWN, CONFIGS)
    with pytest.raises(PlanError, match=said):
        given_sets("sets", {f"env.{name}": "0"}, KNOWN, CONFIGS)
    with pytest.raises(PlanError, match=said):
        given_grid("grid", {f"env.{name}": ["0", "1"]}, KNOWN, CONFIGS)
    assert parse_sets(["env.MY_FLAG=1"], KNOWN, CONFIGS) == {"env.MY_FLAG": "1"}


@pytest.mark.parametrize("raw", ["!!float abc", "!!int abc", "!!timestamp x", "!!int 0x"])
def test_a_set_value_whose_yaml_tag_cannot_read_it_is_one_line(raw: str) -> None:
    # `--set KEY='!!float abc'` on a key only the worker command names: ValueError traceback
    with pytest.raises(PlanError, match="not a YAML scalar"):
        parse_scalar("k", raw)


def test_a_python_number_for_a_text_key_asks_for_the_job_the_same_flag_asks_for() -> None:
    # `orch submit --set name=1` then `Sweep.submit(sets={"name": 1})` queued a second job
    # (name: 1 beside name: '1'): one setting, run twice
    for value, flag in ((1, "name=1"), (True, "name=true"), (0.5, "name=0.5")):
        assert given_sets("sets", {"name": value}, KNOWN, CONFIGS) == parse_sets(
            [flag], KNOWN, CONFIGS
        )
    assert given_grid("grid", {"name": [1, True]}, KNOWN, CONFIGS) == {"name": ["1", "true"]}
    flags = [ConfigSpec("f", Path("f.yaml"), {"flag": True})]
    with pytest.raises(PlanError, match="flag is true or false in the config"):
        parse_sets(["flag=1"], {"flag"}, flags)
    with pytest.raises(PlanError, match="flag is true or false in the config"):
        given_sets("sets", {"flag": 1}, {"flag"}, flags)


def test_reading_the_worker_interpreters_versions_runs_no_module_of_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python -c` puts the working folder first on sys.path: the probe imported a json.py (or
    # importlib/) lying there, on every attempt, code the worker itself may never import
    touched = tmp_path / "touched"
    (tmp_path / "json.py").write_text(f"open({str(touched)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    versions = interpreter_versions(sys.executable)
    assert not touched.exists()
    assert versions.get("python") == sys.version.split()[0], versions


def test_a_simulated_gpus_folder_that_cannot_be_made_is_one_line_at_daemon_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `orch daemon start` beside a state.db on a read-only filesystem: a 38-line OSError
    in_the_way = tmp_path / "state.db.sim"
    in_the_way.write_text("")  # a file where the folder goes: mkdir fails as on EROFS
    monkeypatch.setenv("ORCH_SIM_DIR", str(in_the_way))
    with pytest.raises(
        DaemonError, match=r"cannot make the simulated GPUs' folder .*state\.db\.sim"
    ):
        resolve_backend(tmp_path / "state.db", "sim")


@pytest.mark.parametrize("text", ["a\x00b", "\x01\x02", "lr: 1\nname: a\x07b\n"], ids=["nul", "soh-stx", "bell"])
def test_a_control_character_is_a_one_line_refusal(text: str) -> None:
    # before: PyYAML's reader raised as the loader was built, outside the refusals (a traceback)
    with pytest.raises(PlanError) as raised:
        load_yaml(text, "suite file s.yaml")
    message = str(raised.value)
    assert message.startswith("suite file s.yaml is not valid YAML: unacceptable character #x00")
    assert "\n" not in message
