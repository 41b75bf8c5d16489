"""What orch keeps of the records our workers leave: the LoRA worker's `loss_summary` and its own
provenance reach the attempt's end (they were dropped as unknown fields), and every attempt
names the code that computed its numbers: orch's version (and commit) and, for a built-in
worker, a digest of the worker package it ran, so a worker changed mid-sweep reads as `‖`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.attempts.divergence import summary_from_record
from orchestrator.attempts.provenance_reads import (
    provenance_digest,
    provenance_line,
    read_provenance,
)
from orchestrator.attempts.rundir_reads import read_result
from orchestrator.executors.provenance import (
    WORKER_PROVENANCE_NOTES,
    WORKER_PROVENANCE_VAR,
    WORKERS_DIR,
    builtin_worker_code,
    orch_record,
    wrapper_record,
)
from orchestrator.results.collect import provenance_keys

REPO = Path(__file__).resolve().parents[1]


def test_the_lora_workers_loss_summary_and_provenance_are_kept(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tests.lora_runs import run_lora_worker

    data = tmp_path / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.lora.sample_data",
            "--out",
            str(data),
            "--tasks",
            "rte",
            "--n-train",
            "40",
            "--n-dev",
            "16",
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    written = run_lora_worker(tmp_path / "run", data, max_steps=3)
    kept = read_result(tmp_path / "run")
    assert kept is not None and kept["loss_summary"] == written["loss_summary"]
    assert (
        summary_from_record(kept["loss_summary"]) is not None and kept["loss_summary"]["steps"] == 3
    )
    digest = read_provenance(tmp_path / "run", kept)
    assert digest is not None and digest["recorded_by"] == "workers.lora"
    assert digest["model"] == "built-in tiny-llama" and digest["data"].startswith("sha256 ")


def test_every_attempt_names_orch_and_a_builtin_worker_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    script = wrapper_record([sys.executable, "train.py"], tmp_path, None, None)
    assert script["orch"]["version"] and "worker_code" not in script
    monkeypatch.setenv(WORKER_PROVENANCE_VAR, WORKER_PROVENANCE_NOTES["lora"])
    ours = wrapper_record([sys.executable, "-m", "workers.lora"], tmp_path, None, None)
    assert ours["orch"] == script["orch"] and ours["worker_code"]["worker"] == "lora"
    digest = provenance_digest(ours, None)
    assert (
        digest is not None
        and digest["code"] == f"workers.lora sha256:{ours['worker_code']['sha256']}"
    )
    assert digest["code_dir"] == str(WORKERS_DIR) and digest["orch"].startswith(
        ours["orch"]["version"]
    )
    assert (
        f"code workers.lora sha256:{ours['worker_code']['sha256'][:16]} in {WORKERS_DIR}"
        in provenance_line(digest)
    )

    # the worker package edited between two runs of a sweep: their code differs (results' ‖)
    copy = tmp_path / "workers"
    shutil.copytree(WORKERS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = builtin_worker_code("lora", copy)
    assert before["sha256"] == ours["worker_code"]["sha256"]
    (copy / "lora" / "train.py").write_text(
        (copy / "lora" / "train.py").read_text() + "\n# changed\n"
    )
    after = {**ours, "worker_code": builtin_worker_code("lora", copy)}
    codes = {provenance_keys(json.dumps(provenance_digest(r, None)))["code"] for r in (ours, after)}
    assert len(codes) == 2


def test_orch_outside_a_checkout_says_so(tmp_path: Path) -> None:
    record = orch_record(tmp_path)
    assert record["note"] == "not a git checkout" and record["version"]
    if (REPO / ".git").exists() and shutil.which("git"):
        assert len(orch_record(REPO)["commit"]) in (40, 64)
