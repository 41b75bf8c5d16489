"""Malformed and hostile input through the CLI: every case exits 2 with one `orch: error:` line,
leaves state.db byte-identical (or absent) and creates no file anywhere."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from orchestrator.plans import expand_jobs, load_suite, parse_gpu_plan, parse_pairs
from orchestrator.store import Store
from orchestrator.store.jobs import set_gpu_plan, submit_jobs
from tests.conftest import REPO_ROOT, OrchResult, OrchRunner

SUBMIT = ("submit", "--suite", "demo", "--pairs", "87:glue_rte")
BAD_PLANS = "<bad-plans>"  # stands for a --plans dir holding broken suites, filled in at run time


def submit_with(*extra: str) -> tuple[str, ...]:
    return (*SUBMIT, *extra)


def pairs(text: str) -> tuple[str, ...]:
    return ("submit", "--suite", "demo", "--pairs", text)


def bad_suite(name: str) -> tuple[str, ...]:
    return ("submit", "--suite", name, "--pairs", "87:glue_rte", "--plans", BAD_PLANS)


# (id, argv). Every one must fail with exit 2 and write nothing.
CASES: list[tuple[str, tuple[str, ...]]] = [
    # GPU plans and GPU lists
    ("plan-negative", submit_with("--gpu-plan", "-1")),
    ("plan-fraction", submit_with("--gpu-plan", "2.5")),
    ("plan-exponent", submit_with("--gpu-plan", "1e3")),
    ("plan-huge", submit_with("--gpu-plan", "99999999999999")),
    ("plan-fullwidth-digit", submit_with("--gpu-plan", "２")),
    ("plan-empty", submit_with("--gpu-plan", "")),
    ("plan-only-commas", submit_with("--gpu-plan", ",,")),
    ("plan-too-many-slots", submit_with("--gpu-plan", "65")),
    ("plan-length-mismatch", submit_with("--gpus", "0 1", "--gpu-plan", "2,2,1")),
    ("plan-shell", submit_with("--gpu-plan", "1;touch pwned")),
    ("gpus-duplicate", submit_with("--gpus", "0 0")),
    ("gpus-negative", submit_with("--gpus=-1")),
    ("gpus-huge", submit_with("--gpus", "99999999999999")),
    ("gpus-escape", submit_with("--gpus", "\x1b[31m0")),
    # pairs
    ("pair-semicolon", pairs("87:glue;rm -rf x")),
    ("pair-subshell", pairs("87:$(touch pwned)")),
    ("pair-backticks", pairs("87:`touch pwned`")),
    ("pair-pipe", pairs("87:glue|cat")),
    ("pair-and-and", pairs("87:glue && touch pwned")),
    ("pair-newline", pairs("87:glue_rte\n127:glue_rte")),
    ("pair-unicode-task", pairs("87:tâche")),
    ("pair-rtl-override", pairs("87:glue\u202erte")),
    ("pair-empty", pairs("")),
    ("pair-blank", pairs("   ")),
    ("pair-negative-seed", pairs("-1:glue_rte")),
    ("pair-huge-seed", pairs("99999999999999999999:glue_rte")),
    ("pair-no-colon", pairs("87")),
    ("pair-no-task", pairs("87:")),
    ("pair-duplicate", pairs("87:glue_rte,87:glue_rte")),
    ("pair-traversal", pairs("87:../../etc/passwd")),
    ("pair-escape", pairs("87:\x1b[31mred")),
    ("pair-very-long", pairs("87:" + "a" * 5000)),
    # rounds
    ("round-zero", submit_with("--round", "0")),
    ("round-negative", submit_with("--round=-1")),
    ("round-shell", submit_with("--round", "r;ls")),
    ("round-escape", submit_with("--round", "\x1b[31m")),
    ("round-empty", submit_with("--round", "")),
    # --set
    ("set-mapping", submit_with("--set", "sim_mem_gib=a: b")),
    ("set-list", submit_with("--set", "sim_mem_gib=[1]")),
    ("set-flow-mapping", submit_with("--set", "sim_mem_gib={x: 1}")),
    ("set-documents", submit_with("--set", "sim_mem_gib=--- 1\n--- 2")),
    ("set-python-tag", submit_with("--set", 'sim_mem_gib=!!python/object/apply:os.system ["touch pwned"]')),
    ("set-anchor-list", submit_with("--set", "sim_mem_gib=&anchor [1]")),
    ("set-alias", submit_with("--set", "sim_mem_gib=*alias")),
    ("set-huge-int", submit_with("--set", "sim_mem_gib=99999999999999999999999")),
    ("set-infinity", submit_with("--set", "sim_mem_gib=.inf")),
    ("set-escape", submit_with("--set", "sim_mem_gib=\x1b[31m")),
    ("set-env-digit", submit_with("--set", "env.1BAD=x")),
    ("set-env-dash", submit_with("--set", "env.A-B=x")),
    ("set-env-empty", submit_with("--set", "env.=x")),
    ("set-dunder", submit_with("--set", "__class__=x")),
    ("set-unknown", submit_with("--set", "nonsense=1")),
    ("set-seed", submit_with("--set", "seed=1")),
    ("set-data", submit_with("--set", "data=glue_cola")),
    ("set-no-equals", submit_with("--set", "sim_mem_gib")),
    ("set-no-key", submit_with("--set", "=1")),
    # suite names
    ("suite-traversal", ("submit", "--suite", "../etc/passwd", "--pairs", "87:glue_rte")),
    ("suite-dotdot", ("submit", "--suite", "E1/../E1", "--pairs", "87:glue_rte")),
    ("suite-shell", ("submit", "--suite", "E1;ls", "--pairs", "87:glue_rte")),
    ("suite-empty", ("submit", "--suite", "", "--pairs", "87:glue_rte")),
    ("suite-unknown", ("submit", "--suite", "NOPE", "--pairs", "87:glue_rte")),
    # suite files with wrong types (written under BAD_PLANS below)
    ("file-mem-string", bad_suite("mem_string")),
    ("file-configs-string", bad_suite("configs_string")),
    ("file-env-list", bad_suite("env_list")),
    ("file-worker-int", bad_suite("worker_int")),
    ("file-config-is-list", bad_suite("config_list")),
    ("file-unknown-key", bad_suite("unknown_key")),
    ("file-round-unknown-config", bad_suite("round_unknown")),
    ("file-python-tag", bad_suite("python_tag")),
    ("file-missing-config", bad_suite("missing_config")),
    ("file-not-yaml", bad_suite("not_yaml")),
    # other commands and options
    ("priority-huge", submit_with("--priority", "99999")),
    ("unknown-option", submit_with("--bogus")),
    ("missing-pairs", ("submit", "--suite", "demo")),
    ("plan-set-exponent", ("plan", "set", "1e3")),
    ("plan-set-mismatch", ("plan", "set", "2,2", "--gpus", "0")),
    ("plan-set-shell", ("plan", "set", "$(touch pwned)")),
    ("show-shell", ("show", "1;ls")),
    ("show-huge", ("show", "99999999999999999999")),
    ("logs-subshell", ("logs", "$(touch pwned)")),
    ("jobs-bad-state", ("jobs", "--state", "bogus")),
    ("unknown-command", ("frobnicate",)),
]

# Round errors that need the suite and the plan to be found: still nothing may be written.
LATE_ROUND_CASES: list[tuple[str, tuple[str, ...]]] = [
    ("round-too-large", submit_with("--round", "999", "--gpus", "0", "--gpu-plan", "2")),
    ("round-without-plan", submit_with("--round", "2")),
    ("round-unknown-name", submit_with("--round", "nosuchround")),
]

BAD_SUITES: dict[str, tuple[object, dict[str, object]]] = {
    "mem_string": ({"worker": "sim", "mem_gib": "lots", "configs": ["a"]}, {"a": {}}),
    "configs_string": ({"worker": "sim", "mem_gib": 1, "configs": "E1"}, {}),
    "env_list": ({"worker": "sim", "mem_gib": 1, "configs": ["a"], "env": ["a"]}, {"a": {}}),
    "worker_int": ({"worker": 5, "mem_gib": 1, "configs": ["a"]}, {"a": {}}),
    "config_list": ({"worker": "sim", "mem_gib": 1, "configs": ["a"]}, {"a": "- 1\n- 2\n"}),
    "unknown_key": ({"worker": "sim", "mem_gib": 1, "configs": ["a"], "shell": "rm -rf /"}, {"a": {}}),
    "round_unknown": ({"worker": "sim", "mem_gib": 1, "configs": ["a"], "rounds": {"r1": ["zzz"]}}, {"a": {}}),
    "python_tag": ("worker: !!python/object/apply:os.system ['touch pwned']\nmem_gib: 1\nconfigs: [a]\n", {"a": {}}),
    "missing_config": ({"worker": "sim", "mem_gib": 1, "configs": ["a"]}, {}),
    "not_yaml": ("worker: [sim\nmem_gib: 1\n", {}),
}


def write_bad_plans(root: Path) -> None:
    for name, (suite, configs) in BAD_SUITES.items():
        (root / "suites").mkdir(parents=True, exist_ok=True)
        text = suite if isinstance(suite, str) else yaml.safe_dump(suite)
        (root / "suites" / f"{name}.yaml").write_text(text)
        for config_name, content in configs.items():
            (root / "configs" / name).mkdir(parents=True, exist_ok=True)
            body = content if isinstance(content, str) else yaml.safe_dump(content)
            (root / "configs" / name / f"{config_name}.yaml").write_text(body)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (state.db's -wal/-shm included if present)."""
    listing: dict[str, bytes] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            listing[str(path.relative_to(root))] = path.read_bytes()
    return listing


