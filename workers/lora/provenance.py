"""The LoRA worker's own provenance record, put under `provenance` in result.json: its Python and
library versions, the CUDA runtime and device torch sees, a content hash of the data files it
reads and the model's revision (or a digest of its weight files). orch's wrapper records the
code, host and driver in provenance.json (orchestrator.executors.provenance)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from orchestrator.executors.provenance import hash_files, own_python, weights_digest
from workers.lora.config import BUILTIN_MODELS, RunConfig
from workers.lora.data import find_source, parse_data_name

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(?:/|$)")  # a Hugging Face cache folder


def data_record(config: RunConfig) -> dict[str, Any]:
    """sha256 of the files the task's data is read from (its folder: TSV, JSON Lines or saved)."""
    if config.data_dir is None:
        return {"note": "no data directory"}
    _, folder = find_source(config.data_dir, parse_data_name(config.data).task)
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return {"folder": str(folder), **hash_files(files, folder)}


def model_record(model: str) -> dict[str, Any]:
    """A built-in model's name, else the local folder's revision (a Hugging Face cache snapshot's
    commit, or the config's `_commit_hash`) and a digest of its weight files."""
    if model in BUILTIN_MODELS:
        return {"builtin": model}
    folder = Path(model)
    record: dict[str, Any] = {"path": str(folder)}
    snapshot = _SNAPSHOT.search(str(folder.resolve()))
    if snapshot:
        record["revision"] = snapshot.group(1)
    else:
        try:
            commit = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("_commit_hash")
        except (OSError, ValueError, AttributeError):
            commit = None
        if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit):
            record["revision"] = commit
    weights = [p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    if weights:
        record["weights_digest"] = weights_digest(weights)
    return record


def torch_record() -> dict[str, Any]:
    """The CUDA runtime torch was built with and the device it uses (once torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    found: dict[str, Any] = {"cuda_runtime": getattr(torch.version, "cuda", None)}
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name(torch.cuda.current_device())
    return found


def worker_record(config: RunConfig) -> dict[str, Any]:
    record: dict[str, Any] = {"recorded_by": "workers.lora", **own_python()}
    for name, part in (("data", lambda: data_record(config)), ("model", lambda: model_record(config.model))):
        try:
            record[name] = part()
        except Exception as exc:  # a record that cannot be made says why; the run goes on
            record[name] = {"note": f"{type(exc).__name__}: {exc}"[:200]}
    return record
