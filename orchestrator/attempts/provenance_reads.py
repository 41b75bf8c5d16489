"""An attempt's provenance as orch keeps it: provenance.json (the wrapper's) and result.json's
`provenance` (our LoRA worker's), both written where user code runs, read bounded and without
following links, and boiled down to a digest of short, printable texts (`provenance_digest`,
pure). The digest is stored with the attempt at its end; `orch show`, the web job page, the
report and results read it there. Two runs ran the same code when their `code` is equal, and the
same libraries when their `libraries` are. For orch's built-in workers `code` is the sha256 of the
`workers` package they ran (`workers.lora sha256:<hex>`, its folder as `code_dir`), not the git
state of the folder they ran in; `orch` is the version (and commit) of orch itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.executors.provenance import LIBRARIES, WORKER_PROVENANCE_NOTES
from orchestrator.executors.runs_tree import FileProblem, RunTreeError, open_run_dir, read_file
from orchestrator.rundir_files import RunDir

MAX_PROVENANCE_BYTES = 64 * 1024
MAX_TEXT_CHARS = 200
MAX_LIBRARIES = 40
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# The digest's keys, in the order `orch show` and the web page list them.
FIELDS = ("code", "code_dir", "orch", "python", "libraries", "gpu", "driver", "cuda", "cuda_runtime", "host", "data",
          "model", "recorded_by")


def read_provenance(run_dir: Path, result: Mapping[str, Any] | None, ended: bool = False) -> dict[str, str] | None:
    """The digest of the attempt's provenance.json and of its result's `provenance`; None when
    neither says anything. `ended`: read at the attempt's end (`result` is then all it wrote)."""
    wrapper: Any = None
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            raw = read_file(dir_fd, RunDir.PROVENANCE, MAX_PROVENANCE_BYTES)
        wrapper = json.loads(raw.decode("utf-8")) if raw else None
    except (FileProblem, RunTreeError, OSError, UnicodeDecodeError, ValueError, RecursionError):
        wrapper = None
    worker = (result or {}).get("provenance")
    return provenance_digest(wrapper if isinstance(wrapper, dict) else None,
                             worker if isinstance(worker, dict) else None, ended)


# the wrapper's note that says our LoRA worker records its versions itself (its result.json)
WORKER_RECORDS = frozenset({WORKER_PROVENANCE_NOTES["lora"]})


def text(value: Any) -> str | None:
    """A short printable text from user code, or None."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    cleaned = _UNPRINTABLE.sub(" ", str(value)).strip()
    return cleaned[:MAX_TEXT_CHARS] or None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def code_text(code: Mapping[str, Any]) -> str | None:
    """`<commit>` or `<commit>+dirty` (uncommitted changes to tracked files), else git's note."""
    commit = code.get("commit")
    if isinstance(commit, str) and _COMMIT.match(commit):
        return commit + ("+dirty" if code.get("dirty") is True else "")
    return text(code.get("note"))


def worker_code_text(code: Mapping[str, Any]) -> str | None:
    """`workers.lora sha256:<hex>`: the code of one of orch's built-in workers; None unless the
    record has that shape."""
    worker, digest = text(code.get("worker")), code.get("sha256")
    if worker is None or not isinstance(digest, str) or not _SHA256.match(digest):
        return None
    return f"workers.{_clean(worker)[:32]} sha256:{digest}"


def orch_text(orch: Mapping[str, Any]) -> str | None:
    """`0.1.0 (commit <sha>+dirty)`, `0.1.0 (not a git checkout)`: the orch that ran the attempt."""
    version = text(orch.get("version"))
    if version is None:
        return None
    version = version[:40]
    commit = orch.get("commit")
    if isinstance(commit, str) and _COMMIT.match(commit):
        return f"{version} (commit {code_text(orch)})"
    note = text(orch.get("note"))
    return f"{version} ({note})" if note else version


def libraries_text(python: Mapping[str, Any]) -> str | None:
    """`python 3.11.7, torch 2.5.1+cu121, transformers 4.46.0`: the known libraries first, in
    LIBRARIES order, then any other (sorted); None when the versions are not known."""
    version = text(python.get("python"))
    found = _mapping(python.get("libraries"))
    if version is None and not found:
        return None
    named = {str(k)[:64]: v for k, v in list(found.items())[:MAX_LIBRARIES] if text(v) is not None}
    order = [n for n in LIBRARIES if n in named] + sorted(n for n in named if n not in LIBRARIES)
    parts = ([f"python {version}"] if version else []) + [f"{_clean(n)} {text(named[n])}" for n in order]
    return ", ".join(parts)[: 4 * MAX_TEXT_CHARS]


def _clean(name: str) -> str:
    return _UNPRINTABLE.sub("", name)


