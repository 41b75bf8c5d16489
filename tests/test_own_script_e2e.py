"""Scripts not written for orch, run through the real daemon, tmux, SQLite and sim GPUs: flags
from the ladder, progress from stdout, alive while printing, metrics from what they print."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_helpers import Orch, requires_tmux, wait_until
from tests.script_suites import PY, write_script_suite
from tests.tiny_models import TOY_DATA_AND_TINY_LLAMA

pytestmark = requires_tmux

# A researcher's argparse script: tqdm bar on stderr, Trainer-style log dicts, a JSON line at the
# end; out of memory above micro-batch 16, printed as torch prints its exception.
ARGPARSE_SCRIPT = textwrap.dedent(
    """\
    import argparse
    import json
    import time

    from tqdm import tqdm

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--step-s", type=float, default=0.4)
    args = parser.parse_args()
    print(f"batch_size={args.batch_size} grad_accum={args.grad_accum} lr={args.lr} "
          f"checkpointing={args.gradient_checkpointing}", flush=True)
    if args.batch_size > 16:
        # torch's exception as torch prints it, without importing torch: on a busy machine that
        # import alone outlasted the 5 s hang timeout and the attempt was killed as hung
        OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
        raise OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
            "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.58 GiB memory "
            "in use. Of the allocated memory 21.90 GiB is allocated by PyTorch, and 212.35 MiB is "
            "reserved by PyTorch but unallocated."
        )
    loss = 2.0
    bar = tqdm(total=args.steps)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_s)
        loss *= 0.95
        bar.update(1)
        bar.set_postfix(loss=round(loss, 4))
        if step % 5 == 0:
            tqdm.write(str({"loss": f"{loss:.4f}", "learning_rate": f"{args.lr:.2e}",
                            "epoch": f"{step / args.steps:.2f}"}))
    bar.close()
    print(json.dumps({"eval_accuracy": 0.81, "eval_loss": round(loss, 4)}))  # the validation split
    print(json.dumps({"test_accuracy": 0.79}))
    """
)

# Hugging Face Trainer reading its TrainingArguments from the attempt's config.yaml.
TRAINER_SCRIPT = textwrap.dedent(
    """\
    import json
    import sys

    import torch
    from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    (args,) = HfArgumentParser(TrainingArguments).parse_yaml_file(sys.argv[1], allow_extra_keys=True)
    print(f"per_device_train_batch_size={args.per_device_train_batch_size} "
          f"gradient_accumulation_steps={args.gradient_accumulation_steps}", flush=True)
    if args.per_device_train_batch_size > 4:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")

    """
) + TOY_DATA_AND_TINY_LLAMA + textwrap.dedent(
    """\
    trainer = Trainer(model=model, args=args, train_dataset=Toy(32), eval_dataset=Toy(32))
    trainer.train()
    print(trainer.evaluate())  # a Python dict: the validation split's eval_*
    print(trainer.predict(Toy(32)).metrics)  # the test split's test_*
    """
)




def write_own_suite(orch: Orch, worker: str, config: dict[str, Any], **suite: Any) -> None:
    write_script_suite(orch, "own", worker, {"own": config}, max_attempts=4, **suite)


def running_progress(orch: Orch) -> dict[str, Any] | None:
    for entry in orch.json("status")["running"]:
        progress = entry.get("progress") or {}
        if entry["attempt"] == 2 and (progress.get("step") or 0) >= 3:
            return progress
    return None


def test_argparse_script_flags_progress_liveness_results(orch: Orch) -> None:
    (orch.root / "train.py").write_text(ARGPARSE_SCRIPT)
    hang_timeout_s = 5
    worker = (f"{PY} train.py --batch-size {{cfg.batch_size}} --grad-accum {{cfg.gradient_accumulation_steps}} "
              "--lr {cfg.learning_rate}")
    write_own_suite(orch, worker, {"batch_size": 32, "gradient_accumulation_steps": 1, "learning_rate": 0.001},
                    hang_timeout_s=hang_timeout_s)
    orch.submit("own", "87:glue-tvt_rte")
    orch.start_daemon()

    progress = wait_until(lambda: running_progress(orch), 90, "step 3 of the second attempt in status --json")
    assert progress["total"] == 25 and progress["source"] == "stdout"
    assert isinstance(progress.get("loss"), float)

    assert orch.wait_all_done(90) == {1: "succeeded"}
    shown = orch.json("show", "1")
    first, second = shown["attempts"]
    assert first["outcome"] == "oom" and "out of memory" in (first["reason"] or "").lower()
    # The checkpointing rung never reaches this script (no {config}, no {cfg.gradient_checkpointing}):
    # it is skipped, and level 1 halves the batch, which the script receives as flags.
    assert second["outcome"] == "succeeded"
    assert second["changes"] == {"batch_size": 16, "gradient_accumulation_steps": 2}
    log = Path(second["log"]).read_text()
    assert "batch_size=16 grad_accum=2 lr=0.001 checkpointing=False" in log
    ran_s = second["ended_at"] - second["started_at"]
    assert ran_s > hang_timeout_s, f"ran {ran_s:.1f} s"  # longer than the hang timeout, never killed
    assert not [e for e in shown["events"] if e["kind"] == "hung" or "silent for" in e["message"]]
    assert "gradient_checkpointing" not in orch.run("show", "1").stdout

    results = orch.json("results")
    assert [(r["metric"], r["mean"], r["n_seeds"], r["val_mean"]) for r in results] == [("accuracy", 0.79, 1, 0.81)]
    # its samples/s, from the steps it printed, is learned like an orch worker's (alone on the card)
    rates = [entry["throughput"] for entry in orch.json("memory")["shapes"] if entry["throughput"]]
    assert rates and all("1" in curve["samples_per_s"] for t in rates for curve in t.values())


def test_trainer_script_reads_training_arguments_from_config_yaml(orch: Orch) -> None:
    (orch.root / "hf_train.py").write_text(TRAINER_SCRIPT)
    config = {
        "output_dir": str(orch.root / "hf-out"), "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
        "max_steps": 6, "logging_steps": 2, "report_to": "none", "use_cpu": True, "save_strategy": "no",
        "learning_rate": 0.001, "dataloader_num_workers": 0,
    }
    write_own_suite(
        orch, f"{PY} hf_train.py {{config}}", config, hang_timeout_s="off",
        keys={"batch_size": "per_device_train_batch_size", "checkpointing": "gradient_checkpointing",
              "data_workers": "dataloader_num_workers"},
        ladder=["halve_batch", "checkpointing"],
    )
    orch.submit("own", "1:toy")
    orch.start_daemon()
    assert orch.wait_all_done(240) == {1: "succeeded"}
    first, second = orch.json("show", "1")["attempts"]
    assert first["outcome"] == "oom"
    assert second["changes"] == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    received = yaml.safe_load((Path(second["run_dir"]) / "config.yaml").read_text())
    assert received["per_device_train_batch_size"] * received["gradient_accumulation_steps"] == 8
    assert "batch_size" not in received  # orch's own name never leaks into the script's config
    assert "per_device_train_batch_size=4 gradient_accumulation_steps=2" in Path(second["log"]).read_text()
    results = orch.json("results")
    assert [r["metric"] for r in results] == ["loss"] and results[0]["mean"] > 0 and results[0]["val_mean"] > 0


CUSTOM_SCRIPT = textwrap.dedent(
    """\
    import sys
    import time

    import os

    for it in range(1, 16):
        time.sleep(0.3)
        print(f"[rank{it % 2}] it {it} of 15 | l={2.0 / it:.3f}", flush=True)
        # at step 5 it waits (saying so as a step line, so it is alive) until the test has read
        # its progress: under load a short run could end before the test's first look
        deadline = time.monotonic() + 120
        while it == 5 and not os.path.exists("release") and time.monotonic() < deadline:
            time.sleep(0.5)
            print(f"[rank{it % 2}] it {it} of 15 | l={2.0 / it:.3f}", flush=True)
    print("final test acc=0.905 (best)", flush=True)
    """
)


def test_suite_regexes_for_progress_and_results(orch: Orch) -> None:
    (orch.root / "custom.py").write_text(CUSTOM_SCRIPT)
    write_own_suite(
        orch, f"{PY} custom.py --lr {{cfg.learning_rate}}", {"learning_rate": 0.1}, hang_timeout_s=3,
        progress_regex=r"it (?P<step>\d+) of (?P<total>\d+) \| l=(?P<loss>[0-9.]+)",
        result_regex=r"final test acc=(?P<accuracy>[0-9.]+)",
    )
    orch.submit("own", "5:mytask")
    orch.start_daemon()

    def regex_progress() -> dict[str, Any] | None:
        running = orch.json("status")["running"]
        progress = (running[0].get("progress") or {}) if running else {}
        return progress if (progress.get("step") or 0) >= 3 else None

    progress = wait_until(regex_progress, 60, "progress parsed by the suite's progress_regex")
    (orch.root / "release").touch()
    assert progress["total"] == 15 and progress["loss"] == pytest.approx(2.0 / progress["step"], abs=1e-3)
    assert orch.wait_all_done(60) == {1: "succeeded"}
    assert [(r["metric"], r["mean"]) for r in orch.json("results")] == [("accuracy", 0.905)]
