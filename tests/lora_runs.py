"""The LoRA worker run in-process as orch runs it: a config.yaml in the run dir, the exit code
checked, result.json read back; and a warm LoRA worker process a test started, awaited until it
listens. Its caller has skipped where torch, transformers or peft are missing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml


def run_lora_worker(run_dir: Path, data_root: Path, **overrides: Any) -> dict[str, Any]:
    """The tiny Llama with LoRA r 4 on q and v, 2 steps of batch 8 on RTE in fp32 unless
    `overrides` say otherwise; what its result.json says."""
    from workers.harness import EXIT_OK
    from workers.lora.__main__ import main

    config = {
        "model": "tiny-llama", "peft": {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]},
        "data": "glue-tvt_rte", "data_dir": str(data_root), "batch_size": 8, "max_steps": 2,
        "learning_rate": 0.01, "prec": "fp32", "seed": 1, "no_save": True,
    } | overrides  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["--run-dir", str(run_dir)]) == EXIT_OK
    return dict(json.loads((run_dir / "result.json").read_text()))


def wait_listening(server: subprocess.Popen[bytes], folder: Path, key: str, log: Path, deadline_s: float) -> None:
    """Until the warm process `server` listens on slot 0 of `key`: a client that finds none
    listening (and cannot start one outside tmux) trains alone, and under load the process's
    imports can take longer than a client's."""
    from workers.lora.share import slot_paths

    deadline = time.monotonic() + deadline_s
    while not slot_paths(folder, key, 0)[0].exists():
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