def gpu_text(gpu: Mapping[str, Any], worker: Mapping[str, Any]) -> str | None:
    if gpu.get("kind") == "simulated":
        return "simulated"
    listed = gpu.get("models")
    models = [m for m in (text(x) for x in (listed[:16] if isinstance(listed, list) else [])) if m]
    device = text(worker.get("device"))
    if models:
        return ", ".join(f"{m} ×{models.count(m)}" if models.count(m) > 1 else m for m in dict.fromkeys(models))
    return device or text(gpu.get("note"))


def data_text(data: Mapping[str, Any]) -> str | None:
    digest = data.get("sha256")
    files = _mapping(data.get("files"))
    if isinstance(digest, str) and _SHA256.match(digest):
        return f"sha256 {digest} ({len(files)} file{'s' if len(files) != 1 else ''})"
    return text(data.get("note"))


def model_text(model: Mapping[str, Any]) -> str | None:
    parts = []
    if (builtin := text(model.get("builtin"))) is not None:
        parts.append(f"built-in {builtin}")
    revision = model.get("revision")
    if isinstance(revision, str) and _COMMIT.match(revision):
        parts.append(f"revision {revision}")
    weights = model.get("weights_digest")
    if isinstance(weights, str) and _SHA256.match(weights):
        parts.append(f"weights {weights[:16]}")
    return ", ".join(parts) or text(model.get("note"))


def provenance_digest(wrapper: Mapping[str, Any] | None, worker: Mapping[str, Any] | None,
                      ended: bool = False) -> dict[str, str] | None:
    """One flat mapping of short texts (FIELDS) from the two records; pure. The worker's own
    versions win over what the wrapper read from its interpreter. Where the wrapper's note says
    our worker records them and the attempt `ended` without a record of its worker's, they were
    not recorded (a cancelled or failed attempt, say)."""
    wrapper, worker = wrapper or {}, worker or {}
    if not wrapper and not worker:
        return None
    gpu = _mapping(wrapper.get("gpu"))
    python = worker if text(worker.get("python")) else _mapping(wrapper.get("python"))
    builtin = worker_code_text(_mapping(wrapper.get("worker_code")))  # our worker's code, not its cwd's
    digest: dict[str, str | None] = {
        "code": builtin or code_text(_mapping(wrapper.get("code"))),
        "code_dir": text(_mapping(wrapper.get("worker_code")).get("package_dir"))
        if builtin
        else text(wrapper.get("cwd")),
        "orch": orch_text(_mapping(wrapper.get("orch"))),
        "python": text(python.get("python")),
        "libraries": libraries_text(python) or _note(python, ended and not worker),
        "gpu": gpu_text(gpu, worker),
        "driver": text(gpu.get("driver")),
        "cuda": text(gpu.get("cuda")),
        "cuda_runtime": text(worker.get("cuda_runtime")),
        "host": text(_mapping(wrapper.get("host")).get("name")),
        "data": data_text(_mapping(worker.get("data"))),
        "model": model_text(_mapping(worker.get("model"))),
        "recorded_by": " + ".join(
            filter(None, (text(wrapper.get("recorded_by")), text(worker.get("recorded_by"))))
        ),
    }
    return {key: value for key, value in digest.items() if value}


def _note(python: Mapping[str, Any], worker_silent: bool) -> str | None:
    note = text(python.get("note"))
    if worker_silent and note in WORKER_RECORDS:
        return "not recorded: the worker ended before writing its result.json"
    return note


def short_code(code: str) -> str:
    """A commit shortened to 12 characters (`+dirty` kept), a worker's sha256 to 16; a note as it is."""
    commit, plus, rest = code.partition("+")
    if _COMMIT.match(commit):
        return commit[:12] + plus + rest
    name, colon, digest = code.partition(" sha256:")
    return f"{name}{colon}{digest[:16]}" if colon and _SHA256.match(digest) else code


def provenance_line(digest: Mapping[str, str]) -> str:
    """The digest in one line, for `orch show`, the job page and the report."""
    parts = []
    if "code" in digest:
        parts.append(
            f"code {short_code(digest['code'])}"
            + (f" in {digest['code_dir']}" if "code_dir" in digest else "")
        )
    if "orch" in digest:
        parts.append(f"orch {digest['orch']}")
    if "libraries" in digest:
        parts.append(digest["libraries"])
    if "gpu" in digest:
        extra = ", ".join(f"{name} {digest[key]}" for name, key in (("driver", "driver"), ("CUDA", "cuda"),
                                                                    ("runtime CUDA", "cuda_runtime")) if key in digest)
        parts.append(f"GPU {digest['gpu']}" + (f" ({extra})" if extra else ""))
    for name in ("host", "data", "model"):
        if name in digest:
            value = digest[name]
            parts.append(f"{name} {value[:31] + '…' + value[71:] if name == 'data' and len(value) > 80 else value}")
    return "; ".join(parts) or "nothing recorded"
