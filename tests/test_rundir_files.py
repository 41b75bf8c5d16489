"""The run dir's one module: every name in one place, one atomic writer, and imports that keep
the wrapper and the workers free of orch's dependencies."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.rundir_files import RunDir, write_atomic, write_json, write_text

REPO = Path(__file__).resolve().parents[1]


def test_paths_are_the_names_under_the_run_dir(tmp_path: Path) -> None:
    files = RunDir(tmp_path)
    assert files.config == tmp_path / "config.yaml" and files.pid == tmp_path / "pid.json"
    assert files.exit.name == RunDir.EXIT and files.log.name == RunDir.LOG
    assert files.progress.name == RunDir.PROGRESS and files.result.name == RunDir.RESULT
    assert RunDir(str(tmp_path)) == files and len({files, RunDir(tmp_path)}) == 1


def test_write_json_replaces_a_planted_symlink_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").symlink_to(target)
    assert write_json(run_dir / "result.json", {"status": "succeeded", "when": tmp_path})
    assert target.read_text() == "keep me"  # written in place of the link, never through it
    assert not (run_dir / "result.json").is_symlink()
    assert json.loads((run_dir / "result.json").read_text()) == {"status": "succeeded", "when": str(tmp_path)}
    assert stat.S_IMODE(os.stat(run_dir / "result.json").st_mode) == 0o600
    assert sorted(p.name for p in run_dir.iterdir()) == ["result.json"]


def test_an_exclusive_write_never_replaces(tmp_path: Path) -> None:
    assert write_json(tmp_path / "pid.json", {"pid": 1}, exclusive=True)
    assert not write_json(tmp_path / "pid.json", {"pid": 2}, exclusive=True)
    assert json.loads((tmp_path / "pid.json").read_text()) == {"pid": 1}
    (tmp_path / "exit.json").symlink_to(tmp_path / "nowhere")  # a dangling link counts as taken
    assert not write_atomic(tmp_path / "exit.json", b"{}", exclusive=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit.json", "pid.json"]


def test_mode_and_parents(tmp_path: Path) -> None:
    write_text(tmp_path / "a" / "b" / "report.html", "<p>x</p>", mode=0o644, parents=True)
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "report.html").st_mode) == 0o644
    with pytest.raises(FileNotFoundError):
        write_text(tmp_path / "missing" / "x.html", "x")
    assert not (tmp_path / "missing").exists()


def test_a_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    (tmp_path / "result.json").mkdir()  # a directory under the name: the rename fails
    with pytest.raises(OSError):
        write_json(tmp_path / "result.json", {"status": "failed"})
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_module_needs_the_standard_library_alone() -> None:
    imported = {name.split(".")[0] for name in _imports(REPO / "orchestrator" / "rundir_files.py")}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


# What workers/ may import of orchestrator: modules that load the standard library alone
# (procstat: the sim GPUs' one read of /proc; gpu.sim_files: the simulated-GPU file protocol, whose
# psutil fallback is imported only where /proc has no answer; plans.lora_keys: the LoRA worker's
# config keys, plain data).
WORKER_IMPORTS = {
    "orchestrator.rundir_files",
    "orchestrator.procstat",
    "orchestrator.gpu.sim_files",
    "orchestrator.plans.lora_keys",
    "orchestrator.plans.spelling",  # a misspelt key's likely meaning (difflib)
    "orchestrator.plans.lora_values",  # the config values orch checks at submit, and the worker at start
    "orchestrator.executors.provenance",  # the standard library only: the wrapper runs it under `python -S`
    "orchestrator.attempts.divergence",  # the divergence rule, one for our worker and for orch
}


def test_workers_import_nothing_else_of_orchestrator() -> None:
    assert _imports(REPO / "orchestrator" / "procstat.py") <= {"__future__", "functools", "os", "typing"}
    for module in WORKER_IMPORTS:
        path = REPO.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text())
        at_import = {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module} | {
            alias.name for n in tree.body if isinstance(n, ast.Import) for alias in n.names
        }
        imported = {name for name in at_import if name.split(".")[0] != "orchestrator"}
        assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {
            "__future__"
        }, (module, imported)
        assert {name for name in _imports(path) if name.split(".")[0] == "orchestrator"} <= WORKER_IMPORTS, module
    for path in sorted((REPO / "workers").rglob("*.py")):
        ours = {name for name in _imports(path) if name.split(".")[0] == "orchestrator"}
        assert ours <= WORKER_IMPORTS, (path, ours)


def test_the_wrapper_and_workers_load_no_heavy_module() -> None:
    """What `python -m orchestrator.executors.wrapper.run` and a worker's harness pull in at start."""
    heavy = ("yaml", "sqlite_utils", "rich", "click", "libtmux", "torch", "orchestrator.store")
    code = (
        "import sys, orchestrator.executors.wrapper.run, workers.harness; "
        f"print([m for m in sys.modules if m.startswith({heavy!r})])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
