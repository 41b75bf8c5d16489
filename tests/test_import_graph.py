"""The package's import graph has no cycles, so any module can be read, tested and changed from
its imports down. Every import counts: one under `if TYPE_CHECKING:` is a coupling too, and a late
import inside a function that hides a cycle is still a cycle. The stage packages import downwards
only (LAYERS), and the tree keeps its shape (few top-level modules, no file over 500 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.executors.backends import EXECUTOR_NAMES

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imported(ast.parse(path.read_text()), modules) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_sees_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_type_checking_imports_count() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.y\nimport x.z\n")
    assert _imported(tree, {"x.y", "x.z"}) == {"x.y", "x.z"}


def test_orchestrator_has_no_import_cycle() -> None:
    graph = import_graph()
    assert graph.get("orchestrator.scheduling.dispatch")
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# A job's life, bottom to top: a package imports only from its own stage and those left of it.
# "leaf": the top-level modules of orchestrator/ (errors, clock, run-dir names, /proc, wording).
LAYERS = ["leaf", "plans", "store", "gpu", "prediction", "submit", "executors", "attempts", "scheduling",
          "actions", "daemon", "results", "api", "web", "cli"]  # fmt: skip


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "leaf"  # orchestrator/__init__
    if parts[1] == "__main__":
        return "cli"
    if (PACKAGE / f"{parts[1]}.py").is_file():
        return "leaf"
    return parts[1]


def test_stage_of_names_the_package() -> None:
    assert stage_of("orchestrator.scheduling.packing.pack") == "scheduling"
    assert stage_of("orchestrator.errors") == "leaf"
    assert stage_of("orchestrator.__main__") == "cli"


def test_stage_packages_point_down() -> None:
    rank = {stage: i for i, stage in enumerate(LAYERS)}
    upward = []
    for importer, imported in import_graph().items():
        for target in imported:
            if rank[stage_of(target)] > rank[stage_of(importer)]:
                upward.append(f"{importer} -> {target}")
    assert not upward, "imports pointing up the stages: " + ", ".join(sorted(upward))


def test_orchestrator_imports_no_worker() -> None:
    graph_modules = {p for p in PACKAGE.rglob("*.py")}
    offenders = []
    for path in graph_modules:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""] if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            )
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "workers"]
    assert not offenders, offenders


def test_layout() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    assert not (PACKAGE / "launch").exists()
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert set(LAYERS) - {"leaf"} <= packages, set(LAYERS) - packages
    # ~400 lines is a prompt to look at a file, not a reason to split one concept across two;
    # past 500 a file has become more than one thing.
    long = []
    for folder in (PACKAGE, PACKAGE.parent / "workers"):
        for path in folder.rglob("*.py"):
            if (lines := len(path.read_text().splitlines())) > 500:
                long.append(f"{path.relative_to(PACKAGE.parent)} ({lines})")
    assert not long, "over 500 lines: " + ", ".join(sorted(long))


def test_the_wrapper_packages_import_nothing() -> None:
    """`python -S -m orchestrator.executors.wrapper.run` loads these first: they must not pull in
    the store (sqlite_utils) or anything else of the daemon."""
    for package in (PACKAGE / "executors", PACKAGE / "executors" / "wrapper"):
        tree = ast.parse((package / "__init__.py").read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], package


def test_only_executors_ask_which_executor_they_hold() -> None:
    """Outside executors/, no isinstance() on an executor or launcher class and no comparison of
    an executor's name with a backend's: what differs between backends is the executor's own
    (`remote`, `executors.base.cluster_owned`), and no method of it is looked up by getattr: the
    interface has each one. A user's `--executor` choice may be compared."""
    backends = set(EXECUTOR_NAMES)
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "executors"):
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                classes = ast.get_source_segment(source, node.args[1]) or ""
                if "Executor" in classes or "Launcher" in classes:
                    found.append(f"{path.name}:{node.lineno} isinstance(..., {classes})")
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = any(isinstance(s, ast.Constant) and s.value in backends for s in sides)
                text = ast.get_source_segment(source, node) or ""
                if named and ("executor" in text or "launcher" in text) and "_kind" not in text:
                    found.append(f"{path.name}:{node.lineno} {text}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr") and node.args:
                held = ast.get_source_segment(source, node.args[0]) or ""
                if "executor" in held or "launcher" in held:  # every method is the interface's own
                    found.append(f"{path.name}:{node.lineno} {ast.get_source_segment(source, node)}")
    assert not found, found


def test_user_actions_sit_below_cli_and_web() -> None:
    """Cancel, retry and resume are one module that the CLI and the web page both call; the web
    page, a client of the store like the daemon, imports nothing of the daemon."""
    graph = import_graph()
    actions = "orchestrator.actions.user_actions"
    assert actions in graph["orchestrator.web.app"] and actions in graph["orchestrator.cli.control"]
    from_web = sorted(f"{m} -> {t}" for m, ts in graph.items() if stage_of(m) == "web"
                      for t in ts if stage_of(t) == "daemon")
    assert not from_web, from_web
    assert not [t for t in graph[actions] if stage_of(t) in ("daemon", "web", "cli")]


def test_the_architecture_page_lists_the_stages_in_order() -> None:
    """docs/architecture.md's layout names every stage package, in the order LAYERS has them."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    layout = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = [line.split("`")[1].rstrip("/") for line in layout.splitlines() if line.startswith("- `")]
    stages = list(dict.fromkeys(s for s in named if s in LAYERS))  # plans/ is also the repo folder
    assert stages == LAYERS[1:], stages


def test_the_submit_stage_sits_below_what_runs_jobs() -> None:
    """Queueing a job is its life's first stage: the submit core imports no executor, daemon,
    user action or API module (LAYERS enforces it; this says which module it is)."""
    graph = import_graph()
    assert "orchestrator.submit.core" in graph["orchestrator.cli.submit"]
    assert "orchestrator.submit.core" in graph["orchestrator.api.sweep"]
    assert not [t for t in graph["orchestrator.submit.core"]
                if stage_of(t) in ("executors", "attempts", "scheduling", "actions", "daemon", "api")]
