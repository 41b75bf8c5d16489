"""TRL's `trl sft`, unchanged, through orch on one GPU with memory made scarce: 3 batch sizes × 3
seeds of one memory family, declared far too low. How many attempts OOM, and how the makespan
compares with one job at a time and with an oracle schedule that knows every true peak and the
co-location curve.

    python benchmarks/gpu/trl_sweep.py run --work /tmp/trl --out OUT --tag orch --gpu-plan 4     # GPU
    python benchmarks/gpu/trl_sweep.py run --work /tmp/trl --out OUT --tag serial --gpu-plan 1   # GPU
    python benchmarks/gpu/trl_sweep.py analyze --orch OUT/trl-orch.json --serial OUT/trl-serial.json
    python benchmarks/gpu/trl_sweep.py run --dry --work /tmp/trl-dry --out /tmp/trl-out --max-steps 2  # CPU
    python benchmarks/gpu/trl_sweep.py run --case scarce --seeds 3 --max-steps 40 --mem-gib 3
        --tag orch [--mps] [--overlap]
    python benchmarks/gpu/trl_sweep.py run --case plentiful --seeds 4 --max-steps 100 --mem-gib 3
        --tag orch [--mps]

The sweep: a Llama of about 210M parameters (hidden 1024, 12 layers, random weights, bf16) and a
word-level tokenizer saved once; 6,000 rows of 400 random words (`train.jsonl`); a suite `trl` whose
worker is the `trl sft` command line (LoRA r=16 on q/k/v/o, `--max_length 512`, bf16) reached
through `{cfg.KEY}` placeholders; configs `b64`, `b128`, `b256`: per-device batch 64/128/256 with
accumulation 4/2/1 (one effective batch of 256) × seeds 1-3, 16 steps each; `mem_gib: 2` (the true peaks are
several times that); ladder `[halve_batch]`; `min_stack_gain: 0.1`. A ballast process holds all but
`--leave-gib` (24) of the card. `run` writes OUT/trl-TAG.json (every attempt: config, level,
outcome, peak, start and end, prediction and its source; `orch memory --json`) and
OUT/sweep-trl-TAG.tar.gz (dumps, run dirs' small files, daemon log). `analyze` (no GPU) reads both
runs: OOM'd attempts per family (goal <= 1), makespan of `orch` against `serial` (goal >= 1.5x
faster) and against an oracle schedule (goal >= 0.9x): the packing simulator's oracle
(benchmarks/packing) over one card of `--leave-gib`, each job at its true peak (the largest a
succeeded attempt of its batch reached) and its solo run time (the serial run's), jobs on the card
sharing by the co-location curve that orch measured (`orch memory`, samples/s by jobs on the card,
averaged over the family's shapes). `analyze` also reports each job's slowdown when stacked: its run
time through orch over its config's run time alone (serial run), median and worst. `--case scarce`
(b256/b128, peaks that do not fit together) and `--case plentiful` (b64/b32) are the two cases of
the MPS and start-up overlap goals; `--mps` and `--overlap` start the daemon with them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, on a GPU machine

from benchmarks.gpu.sweep_common import (
    REPO,
    end_sweep,
    exit_through_finally_on_sigterm,
    fresh_tag_dir,
    orch,
    start_ballast,
    start_daemon,
    use_sim_gpus,
    watch_sweep,
)

# config -> (per-device batch, accumulation): one effective batch of 256 in every case
CASES: dict[str, dict[str, tuple[int, int]]] = {
    "family": {"b64": (64, 4), "b128": (128, 2), "b256": (256, 1)},  # one memory family, 3 sizes
    "scarce": {"b256": (256, 1), "b128": (128, 2)},  # peaks that do not fit together in 24 GiB
    "plentiful": {"b64": (64, 4), "b32": (32, 8)},  # several fit at once
}
BATCHES = {name: spec for case in CASES.values() for name, spec in case.items()}
LLAMA_210M = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
              "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 1024}  # fmt: skip
WORDS_PER_ROW = 400


def prepare(work: Path, dry: bool) -> tuple[Path, Path]:
    """The model directory (weights + tokenizer) and the data directory, made once."""
    from workers.lora.model import build_tiny_tokenizer, tiny_vocabulary

    model_dir, data_dir = work / ("llama-tiny" if dry else "llama-210m"), work / "data"
    if not (data_dir / "train.jsonl").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        words = [w for w in tiny_vocabulary() if w.isalpha()]
        rng = random.Random(0)
        with (data_dir / "train.jsonl").open("w") as handle:
            for _ in range(6000):
                handle.write(json.dumps({"text": " ".join(rng.choices(words, k=WORDS_PER_ROW))}) + "\n")
    if not (model_dir / "config.json").exists():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = build_tiny_tokenizer()
        shape: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "num_key_value_heads": 2,
                 "max_position_embeddings": 1024} if dry else LLAMA_210M  # fmt: skip
        config: Any = LlamaConfig(**shape, vocab_size=len(tokenizer), tie_word_embeddings=False,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id)  # fmt: skip
        torch.manual_seed(0)
        model: Any = LlamaForCausalLM(config)
        model = model.to(torch.bfloat16)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    return model_dir, data_dir


def trl_command() -> str:
    """`trl` as installed by `pip install --target`: its script sits in <target>/bin."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        script = Path(entry) / "bin" / "trl"
        if entry and script.is_file():
            return f"{sys.executable} {script}"
    found = shutil.which("trl")
    if found is None:
        raise SystemExit("trl is not installed: pip install --no-deps --target SITE wheels/*.whl, PYTHONPATH=SITE")
    return found


