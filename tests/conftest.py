"""Shared fixtures: a temp state database, two ways of running the `orch` CLI against it
(`orch_cli`, `orch_inproc`), the end-to-end harness (`orch`), and the `e2e` marking."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# One compute thread per process (torch here, and the workers tests start): the suite runs as
# many processes as there are cores, and torch's default of one thread per core made the
# training tests contend for them (measured: test_lora_resume.py 110 s -> 55 s on 2 busy cores).
# orch sets the same for the workers it launches (executors/run_dir.py).
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


def _pycache_prefix() -> str:
    """A folder of this user's own under the temp dir, kept between runs; a fresh one where that
    name is taken by anything else (another user, a link, a folder others can write in)."""
    folder = Path(tempfile.gettempdir()) / f"orch-tests-pycache-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    found = folder.lstat()
    if stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and not found.st_mode & 0o077:
        return str(folder)
    return tempfile.mkdtemp(prefix="orch-tests-pycache-")


# Compiled modules for the Python processes the tests start (the CLI, daemons, wrappers and
# workers: thousands in a run). Where PYTHONDONTWRITEBYTECODE is set, each of them compiled orch's
# modules again, about a quarter of a CLI call's CPU (`-n 0` test_untrusted.py: 49-57 s of CPU
# -> 38 s); they share them in a folder of their own instead (PYTHONPYCACHEPREFIX), which keeps
# the tree free of .pyc files as the variable asks. Set by the first pytest process; xdist's
# workers inherit it.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) and "PYTHONPYCACHEPREFIX" not in os.environ:
    os.environ["PYTHONPYCACHEPREFIX"] = _pycache_prefix()
# Variables that would point a test at the user's own state, plans or GPUs.
_HOST_ENV = ("ORCH_DB", "ORCH_PLANS", "ORCH_GPU_BACKEND", "ORCH_SIM_DIR", "ORCH_SIM_GPUS", "ORCH_LAUNCHER")


@dataclass(frozen=True)
class OrchResult:
    rc: int
    stdout: str
    stderr: str


OrchRunner = Callable[..., OrchResult]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the test's state.db lives (not created)."""
    return tmp_path / "state.db"


