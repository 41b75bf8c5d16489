"""The LoRA worker run in-process as orch runs it: a config.yaml in the run dir, the exit code
checked, result.json read back. Its caller has skipped where torch, transformers or peft are
missing."""

from __future__ import annotations

import json
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
