"""What the GPU sweeps (run_sweep, gla_sweep, learn_sweep, trl_sweep) share: running `orch`
on a sweep's database, its work folder, simulated GPUs for --dry, the toy data, the ballast
that makes memory scarce, the NVML sampler, the daemon, watching the sweep to its end, and the
dumps and tarball it leaves. They run on a GPU machine (or on the CPU with --dry).

    python -m benchmarks.gpu.sweep_common make-model --dir DIR   # the Llama of 1.3B shape
    python -m benchmarks.gpu.sweep_common ballast --leave-gib 24 --ready FILE
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import TERMINAL_VALUES

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
LLAMA_1_3B: dict[str, Any] = dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5632,
                  num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)  # fmt: skip


def exit_through_finally_on_sigterm() -> None:
    """An outer `timeout` sends SIGTERM: leave through `finally` (dumps, daemon, ballast)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def fresh_tag_dir(work: Path, out: Path, tag: str) -> tuple[Path, Path]:
    """The sweep's own folder under `work` (emptied, with `frames/`) and its state.db path;
    `out` is made too."""
    tag_dir = work / tag
    if tag_dir.exists():
        subprocess.run(["rm", "-rf", str(tag_dir)], check=True)
    (tag_dir / "frames").mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    return tag_dir, tag_dir / "state.db"


def use_sim_gpus(tag_dir: Path, gpus: str, cpu_worker: bool = True) -> None:
    """--dry: simulated cards (ORCH_SIM_GPUS syntax) for the daemon and its workers."""
    os.environ.update(ORCH_GPU_BACKEND="sim", ORCH_SIM_GPUS=gpus, ORCH_SIM_DIR=str(tag_dir / "sim"))
    if cpu_worker:
        os.environ["ORCH_WORKER_DEVICE"] = "cpu"


def sample_rte(work: Path, n_train: int) -> Path:
    """Toy GLUE RTE data of `n_train` examples in `work/data`, made once."""
    data_dir = work / "data"
    if not (data_dir / "RTE" / "train.tsv").exists():
        subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(data_dir),
                        "--tasks", "rte", "--n-train", str(n_train)], check=True, cwd=REPO)  # fmt: skip
    return data_dir


def llama_1_3b(work: Path) -> str:
    """The Llama of 1.3B shape in `work/llama-1.3b`, made once, in a child: a CUDA context left
    in this process would be foreign memory to orch."""
    model_dir = work / "llama-1.3b"
    if not (model_dir / "config.json").exists():
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "benchmarks.gpu.sweep_common", "make-model", "--dir",
                        str(model_dir)], check=True, cwd=REPO)  # fmt: skip
        print(f"model saved in {time.monotonic() - started:.1f} s", flush=True)
    return str(model_dir)


def orch(args: list[str], db: Path, plans: Path | None = None, check: bool = True) -> str:
    env = {**os.environ, "ORCH_DB": str(db), "COLUMNS": "160"}
    if plans is not None:
        env["ORCH_PLANS"] = str(plans)
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"orch {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def make_model(directory: Path) -> None:
    """A random ~1.3B Llama in bf16 plus the toy word-level tokenizer, built on the GPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.lora.model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(**LLAMA_1_3B, tie_word_embeddings=False, use_cache=False,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model: Any = LlamaForCausalLM(config)
        model = model.to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    del model
    torch.cuda.empty_cache()


def ballast_main(leave_gib: float, ready: Path) -> None:
    """Hold all but `leave_gib` of every visible card until killed (foreign memory for orch)."""
    import torch

    held = []
    report = []
    for index in range(torch.cuda.device_count()):
        torch.zeros(1, device=f"cuda:{index}")  # the context first: it is not ours to hand out
        free_b, total_b = torch.cuda.mem_get_info(index)
        hold_b = max(0, free_b - int(leave_gib * GIB))
        held.append(torch.empty(hold_b, dtype=torch.uint8, device=f"cuda:{index}"))
        report.append({"index": index, "held_mib": hold_b // 2**20, "total_mib": total_b // 2**20,
                       "free_after_mib": torch.cuda.mem_get_info(index)[0] // 2**20})  # fmt: skip
    ready.write_text(json.dumps({"pid": os.getpid(), "cards": report}))
    while True:
        signal.pause()


def start_ballast(work: Path, leave_gib: float) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    ready = work / "ballast.json"
    ready.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu.sweep_common", "ballast",
                             "--leave-gib", str(leave_gib), "--ready", str(ready)],
                            start_new_session=True, env=env, cwd=REPO)  # fmt: skip
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ballast did not start (exit {proc.poll()})")
        time.sleep(0.2)
    return proc, json.loads(ready.read_text())


class Sampler(threading.Thread):
    """GPU memory every `period_s` through orch's own probe, into a CSV."""

    def __init__(self, backend: str, path: Path, period_s: float, ballast_pid: int | None) -> None:
        super().__init__(daemon=True)
        from orchestrator.gpu import make_probe

        state_dir = Path(os.environ["ORCH_SIM_DIR"]) if backend == "sim" else None
        self.probe = make_probe(backend, state_dir)
        self.path, self.period_s, self.ballast_pid = path, period_s, ballast_pid
        self.stop = threading.Event()

    def run(self) -> None:
        with self.path.open("w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow(
                [
                    "t_s",
                    "gpu",
                    "used_mib",
                    "free_mib",
                    "total_mib",
                    "util_pct",
                    "ballast_mib",
                    "n_procs",
                ]
            )
            while not self.stop.is_set():
                now = time.time()
                for s in self.probe.snapshot():
                    ballast = s.memory_of({self.ballast_pid}) if self.ballast_pid else 0
                    out.writerow([f"{now:.2f}", s.index, s.used_mib, s.free_mib, s.total_mib,
                                  s.utilization_pct, ballast, len(s.processes)])  # fmt: skip
                handle.flush()
                self.stop.wait(self.period_s)