@pytest.fixture
def orch(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The end-to-end harness (tests/e2e_helpers.Orch): its own state.db, plans, runs and
    simulated GPUs under `tmp_path` (the module's `SIM_GPUS`, e.g. "4x24GiB", else the harness's
    default), and every daemon, worker and tmux server it started gone afterwards. A test that
    uses it is marked `e2e`."""
    from tests.e2e_helpers import orch_env

    gpus = getattr(request.module, "SIM_GPUS", None)
    with orch_env(tmp_path, **({"gpus": gpus} if gpus else {})) as env:
        yield env


@pytest.fixture
def orch_cli(db_path: Path, tmp_path: Path) -> OrchRunner:
    """Run the real entry point in a subprocess, no daemon: `orch_cli(*args, cwd=None, env=None)`."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> OrchResult:
        full_env = {k: v for k, v in os.environ.items() if k not in _HOST_ENV}
        full_env["ORCH_DB"] = str(db_path)
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
        full_env.update(env or {})
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return OrchResult(done.returncode, done.stdout, done.stderr)

    return run


@pytest.fixture
def orch_inproc(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[OrchRunner]:
    """Run `orchestrator.cli.main` in this process (same error mapping, no interpreter start):
    `orch_inproc(*args, cwd=None)`. Much faster than `orch` for many cases."""
    from orchestrator.cli import main

    for name in _HOST_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCH_DB", str(db_path))
    monkeypatch.chdir(tmp_path)

    def run(*args: str, cwd: Path | None = None) -> OrchResult:
        capsys.readouterr()
        if cwd is not None:
            monkeypatch.chdir(cwd)
        try:
            rc = main(list(args))
        finally:
            monkeypatch.chdir(tmp_path)
        captured = capsys.readouterr()
        return OrchResult(rc, captured.out, captured.err)

    yield run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """Sample GLUE data for the LoRA worker's tests, sized by the module's
    `SAMPLE_GLUE = (tasks, n_train, n_dev)` (default: RTE, 16 and 8 examples)."""
    from workers.lora.sample_data import main as sample_main

    tasks, n_train, n_dev = getattr(request.module, "SAMPLE_GLUE", ("rte", 16, 8))
    out = tmp_path_factory.mktemp("glue")
    sample_main(["--out", str(out), "--tasks", tasks, "--n-train", str(n_train), "--n-dev", str(n_dev)])
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a test module's pages (tests/browser_pages.py)."""
    from browser_pages import chromium

    with chromium() as launched:
        yield launched


@pytest.fixture
def tmux(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A tmux launcher on a private server of its own, killed after the test; the test runs in
    this checkout, which its workers import."""
    from orchestrator.executors.tmux import TmuxExecutor

    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    launcher = TmuxExecutor(f"orch-test-{uuid.uuid4().hex[:10]}")
    yield launcher
    launcher.kill_server()


# The files that take longest, longest first: pytest-xdist hands out whole files (`--dist
# loadfile`) in collection order (`--no-loadscope-reorder`), so the long ones start first and the
# many short files fill in around them, instead of one long file starting last and running on
# alone. Every file that took 20 s or more alone (`python -m pytest -q -n 0 tests/FILE.py`), a
# CPU-bound one counted up to half as long again (it slows down most beside the others), and
# where known, as long as it took in a full run.
LONGEST_FIRST = (
    "test_slurm_e2e.py", "test_resume_e2e.py", "test_early_stop_e2e.py", "test_untrusted.py",
    "test_containment.py", "test_lora_share_base.py", "test_chaos.py", "test_search.py",
    "test_oom_recovery.py", "test_torchrun_e2e.py", "test_startup_hold_e2e.py", "test_demo_fresh.py",
    "test_ladder_evidence_e2e.py", "test_tmux_restart.py", "test_own_script_e2e.py", "test_lora_through_orch.py",
    "test_daemon_e2e.py", "test_curves_e2e.py", "test_demo_oom.py", "test_trial_start_e2e.py",
    "test_web_browser.py", "test_lora_equivalence.py", "test_memory_learning_e2e.py", "test_web_reading.py",
    "test_multi_gpu_e2e.py", "test_lora_fused.py", "test_late_requests.py", "test_logs_stream.py",
    "test_fault_injection.py", "test_lora_train.py", "test_fused_e2e.py", "test_memory_family_e2e.py",
    "test_orch_shortages.py", "test_sim_footprint.py",
)


# End-to-end tests (marked `e2e` here, so that `pytest -m "not e2e"` is the fast inner loop): a
# test that runs the end-to-end harness of tests/e2e_helpers.py (a real daemon, its workers and
# the CLI in subprocesses, on simulated GPUs), drives Chromium, needs Slurm, or is marked `slow`
# (a whole sweep, `orch demo`). Found from what the test and its fixtures use and its markers, so
# no test file has to say it.
E2E_HARNESS = frozenset({"orch_env", "Orch"})  # names a test or fixture calls to get the harness
E2E_FIXTURES = frozenset({"browser", "cluster"})  # Chromium; a Slurm cluster (tests/slurm_cluster.py)
E2E_MARKERS = ("browser", "slurm", "slow")


def _names_used(code: CodeType) -> set[str]:
    """The global and attribute names a function's code (nested functions included) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names_used(const)
    return names


def is_e2e(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) for name in E2E_MARKERS):
        return True
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & E2E_FIXTURES:
        return True
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in fixtures:
        functions += [definition.func for definition in (info.name2fixturedefs.get(name, ()) if info else ())]
    return any(E2E_HARNESS & _names_used(f.__code__) for f in functions if hasattr(f, "__code__"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_e2e(item):
            item.add_marker(pytest.mark.e2e)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two test processes per core (at most 8). Most end-to-end tests wait on workers,
    daemons and Slurm more than they compute, so two per core keep the cores busy."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))
