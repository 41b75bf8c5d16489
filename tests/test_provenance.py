"""Provenance per attempt: what the wrapper and the LoRA worker record, how orch reads it (run-dir
files are user code's: bounded, no links, printable short texts), and, end to end, a results row
whose runs ran different code marked `‖`."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.attempts.provenance_reads import (
    provenance_digest,
    provenance_line,
    read_provenance,
)
from orchestrator.executors.provenance import (
    NOT_A_REPOSITORY,
    WORKER_PROVENANCE_NOTES,
    WORKER_PROVENANCE_VAR,
    git_state,
    interpreter_versions,
    worker_interpreter,
    wrapper_record,
)
from orchestrator.web.views import job_view
from tests.e2e_helpers import Orch, requires_tmux

requires_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
PY = shlex.quote(sys.executable)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@requires_git
def test_git_state_says_commit_dirty_or_not_a_repository(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"commit": None, "note": NOT_A_REPOSITORY}
    git(tmp_path, "init", "-q")
    assert git_state(tmp_path) == {"commit": None, "note": "no commit yet"}
    (tmp_path / "train.py").write_text("print(1)\n")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked files do not make a tree dirty\n")
    assert git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "train.py").write_text("print(2)\n")
    assert git_state(tmp_path / ".") == {"commit": head, "dirty": True}


def test_the_worker_interpreter_is_found_by_name_or_shebang(tmp_path: Path) -> None:
    assert worker_interpreter([sys.executable, "train.py"]) == sys.executable
    script = tmp_path / "launch"
    script.write_text(f"#!/usr/bin/env -S {Path(sys.executable).name} -u\nprint(1)\n")
    script.chmod(0o755)
    assert worker_interpreter([str(script)]) is not None
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/sh\necho hi\n")
    assert worker_interpreter([str(shell)]) is None
    assert worker_interpreter([]) is None
    versions = interpreter_versions(sys.executable)
    assert versions["python"] == sys.version.split()[0] and "libraries" in versions


def test_the_digest_keeps_short_printable_texts_only() -> None:
    wrapper = {
        "recorded_by": "wrapper",
        "cwd": "/home/r/proj\x1b[31m",
        "code": {"commit": "a" * 40, "dirty": True},
        "host": {"name": "node\u202e7"},
        "gpu": {
            "kind": "nvml",
            "models": ["NVIDIA H100", "NVIDIA H100"],
            "driver": "550.54",
            "cuda": "12.4",
        },
        "python": {
            "python": "3.11.7",
            "libraries": {"numpy": "2.0", "torch": "2.5.1", "zzz": {"x": 1}, "peft": "x" * 999},
        },
    }
    digest = provenance_digest(wrapper, None)
    assert digest is not None
    assert digest["code"] == "a" * 40 + "+dirty" and digest["code_dir"] == "/home/r/proj [31m"
    assert digest["host"] == "node 7" and digest["gpu"] == "NVIDIA H100 ×2"
    assert digest["libraries"].startswith("python 3.11.7, torch 2.5.1, peft xxx") and "zzz" not in digest["libraries"]
    assert len(digest["libraries"]) <= 800
    assert provenance_digest({"code": {"commit": "not-a-sha; rm -rf /"}, "host": {"name": "h"}}, None) == {"host": "h"}
    assert provenance_digest({}, None) is None and provenance_digest(None, None) is None
    worker = {"recorded_by": "workers.lora", "python": "3.12.1", "libraries": {"torch": "2.6.0"},
              "data": {"sha256": "b" * 64, "files": {"train.tsv": "c" * 64, "dev.tsv": "d" * 64}},
              "model": {"builtin": "tiny-llama"}, "cuda_runtime": "12.4", "device": "NVIDIA H100"}
    both = provenance_digest({**wrapper, "gpu": {"kind": "nvml"}}, worker)
    assert both is not None
    assert both["libraries"] == "python 3.12.1, torch 2.6.0"  # the worker's own versions win
    assert both["data"] == "sha256 " + "b" * 64 + " (2 files)" and both["model"] == "built-in tiny-llama"
    assert both["gpu"] == "NVIDIA H100" and both["recorded_by"] == "wrapper + workers.lora"
    line = provenance_line(both)
    assert line.startswith("code aaaaaaaaaaaa+dirty in /home/r/proj") and "host node 7" in line


def test_provenance_json_is_read_bounded_and_never_through_a_link(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "s" / "1" / "attempt-1"
    run_dir.mkdir(parents=True)
    for level in (tmp_path / "runs", run_dir.parent.parent, run_dir.parent, run_dir):
        level.chmod(0o700)
    (tmp_path / "elsewhere.json").write_text(json.dumps({"host": {"name": "planted"}}))
    (run_dir / "provenance.json").symlink_to(tmp_path / "elsewhere.json")
    assert read_provenance(run_dir, None) is None
    (run_dir / "provenance.json").unlink()
    (run_dir / "provenance.json").write_text(json.dumps({"host": {"name": "h" * 10}, "pad": "x" * 70_000}))
    assert read_provenance(run_dir, None) is None  # over the size limit: refused, not cut
    (run_dir / "provenance.json").write_text("[1, 2]")
    assert read_provenance(run_dir, {"provenance": "nope"}) is None
    (run_dir / "provenance.json").write_text(json.dumps({"host": {"name": "gpu-node-3"}}))
    assert read_provenance(run_dir, None) == {"host": "gpu-node-3"}


# A script in a git repository: run once from a clean tree, once with an uncommitted change.
SCRIPT = "import json\nfor i in range(5):\n    print({'loss': 1.0 / (i + 1)})\nprint(json.dumps({'accuracy': 0.7}))\n"




@requires_git
@requires_tmux
def test_runs_of_different_code_are_marked_and_each_attempt_names_its_own(orch: Orch) -> None:
    repo = orch.root
    (repo / "train.py").write_text(SCRIPT)
    git(repo, "init", "-q")
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "train")
    head = git(repo, "rev-parse", "HEAD")
    config_dir = orch.plans / "configs" / "own"
    config_dir.mkdir(parents=True)
    (config_dir / "own.yaml").write_text(yaml.safe_dump({"lr": 0.1}))
    (orch.plans / "suites" / "own.yaml").write_text(yaml.safe_dump(
        {"worker": f"{PY} train.py", "mem_gib": 1, "configs": ["own"]}))
    orch.submit("own", "1:toy")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "succeeded"}
    (repo / "train.py").write_text(SCRIPT.replace("0.7", "0.6"))  # uncommitted: the tree is dirty
    orch.submit("own", "2:toy")
    assert orch.wait_all_done(60) == {1: "succeeded", 2: "succeeded"}

    first = orch.json("show", "1")["attempts"][0]["provenance"]
    second = orch.json("show", "2")["attempts"][0]["provenance"]
    assert (first["code"], second["code"]) == (head, head + "+dirty")
    assert first["gpu"].startswith("simulated") and first["libraries"].startswith(f"python {sys.version.split()[0]}")
    assert first["host"] and first["recorded_by"] == "wrapper"
    assert f"ran with: code {head[:12]}+dirty in {repo}" in orch.run("show", "2").stdout

    (row,) = orch.json("results")
    assert row["mixed_provenance"] is True and "‖" in row["marks"]
    assert [run["code"] for run in row["runs"]] == [head, head + "+dirty"]
    assert "runs differ in code" in " ".join(row["notes"])
    assert "‖ runs ran different code" in orch.run("results", "--format", "markdown").stdout

    # the web job page lists each attempt's, the report what the succeeded runs ran with
    page = orch.read(lambda store: job_view(store, 2))
    assert f'<td data-field="code">{head}+dirty</td>' in page and '<td data-field="gpu">simulated</td>' in page
    report = orch.root / "report.html"
    orch.run("report", "--out", str(report))
    html = report.read_text()
    assert (
        f'{head} <span class="muted">(1)</span>' in html
        and f'{head}+dirty <span class="muted">(1)</span>' in html
    )
    assert "‖" in html  # the results table's mark, with its legend


def test_our_workers_versions_are_not_read_by_the_wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    monkeypatch.setenv(WORKER_PROVENANCE_VAR, WORKER_PROVENANCE_NOTES["lora"])
    record = wrapper_record([sys.executable, "-m", "workers.lora"], tmp_path, None, None)
    assert record["python"] == {"note": "recorded by the worker (result.json)"}
    assert record["gpu"] == {"kind": "simulated"} and record["cwd"] == str(tmp_path)
    monkeypatch.delenv(WORKER_PROVENANCE_VAR)
    shell = tmp_path / "train.sh"
    shell.write_text("#!/bin/sh\nexit 0\n")
    assert wrapper_record([str(shell)], tmp_path, None, None)["python"] == {"note": "train.sh is not a Python program"}
    # an attempt that ended without the worker's record (cancelled, failed before its result.json)
    # does not say its versions were recorded there; one still running does
    assert provenance_digest(record, None)["libraries"] == "recorded by the worker (result.json)"
    assert provenance_digest(record, None, ended=True)["libraries"] == (
        "not recorded: the worker ended before writing its result.json")
    other = {"python": {"note": "train.sh is not a Python program"}}
    assert provenance_digest(other, None, ended=True)["libraries"] == "train.sh is not a Python program"


@pytest.mark.parametrize("junk", [None, True, 3, "text", [1, 2], {"a": {"b": [None]}}, 1e308, "\x00" * 300])
def test_any_shape_of_junk_gives_a_digest_or_none_never_an_error(junk: object) -> None:
    for key in ("code", "cwd", "host", "gpu", "python", "recorded_by"):
        digest = provenance_digest({key: junk, "gpu": {"models": junk, "driver": junk}, "code": {"commit": junk,
                                    "note": junk}}, {"python": junk, "libraries": junk, "data": {"sha256": junk,
                                    "files": junk}, "model": {"revision": junk, "builtin": junk}})
        assert digest is None or all(isinstance(v, str) and len(v) <= 800 and "\x00" not in v for v in digest.values())


@requires_git
def test_recording_the_code_runs_nothing_the_repository_configures(tmp_path: Path) -> None:
    """An fsmonitor hook, a clean filter and a post-index-change hook of the worker's repository
    would each touch a file if git ran them: recording the commit and dirty flag runs none."""
    repo, ran = tmp_path / "repo", tmp_path / "ran"
    repo.mkdir()
    ran.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "one")
    head = git(repo, "rev-parse", "HEAD")
    for name in ("fsmonitor", "filter", "hook"):
        script = tmp_path / f"{name}.sh"
        script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(ran / name))}\ncat\n")
        script.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(tmp_path / "fsmonitor.sh"))
    git(repo, "config", "filter.evil.clean", str(tmp_path / "filter.sh"))
    git(repo, "config", "filter.evil.required", "true")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    hook = repo / ".git" / "hooks" / "post-index-change"
    hook.parent.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "hook.sh", hook)
    (repo / "train.py").write_text("print(1)\n")  # same content, fresh stat: git would look inside
    os.utime(repo / "train.py", (1, 1))
    assert git_state(repo) == {"commit": head, "dirty": False}  # read without the filter: the same
    (repo / "train.py").write_text("print(2)\n")
    assert git_state(repo) == {"commit": head, "dirty": True}
    assert sorted(p.name for p in ran.iterdir()) == []  # today: fsmonitor, filter and hook