def write_plans(plans: Path, model_dir: Path, data_dir: Path, max_steps: int, mem_gib: float, dry: bool,
                case: str = "family") -> None:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "trl").mkdir(parents=True, exist_ok=True)
    for name, (batch, accumulation) in CASES[case].items():
        config = {"model": str(model_dir), "per_device_train_batch_size": batch,
                  "gradient_accumulation_steps": accumulation, "max_steps": max_steps, "lora_r": 16}  # fmt: skip
        (plans / "configs" / "trl" / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    worker = (
        f"{trl_command()} sft --model_name_or_path {{cfg.model}} --dataset_name {data_dir} "
        "--output_dir {run_dir}/out --per_device_train_batch_size {cfg.per_device_train_batch_size} "
        "--gradient_accumulation_steps {cfg.gradient_accumulation_steps} --max_steps {cfg.max_steps} "
        "--seed {seed} --learning_rate 2e-4 --use_peft --lora_r {cfg.lora_r} --lora_alpha 32 "
        "--lora_target_modules q_proj k_proj v_proj o_proj --max_length 512 --logging_steps 1 "
        "--save_strategy no --report_to none --dataloader_num_workers 0 "
        + ("--use_cpu True" if dry else "--bf16 True")
    )
    body = {"worker": worker, "mem_gib": mem_gib, "max_attempts": 6, "hang_timeout_s": 300, "min_stack_gain": 0.1,
            "keys": {"batch_size": "per_device_train_batch_size"}, "ladder": [{"halve_batch": True}],
            "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)), "HF_HUB_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            "configs": list(CASES[case])}  # fmt: skip
    (plans / "suites" / "trl.yaml").write_text(yaml.safe_dump(body, sort_keys=False))


def attempts_of(tag_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((tag_dir / "dumps" / "show").glob("*.json"), key=lambda p: int(p.stem)):
        job = json.loads(path.read_text())
        for a in job["attempts"]:
            rows.append({"job": job["id"], "config": job["config"], "seed": job["seed"], "level": a["level"],
                         "outcome": a["outcome"], "peak_mib": a["peak_mib"], "started_at": a["started_at"],
                         "ended_at": a["ended_at"], "predicted_peak_mib": a.get("predicted_peak_mib"),
                         "prediction_source": a.get("prediction_source"), "changes": a.get("changes") or {},
                         "trial_fence_mib": a.get("trial_fence_mib"),
                         "reason": a.get("reason")})
    return rows


def run(args: argparse.Namespace) -> int:
    work, out = args.work.resolve(), args.out.resolve()
    tag_dir, db = fresh_tag_dir(work, out, args.tag)
    if args.dry:
        use_sim_gpus(tag_dir, f"1x{int(args.leave_gib)}GiB", cpu_worker=False)
    model_dir, data_dir = prepare(work, args.dry)
    plans = tag_dir / "plans"
    write_plans(plans, model_dir, data_dir, args.max_steps, args.mem_gib, args.dry, args.case)
    meta: dict[str, Any] = {"tag": args.tag, "gpu_plan": args.gpu_plan, "seeds": args.seeds, "dry": args.dry,
                            "max_steps": args.max_steps, "leave_gib": args.leave_gib, "mem_gib": args.mem_gib,
                            "case": args.case, "mps": args.mps, "overlap": args.overlap,
                            "headroom": args.headroom}  # fmt: skip
    ballast = daemon = None
    try:
        if not args.dry:
            ballast, meta["ballast"] = start_ballast(work, args.leave_gib)
        pairs = ",".join(f"{seed}:sft" for seed in range(1, args.seeds + 1))
        orch(["submit", "--suite", "trl", "--pairs", pairs, "--gpu-plan", args.gpu_plan], db, plans)
        daemon = start_daemon(db, ["--backend", "sim" if args.dry else "nvml", "--poll", "0.5",
                                   "--headroom", str(args.headroom), "--headroom-max-gib", "2.4",
                                   *(["--mps"] if args.mps else []),
                                   *(["--overlap"] if args.overlap else [])])  # fmt: skip
        watch_sweep(db, daemon, tag_dir / "frames", meta, args.budget_s, 30.0)
    finally:
        end_sweep(db, tag_dir, meta, daemon, ballast)
        memory = orch(["memory", "--json"], db, check=False)
        (tag_dir / "dumps" / "memory.json").write_text(memory)
        (tag_dir / "dumps" / "memory.txt").write_text(orch(["memory"], db, check=False))
        result = {"meta": meta, "attempts": attempts_of(tag_dir),
                  "memory": json.loads(memory) if memory.strip() else None}  # fmt: skip
        (out / f"trl-{args.tag}.json").write_text(json.dumps(result, indent=2) + "\n")
        subprocess.run(["tar", "czf", str(out / f"sweep-trl-{args.tag}.tar.gz"), "-C", str(work),
                        "--exclude=*.safetensors", "--exclude=out", args.tag], check=False)  # fmt: skip
        print(json.dumps(summary(result), indent=2), flush=True)
    return 0


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: makespan, OOM'd attempts (per family: the sweep is one), per config."""
    attempts = [a for a in result["attempts"] if a["started_at"]]
    if not attempts:
        return {"error": "no attempts"}
    ends = [a["ended_at"] or a["started_at"] for a in attempts]
    per_config: dict[str, Any] = {}
    for name in CASES[result["meta"].get("case", "family")]:
        mine = [a for a in attempts if a["config"] == name]
        per_config[name] = {"attempts": len(mine), "ooms": sum(a["outcome"] == "oom" for a in mine),
                            "succeeded": sum(a["outcome"] == "succeeded" for a in mine),
                            "first_sources": sorted({str(a["prediction_source"]) for a in mine})}  # fmt: skip
    families = (result.get("memory") or {}).get("families") or []
    return {"makespan_s": round(max(ends) - min(a["started_at"] for a in attempts), 1),
            "ooms": sum(a["outcome"] == "oom" for a in attempts), "attempts": len(attempts),
            "succeeded_jobs": len({a["job"] for a in attempts if a["outcome"] == "succeeded"}),
            "per_config": per_config,
            "families": [{k: f.get(k) for k in ("name", "fixed_mib", "per_sample_mib", "error", "margin")}
                         for f in families]}  # fmt: skip


def true_batch(a: dict[str, Any]) -> int:
    """The per-device batch the attempt ran with (the ladder may have halved its config's)."""
    changed = a["changes"].get("per_device_train_batch_size")
    return int(changed) if isinstance(changed, int) else BATCHES[a["config"]][0]


def oracle_makespan_s(
    orch_run: dict[str, Any], serial_run: dict[str, Any], leave_gib: float, slots: int
) -> dict[str, Any]:
    """The packing simulator's offline oracle over one card: true peaks by batch (the largest a
    succeeded attempt reached, either run), solo run times by config (the serial run), sharing by
    the co-location curve orch measured."""
    from benchmarks.packing.daemon_policy import OraclePolicy
    from benchmarks.packing.simulator import Simulator
    from benchmarks.packing.trace import LEVELS, Trace, TraceGpu, TraceJob

    peaks: dict[int, int] = {}
    for a in orch_run["attempts"] + serial_run["attempts"]:
        if a["outcome"] == "succeeded" and a["peak_mib"]:
            peaks[true_batch(a)] = max(peaks.get(true_batch(a), 0), a["peak_mib"])
    solo: dict[str, list[float]] = {}
    for a in serial_run["attempts"]:
        if a["outcome"] == "succeeded" and a["ended_at"]:
            solo.setdefault(a["config"], []).append(a["ended_at"] - a["started_at"])
    curves: dict[int, list[float]] = {}
    for shape in (orch_run.get("memory") or {}).get("shapes", []):
        for card in shape["throughput"].values():
            for k, relative in card["relative"].items():
                curves.setdefault(int(k), []).append(float(relative))
    sharing = [0.0, 1.0]
    for k in range(2, slots + 1):  # a count never measured gains nothing over the last one measured
        sharing.append(sum(curves[k]) / len(curves[k]) if curves.get(k) else sharing[-1])
    jobs = []
    for a in {(a["job"], a["config"]): a for a in serial_run["attempts"]}.values():
        batch = BATCHES[a["config"]][0]
        if batch not in peaks or a["config"] not in solo:
            return {"error": f"no true peak or solo run time for {a['config']}"}
        minutes = sum(solo[a["config"]]) / len(solo[a["config"]]) / 60.0
        jobs.append(TraceJob(str(a["job"]), a["config"], "sft", int(a["seed"]), 0.0, (peaks[batch] * 1.0,) * LEVELS,
                             (minutes,) * LEVELS, 20.0))  # fmt: skip
    trace = Trace((TraceGpu(0, leave_gib * 1024, 0.0),), (slots,), tuple(jobs))
    result = Simulator(trace, sharing).run(OraclePolicy(trace))
    return {"makespan_s": round(result.makespan_min * 60.0, 1), "sharing": [round(x, 3) for x in sharing],
            "true_peaks_mib": dict(sorted(peaks.items())),
            "solo_s": {k: round(sum(v) / len(v), 1) for k, v in solo.items()}}  # fmt: skip


def slowdowns(orch_run: dict[str, Any], serial_run: dict[str, Any]) -> dict[str, Any]:
    """Each job's run time through orch (its succeeded attempt, start to end) over the mean run
    time of its config alone (the serial run): median and worst, and every job's."""
    solo: dict[str, list[float]] = {}
    for a in serial_run["attempts"]:
        if a["outcome"] == "succeeded" and a["ended_at"]:
            solo.setdefault(a["config"], []).append(a["ended_at"] - a["started_at"])
    per_job = {}
    for a in orch_run["attempts"]:
        if a["outcome"] == "succeeded" and a["ended_at"] and solo.get(a["config"]):
            alone = sum(solo[a["config"]]) / len(solo[a["config"]])
            per_job[str(a["job"])] = round((a["ended_at"] - a["started_at"]) / alone, 3)
    if not per_job:
        return {"error": "no job succeeded in both runs"}
    ordered = sorted(per_job.values())
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {"median": round(median, 3), "worst": ordered[-1], "per_job": per_job}


def analyze(args: argparse.Namespace) -> int:
    orch_run, serial_run = json.loads(args.orch.read_text()), json.loads(args.serial.read_text())
    ours, serial = summary(orch_run), summary(serial_run)
    slots = int(str(orch_run["meta"]["gpu_plan"]).split(",")[0])
    oracle = oracle_makespan_s(orch_run, serial_run, float(orch_run["meta"]["leave_gib"]), slots)
    # one job at a time: its makespan is the sum of the jobs' run times; where the serial run hit
    # its budget before the last job ended, that sum (mean solo time of each job's config) stands in
    expected_jobs = len(CASES[serial_run["meta"].get("case", "family")]) * int(serial_run["meta"]["seeds"])
    if serial.get("succeeded_jobs", 0) < expected_jobs and "solo_s" in oracle:
        serial["makespan_s"] = round(int(serial_run["meta"]["seeds"]) * sum(oracle["solo_s"].values()), 1)
        serial["makespan_from"] = "sum of solo run times (the serial run did not finish every job)"
    report = {"orch": ours, "serial": serial, "oracle": oracle, "slowdown": slowdowns(orch_run, serial_run),
              "speedup_vs_serial": round(serial["makespan_s"] / ours["makespan_s"], 3),
              "vs_oracle": round(oracle["makespan_s"] / ours["makespan_s"], 3) if "makespan_s" in oracle else None}
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--work", type=Path, default=Path("/tmp/orch-trl"))
    go.add_argument("--out", type=Path, default=Path("trl-out"))
    go.add_argument("--tag", default="orch")
    go.add_argument("--gpu-plan", default="4")
    go.add_argument("--seeds", type=int, default=3)
    go.add_argument("--max-steps", type=int, default=16)
    go.add_argument("--mem-gib", type=float, default=2.0, help="declared per job: far too low on purpose")
    go.add_argument("--leave-gib", type=float, default=24.0, help="memory the ballast leaves on the card")
    go.add_argument("--budget-s", type=float, default=480.0, help="then what still runs is cancelled")
    go.add_argument("--dry", action="store_true", help="CPU: sim GPUs, a tiny Llama, trl on the CPU")
    go.add_argument("--case", choices=sorted(CASES), default="family",
                    help="family: b64/b128/b256; scarce: b256/b128 (do not fit together); plentiful: b64/b32")
    go.add_argument("--mps", action="store_true", help="orch daemon run --mps")
    go.add_argument("--overlap", action="store_true", help="orch daemon run --overlap")
    go.add_argument("--headroom", type=float, default=0.1, help="orch daemon run --headroom (at most 2.4 GiB)")
    look = sub.add_parser("analyze")
    look.add_argument("--orch", type=Path, required=True)
    look.add_argument("--serial", type=Path, required=True)
    look.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    exit_through_finally_on_sigterm()
    return run(args) if args.command == "run" else analyze(args)


if __name__ == "__main__":
    raise SystemExit(main())