def start_daemon(db: Path, options: list[str]) -> subprocess.Popen[bytes]:
    """`orch daemon run` on `db` in a session of its own, writing into the database's daemon log."""
    log = open(str(db) + ".daemon.log", "ab")  # noqa: SIM115  (the daemon writes it until it exits)
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "daemon", "run", "--db", str(db), *options],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
    )  # fmt: skip


def watch_sweep(
    db: Path, daemon: subprocess.Popen[bytes], frames: Path, meta: dict[str, Any], budget_s: float, frame_s: float
) -> None:
    """Until every job has ended (or the budget or the daemon ran out): a status frame every
    `frame_s`, and a last one at the end. Records `finished_at`, or why it stopped early."""
    deadline = time.monotonic() + budget_s
    next_frame, n_frame = 0.0, 0
    while True:
        if time.monotonic() >= next_frame:
            frame = orch(["status", "--once"], db, check=False)
            (frames / f"frame_{n_frame:02d}.txt").write_text(frame)
            print(frame, flush=True)
            n_frame, next_frame = n_frame + 1, time.monotonic() + frame_s
        jobs = json.loads(orch(["jobs", "--json"], db))
        if jobs and all(j["state"] in TERMINAL_VALUES for j in jobs):
            break
        if time.monotonic() > deadline or daemon.poll() is not None:
            meta["incomplete"] = "deadline" if daemon.poll() is None else f"daemon exited {daemon.poll()}"
            break
        time.sleep(1.0)  # polling the sweep's progress
    meta["finished_at"] = time.time()
    (frames / f"frame_{n_frame:02d}_final.txt").write_text(orch(["status", "--once"], db, check=False))


def finish(
    db: Path, daemon: subprocess.Popen[bytes] | None, ballast: subprocess.Popen[bytes] | None
) -> None:
    """Stop the daemon, its private tmux server (and any window left) and the ballast."""
    from orchestrator.daemon.state import tmux_socket_name

    if daemon is not None:
        orch(["daemon", "stop", "--timeout", "20"], db, check=False)
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
    subprocess.run(
        ["tmux", "-L", tmux_socket_name(db), "kill-server"], capture_output=True, check=False
    )
    if ballast is not None:
        os.killpg(ballast.pid, signal.SIGKILL)
        ballast.wait(30)


def pack_out(tag_dir: Path, out: Path, tag: str) -> None:
    tarball = out / f"sweep-{tag}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tag_dir, arcname=f"sweep-{tag}", filter=_small_files)
    from benchmarks.gpu.analyze import analyze

    summary = analyze(tag_dir)
    (out / f"summary-{tag}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        json.dumps({k: v for k, v in summary.items() if k != "attribution"}, indent=2), flush=True
    )


def dump(db: Path, tag_dir: Path, meta: dict[str, Any]) -> None:
    dumps = tag_dir / "dumps"
    (dumps / "show").mkdir(parents=True, exist_ok=True)
    jobs_text = orch(["jobs", "--json"], db, check=False)
    (dumps / "jobs.json").write_text(jobs_text)
    for job in json.loads(jobs_text or "[]"):
        (dumps / "show" / f"{job['id']}.json").write_text(
            orch(["show", str(job["id"]), "--json"], db, check=False)
        )
    (dumps / "status.json").write_text(orch(["status", "--json"], db, check=False))
    (dumps / "meta.json").write_text(json.dumps(meta, indent=2))


def _small_files(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Everything but models, adapters and the sim's memory files; big logs are cut."""
    parts = Path(info.name).parts
    if "adapter" in parts or "sim" in parts or info.name.endswith((".safetensors", ".bin")):
        return None
    return info if info.size < 4 * 2**20 else None


def end_sweep(db: Path, tag_dir: Path, meta: dict[str, Any], daemon: subprocess.Popen[bytes] | None,
              ballast: subprocess.Popen[bytes] | None) -> None:
    """Cancel what still runs (nothing may outlive the sweep), dump the sweep's state and stop the
    daemon, its tmux server and the ballast."""
    if (daemon is not None and "finished_at" not in meta) or meta.get("incomplete"):
        orch(["cancel", "--all"], db, check=False)
        time.sleep(5)  # the cancelled workers' ends reach the database
    dump(db, tag_dir, meta)
    finish(db, daemon, ballast)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    hold = sub.add_parser("ballast")
    hold.add_argument("--leave-gib", type=float, required=True)
    hold.add_argument("--ready", type=Path, required=True)
    sub.add_parser("make-model").add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "make-model":
        make_model(args.dir)
    else:
        ballast_main(args.leave_gib, args.ready)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