def assert_refused(result: OrchResult, before: dict[str, bytes], root: Path) -> None:
    assert result.rc == 2, (result.rc, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orch: error: ")
    assert "\x1b" not in result.stderr  # escapes are shown quoted, never replayed to the terminal
    after = tree(root)
    assert not any(Path(p).name == "pwned" for p in after)
    assert after == before


@pytest.fixture(scope="module")
def bad_plans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-plans")
    write_bad_plans(root)
    return root


@pytest.fixture
def cwd(tmp_path: Path, bad_plans_dir: Path) -> Path:
    (tmp_path / "notes.txt").write_text("a file of the user's that must survive\n")
    return tmp_path


def resolved(argv: tuple[str, ...], bad_plans_dir: Path) -> tuple[str, ...]:
    return tuple(str(bad_plans_dir) if arg == BAD_PLANS else arg for arg in argv)


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A state.db with jobs and a plan, built once; each test gets a copy of its bytes."""
    path = tmp_path_factory.mktemp("template") / "state.db"
    suite = load_suite("demo", REPO_ROOT / "plans")
    with Store(path) as store:
        specs = expand_jobs(suite, parse_pairs("87:glue_rte 13:glue_cola"), {}, None, 0)
        submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False)
        set_gpu_plan(store, parse_gpu_plan("2", None))
    return path.read_bytes()  # closed: the WAL is checkpointed into the main file


@pytest.fixture
def existing_db(template_db: bytes, db_path: Path) -> Path:
    db_path.write_bytes(template_db)
    db_path.chmod(0o600)
    return db_path


def test_corpus_is_large() -> None:
    assert len(CASES) >= 40
    assert len({case_id for case_id, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("case_id", "argv"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_existing_db(
    orch_inproc: OrchRunner, cwd: Path, existing_db: Path, bad_plans_dir: Path, case_id: str, argv: tuple[str, ...]
) -> None:
    before = tree(cwd)
    assert_refused(orch_inproc(*resolved(argv, bad_plans_dir)), before, cwd)


@pytest.mark.parametrize(("case_id", "argv"), CASES, ids=[c[0] for c in CASES])
def test_refused_without_db(
    orch_inproc: OrchRunner, cwd: Path, db_path: Path, bad_plans_dir: Path, case_id: str, argv: tuple[str, ...]
) -> None:
    before = tree(cwd)
    assert_refused(orch_inproc(*resolved(argv, bad_plans_dir)), before, cwd)
    assert not db_path.exists()


@pytest.mark.parametrize(("case_id", "argv"), LATE_ROUND_CASES, ids=[c[0] for c in LATE_ROUND_CASES])
def test_late_round_errors_with_existing_db(
    orch_inproc: OrchRunner, cwd: Path, existing_db: Path, case_id: str, argv: tuple[str, ...]
) -> None:
    before = tree(cwd)
    assert_refused(orch_inproc(*argv), before, cwd)


@pytest.mark.parametrize(
    ("case_id", "argv"),
    [pytest.param(*case, id=case[0]) for case in LATE_ROUND_CASES],
)
def test_late_round_errors_without_db(
    orch_inproc: OrchRunner, cwd: Path, db_path: Path, case_id: str, argv: tuple[str, ...]
) -> None:
    before = tree(cwd)
    assert_refused(orch_inproc(*argv), before, cwd)
    assert not db_path.exists()


# A representative subset through the real interpreter entry point, run two at a time.
SUBPROCESS_CASES = [
    "pair-subshell", "pair-backticks", "pair-newline", "set-python-tag", "set-escape",
    "suite-traversal", "file-mem-string", "plan-fullwidth-digit", "round-zero", "logs-subshell",
]


def test_refused_through_the_console_entry_point(
    orch_cli: OrchRunner, cwd: Path, existing_db: Path, bad_plans_dir: Path
) -> None:
    chosen = [resolved(argv, bad_plans_dir) for case_id, argv in CASES if case_id in SUBPROCESS_CASES]
    assert len(chosen) == len(SUBPROCESS_CASES)
    before = tree(cwd)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda argv: orch_cli(*argv, cwd=cwd), chosen))
    for argv, result in zip(chosen, results, strict=True):
        try:
            assert_refused(result, before, cwd)
        except AssertionError as exc:
            raise AssertionError(f"{argv!r} -> rc {result.rc}, stderr {result.stderr!r}: {exc}") from exc
