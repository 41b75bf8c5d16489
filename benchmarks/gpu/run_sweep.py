"""A real sweep through orch on a GPU machine, with memory made scarce on purpose.

    python benchmarks/gpu/run_sweep.py --work /tmp/sweep --out OUT --tag packed --gpu-plan 6
    python benchmarks/gpu/run_sweep.py --work /tmp/sweep --out OUT --tag baseline --gpu-plan 1
    python benchmarks/gpu/run_sweep.py --dry --work /tmp/sweep-dry --out /tmp/out   # CPU, sim GPUs

What it does: toy GLUE data; a Llama of ~1.3B shape (random weights, bf16, saved once); a
`gpusweep` suite (configs x seeds, LoRA r=8 on q/k/v/o) declaring `mem_gib` far below the real
peaks; a ballast process (own session) holding all but `--leave-gib` of every card, so that the
jobs meet real CUDA OOMs; the daemon with the NVML backend; `orch status --once` frames every
`--frame-s`; NVML readings every `--sample-s` into a CSV; at the end every JSON dump, the run
dirs' small files and the daemon log in OUT/sweep-TAG.tar.gz, and a summary in
OUT/summary-TAG.json (benchmarks/gpu/analyze.py).

The suite's worker is the command-template form of `workers.lora` (as a researcher's own script
would be): for `worker: lora` orch predicts from its worst-case estimate at `max_seq_len`, which
for this short toy data is far above the real peak, so nothing would OOM.
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

import yaml

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
TERMINAL = ("succeeded", "failed", "cancelled")
# name -> config keys; level 0 of "big" needs well over the declared 4 GiB
CONFIGS: dict[str, dict[str, Any]] = {
    "big_b128": {"batch_size": 128},
    "mid_b64": {"batch_size": 64},
    "small_b16": {"batch_size": 16},
}
LLAMA_1_3B: dict[str, Any] = dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5632,
                  num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)  # fmt: skip


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


def write_plans(plans: Path, model: str, data_dir: Path, max_steps: int, mem_gib: int) -> list[str]:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    config_dir = plans / "configs" / "gpusweep"
    config_dir.mkdir(parents=True, exist_ok=True)
    peft = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}  # fmt: skip
    for name, keys in CONFIGS.items():
        config = {"model": model, "peft": peft, "data_dir": str(data_dir), "learning_rate": 3e-4,
                  "max_steps": max_steps, "prec": "bf16", "gradient_accumulation_steps": 1,
                  "gradient_checkpointing": False, "num_data_workers": 2, "max_seq_len": 256,
                  "no_save": True, **keys}  # fmt: skip
        (config_dir / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    suite = {
        "description": "real-GPU sweep of orch: declared memory far too low, ballast on the card",
        "worker": f"{sys.executable} -m workers.lora --config {{config}} --run-dir {{run_dir}}",
        "mem_gib": mem_gib, "one_token_tasks": ["glue*"], "max_attempts": 8, "hang_timeout_s": 300,
        "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)),
                **({"ORCH_WORKER_DEVICE": "cpu"} if model == "tiny-llama" else {})},
        "configs": list(CONFIGS),
    }  # fmt: skip
    (plans / "suites" / "gpusweep.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return list(CONFIGS)


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
    proc = subprocess.Popen([sys.executable, __file__, "ballast", "--leave-gib", str(leave_gib),
                             "--ready", str(ready)], start_new_session=True, env=env, cwd=REPO)  # fmt: skip
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


def sweep(args: argparse.Namespace) -> int:
    work, out = args.work.resolve(), args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    tag_dir = work / args.tag
    if tag_dir.exists():
        subprocess.run(["rm", "-rf", str(tag_dir)], check=True)
    frames = tag_dir / "frames"
    frames.mkdir(parents=True)
    db = tag_dir / "state.db"
    backend = "sim" if args.dry else "nvml"
    if args.dry:
        os.environ.update(ORCH_GPU_BACKEND="sim", ORCH_SIM_GPUS=os.environ.get("ORCH_SIM_GPUS", "1x24GiB"),
                          ORCH_SIM_DIR=str(tag_dir / "sim"), ORCH_WORKER_DEVICE="cpu")  # fmt: skip
    data_dir = work / "data"
    if not (data_dir / "RTE" / "train.tsv").exists():
        subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(data_dir),
                        "--tasks", "rte", "--n-train", "1000"], check=True, cwd=REPO)  # fmt: skip
    model = "tiny-llama"
    if not args.dry:
        model_dir = work / "llama-1.3b"
        if not (model_dir / "config.json").exists():
            started = time.monotonic()
            # in a child: a CUDA context left in this process would be foreign memory to orch
            subprocess.run(
                [sys.executable, __file__, "make-model", "--dir", str(model_dir)],
                check=True,
                cwd=REPO,
            )
            print(f"model saved in {time.monotonic() - started:.1f} s", flush=True)
        model = str(model_dir)
    plans = tag_dir / "plans"
    configs = write_plans(plans, model, data_dir, args.max_steps, args.mem_gib)
    meta: dict[str, Any] = {"tag": args.tag, "gpu_plan": args.gpu_plan, "configs": configs,
                            "seeds": args.seeds, "mem_gib": args.mem_gib, "leave_gib": args.leave_gib,
                            "headroom": args.headroom, "max_steps": args.max_steps, "dry": args.dry}  # fmt: skip
    ballast = None
    if not args.dry and args.leave_gib > 0:
        ballast, meta["ballast"] = start_ballast(work, args.leave_gib)
        print(f"ballast: {meta['ballast']}", flush=True)
    sampler = Sampler(
        backend, tag_dir / "nvml.csv", args.sample_s, ballast.pid if ballast else None
    )
    sampler.start()
    daemon = None
    try:
        for seed in range(1, args.seeds + 1):  # one submit per seed: job ids interleave the configs
            orch(["submit", "--suite", "gpusweep", "--pairs", f"{seed}:glue-tvt_rte", "--gpu-plan", args.gpu_plan,
                  "--json"], db, plans)  # fmt: skip
        meta["submitted_at"] = time.time()
        daemon = start_daemon(db, ["--backend", backend, "--poll", str(args.poll_s), "--headroom", str(args.headroom)])
        watch_sweep(db, daemon, frames, meta, args.budget_s, args.frame_s)
    finally:
        sampler.stop.set()
        sampler.join(10)
        if (daemon is not None and "finished_at" not in meta) or meta.get("incomplete"):
            orch(["cancel", "--all"], db, check=False)  # what still runs must not outlive the sweep
            time.sleep(5)
        dump(db, tag_dir, meta)
        finish(db, daemon, ballast)
        pack_out(tag_dir, out, args.tag)
    return 0


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
        if jobs and all(j["state"] in TERMINAL for j in jobs):
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


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    hold = sub.add_parser("ballast")
    hold.add_argument("--leave-gib", type=float, required=True)
    hold.add_argument("--ready", type=Path, required=True)
    sub.add_parser("make-model").add_argument("--dir", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/orch-gpu-sweep"))
    parser.add_argument("--out", type=Path, default=Path("gpu-sweep-out"))
    parser.add_argument("--tag", default="packed")
    parser.add_argument("--gpu-plan", default="6")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument(
        "--mem-gib", type=int, default=4, help="declared per-job memory (too low on purpose)"
    )
    parser.add_argument(
        "--leave-gib", type=float, default=24.0, help="memory left free on each card by the ballast"
    )
    parser.add_argument(
        "--headroom",
        type=float,
        default=0.017,
        help="of the card's total: 2.4 GiB on an H200, as 10%% of a 24 GiB card",
    )
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--frame-s", type=float, default=20.0)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--dry", action="store_true", help="CPU: sim GPUs, tiny-llama, no ballast")
    args = parser.parse_args(argv)
    # an outer `timeout` sends SIGTERM: leave through `finally` (dumps, daemon, ballast)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if args.command == "make-model":
        make_model(args.dir)
        return 0
    if args.command == "ballast":
        ballast_main(args.leave_gib, args.ready)
        return 0
    return sweep(args)


if __name__ == "__main__":
    raise SystemExit(main())
