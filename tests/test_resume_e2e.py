"""Resume, don't restart: an attempt after an OOM continues from the checkpoint its predecessor
left, through the real daemon, tmux, SQLite and sim GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_helpers import REPO_ROOT, Orch, requires_tmux, wait_until
from tests.script_suites import PY, write_script_suite
from tests.tiny_models import TOY_DATA_AND_TINY_LLAMA

pytestmark = requires_tmux

# A script with Hugging Face's checkpoint layout (OUT/checkpoint-N): the first run saves step 3,
# plants a symlinked "checkpoint-99" pointing out of its run dir, and dies of a CUDA OOM; a
# run given --resume=DIR continues from DIR's step.
RESUMABLE_SCRIPT = textwrap.dedent(
    """\
    import argparse
    import json
    import os
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--accum", type=int, required=True)
    parser.add_argument("--resume", default=None)
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    if args.rest:
        sys.exit(f"unexpected arguments: {args.rest}")
    step = 0
    if args.resume is not None:
        step = json.loads((Path(args.resume) / "state.json").read_text())["step"]
        print(f"resuming from {args.resume} at step {step}", flush=True)
    else:
        print("fresh start", flush=True)
    while step < 6:
        step += 1
        print(f"step {step}/6", flush=True)
        if step == 3 and args.resume is None:
            folder = args.out / "checkpoint-3"
            folder.mkdir(parents=True)
            (folder / "state.json").write_text(json.dumps({"step": 3}))
            outside = args.out.parents[3] / "elsewhere" / "checkpoint-99"
            outside.mkdir(parents=True)
            (outside / "state.json").write_text(json.dumps({"step": 99}))
            os.symlink(outside, args.out / "checkpoint-99")
            if args.batch_size > 8:
                print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", file=sys.stderr)
                sys.exit(1)
    print(json.dumps({"eval_accuracy": 0.75, "steps_run": step}))
    """
)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True




def test_retry_after_oom_resumes_from_the_checkpoint_of_attempt_1(orch: Orch) -> None:
    (orch.root / "resumable.py").write_text(RESUMABLE_SCRIPT)
    worker = (f"{PY} resumable.py --out {{run_dir}}/out --batch-size {{cfg.batch_size}} "
              "--accum {cfg.gradient_accumulation_steps} --resume={resume}")
    write_script_suite(orch, "own", worker, {"own": {"batch_size": 16, "gradient_accumulation_steps": 1}},
                       max_attempts=3, ladder=["halve_batch"])  # fmt: skip
    orch.submit("own", "3:toy")
    orch.start_daemon()
    assert orch.wait_all_done(90) == {1: "succeeded"}

    shown = orch.json("show", "1")
    first, second = shown["attempts"]
    assert first["outcome"] == "oom" and first["resumed_from"] is None
    checkpoint = str(Path(first["run_dir"]) / "out" / "checkpoint-3")  # never the symlinked checkpoint-99
    assert second["resumed_from"] == {"attempt": 1, "checkpoint": checkpoint}
    assert "fresh start" in Path(first["log"]).read_text()  # no empty --resume= on a first attempt
    log = Path(second["log"]).read_text()
    assert f"resuming from {checkpoint} at step 3" in log and "step 4/6" in log and "step 1/6" not in log
    assert second["changes"] == {"batch_size": 8, "gradient_accumulation_steps": 2}
    text = orch.run("show", "1").stdout
    assert f"attempt 2: resumed from attempt 1's checkpoint {checkpoint}" in text
    assert any("resuming from attempt 1's checkpoint-3" in e["message"] for e in shown["events"])
    received = yaml.safe_load((Path(second["run_dir"]) / "config.yaml").read_text())
    assert "resume_from_checkpoint" not in received  # it opted in through {resume} alone


def start_a_150_step_lora_job(orch: Orch, tmp_path: Path, **suite: Any) -> None:
    """The LoRA worker's tiny Llama on CPU, 150 steps with a checkpoint every 3, one job; the
    daemon started."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    data_dir = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(data_dir), "--tasks", "rte",
                    "--n-train", "40", "--n-dev", "16"], check=True, cwd=REPO_ROOT, capture_output=True)  # fmt: skip
    config = {"model": "tiny-llama", "data_dir": str(data_dir), "max_steps": 150, "batch_size": 4,
              "checkpoint_every_steps": 3, "num_data_workers": 0, "prec": "fp32", "max_seq_len": 64,
              "no_save": True}  # fmt: skip
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    orch.write_suite("lora", {"tiny": config}, worker="lora", mem_gib=2,
                     env={"ORCH_WORKER_DEVICE": "cpu", "PYTHONPATH": python_path}, **suite)  # fmt: skip
    orch.submit("lora", "1:glue-tvt_rte")
    orch.start_daemon()


def test_lora_worker_killed_after_a_checkpoint_resumes_from_it(orch: Orch, tmp_path: Path) -> None:
    start_a_150_step_lora_job(orch, tmp_path)

    def first_checkpoint() -> tuple[Path, int] | None:
        rows = orch.attempts(1)
        if not rows or rows[0]["pgid"] is None:
            return None
        run_dir = Path(rows[0]["run_dir"])
        return (run_dir, int(rows[0]["pgid"])) if any(run_dir.glob("checkpoint-*/state.json")) else None

    first_dir, pgid = wait_until(first_checkpoint, 90, "attempt 1's first checkpoint")
    os.killpg(pgid, signal.SIGKILL)  # the attempt dies with its wrapper: nothing recorded, as on a lost node
    wait_until(lambda: not _group_alive(pgid), 30, "attempt 1's process group to be gone")
    # a kill between a save's rename and the removal of the older one leaves two: the highest is the latest
    checkpoint = max(first_dir.glob("checkpoint-*"), key=lambda p: int(p.name.removeprefix("checkpoint-")))
    assert orch.wait_all_done(120) == {1: "succeeded"}

    first, second = orch.json("show", "1")["attempts"]
    assert first["outcome"] == "lost"
    assert second["resumed_from"] == {"attempt": 1, "checkpoint": str(checkpoint)}
    assert not list(first_dir.glob("checkpoint-*"))  # the job succeeded: attempt 1's checkpoints are removed
    received = yaml.safe_load((Path(second["run_dir"]) / "config.yaml").read_text())
    assert received["resume_from_checkpoint"] == str(checkpoint)
    step = int(checkpoint.name.removeprefix("checkpoint-"))
    assert f"resumed from {checkpoint}: step {step} of 150" in Path(second["log"]).read_text()
    beats = [json.loads(line) for line in (Path(second["run_dir"]) / "progress.jsonl").read_text().splitlines()]
    assert beats[0]["step"] == step + 1 and beats[-1]["step"] == 150
    assert json.loads((Path(second["run_dir"]) / "result.json").read_text())["steps"] == 150


# A Hugging Face Trainer script: TrainingArguments from config.yaml, output_dir below the run dir.
# Out of memory at step 3 while the micro-batch is above 4 (after checkpoint-2 was saved).
TRAINER_SCRIPT = textwrap.dedent(
    """\
    import json
    import sys

    import torch
    import yaml
    from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                              TrainingArguments)

    settings = yaml.safe_load(open(sys.argv[1])) | {"output_dir": sys.argv[2]}
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(settings, allow_extra_keys=True)


    class Report(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            print(f"train begins at global step {state.global_step}", flush=True)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3 and args.per_device_train_batch_size > 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")

    """
) + TOY_DATA_AND_TINY_LLAMA + textwrap.dedent(
    """\
    trainer = Trainer(model=model, args=args, train_dataset=Toy(64), callbacks=[Report()])
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    print(json.dumps({"global_step": trainer.state.global_step}))
    """
)


def test_trainer_script_resumes_through_resume_from_checkpoint_in_config_yaml(orch: Orch) -> None:
    pytest.importorskip("transformers")
    (orch.root / "hf_resume.py").write_text(TRAINER_SCRIPT)
    config = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": 6,
              "save_strategy": "steps", "save_steps": 2, "logging_steps": 1, "report_to": "none",
              "use_cpu": True, "learning_rate": 0.001, "dataloader_num_workers": 0}  # fmt: skip
    write_script_suite(
        orch,
        "hf",
        f"{PY} hf_resume.py {{config}} {{run_dir}}/out",
        {"hf": config},
        max_attempts=3,
        hang_timeout_s="off",
        ladder=["halve_batch"],
        keys={
            "batch_size": "per_device_train_batch_size",
            "resume_from_checkpoint": "resume_from_checkpoint",
        },
    )
    orch.submit("hf", "0:toy")
    orch.start_daemon()
    assert orch.wait_all_done(240) == {1: "succeeded"}

    first, second = orch.json("show", "1")["attempts"]
    assert (
        first["outcome"] == "oom"
        and "resume_from_checkpoint" not in (Path(first["run_dir"]) / "config.yaml").read_text()
    )
    checkpoint = Path(first["run_dir"]) / "out" / "checkpoint-2"
    assert not checkpoint.exists() and (Path(first["run_dir"]) / "out").is_dir()  # removed once the job succeeded
    assert second["resumed_from"] == {"attempt": 1, "checkpoint": str(checkpoint)}
    received = yaml.safe_load((Path(second["run_dir"]) / "config.yaml").read_text())
    assert received["resume_from_checkpoint"] == str(checkpoint)
    assert received["per_device_train_batch_size"] == 4 and received["gradient_accumulation_steps"] == 2
    log = Path(second["log"]).read_text()
    assert "train begins at global step 2" in log and '{"global_step": 6}' in log


@pytest.mark.parametrize("share_base", ["off", "sequential"])
def test_lora_worker_sigkilled_after_a_checkpoint_resumes_without_orch_retry(
    orch: Orch, tmp_path: Path, share_base: str
) -> None:
    """The worker alone is SIGKILLed (an admin, or the kernel's OOM killer where its word cannot
    be read): its wrapper records the signal and no OOM evidence. With a checkpoint left, that is
    a death: the job resumes from it on its own, and the retry does not use up max_attempts (1).
    `off`: the worker trains in its own process. `sequential`: the killed process is the thin
    client, and the warm process goes on with the job until it notices; the next attempt waits
    for that job to stop before it resumes (docs/lora-worker.md)."""
    start_a_150_step_lora_job(orch, tmp_path, max_attempts=1, share_base=share_base)

    def worker_with_a_checkpoint() -> tuple[Path, int] | None:
        rows = orch.attempts(1)
        if not rows:
            return None
        run_dir = Path(rows[0]["run_dir"])
        try:
            child = json.loads((run_dir / "pid.json").read_text()).get("child_pid")
        except (OSError, ValueError):
            return None
        return (run_dir, int(child)) if child and any(run_dir.glob("checkpoint-*/state.json")) else None

    first_dir, worker_pid = wait_until(worker_with_a_checkpoint, 90, "attempt 1's worker and first checkpoint")
    os.kill(worker_pid, signal.SIGKILL)  # the worker only: its wrapper lives on and records the signal
    assert orch.wait_all_done(120) == {1: "succeeded"}, Path(orch.attempts(1)[-1]["run_dir"], "stdout.log").read_text()

    shown = orch.json("show", "1")
    first, second = shown["attempts"]
    assert first["outcome"] == "lost" and first["reason"].startswith("killed by SIGKILL without OOM evidence")
    assert json.loads((first_dir / "exit.json").read_text())["signal"] == signal.SIGKILL
    assert second["resumed_from"] is not None and second["resumed_from"]["attempt"] == 1
    checkpoint = Path(second["resumed_from"]["checkpoint"])
    assert checkpoint.parent == first_dir and second["level"] == first["level"] == 0
    result = json.loads((Path(second["run_dir"]) / "result.json").read_text())
    # the one orch named, or, where the old warm job's last save removed it, a later one of that run said so
    used = Path(result.get("resumed_from_checkpoint", checkpoint))
    assert used == checkpoint or (used.parent == first_dir and str(checkpoint) in result["resume_note"])
    step = int(used.name.removeprefix("checkpoint-"))
    assert f"resumed from {used}: step {step} of 150" in Path(second["log"]).read_text()
    assert result["steps"] == 150
    assert result.get("share_base") == (None if share_base == "off" else "sequential")


# Saves a checkpoint and then SIGKILLs itself (no OOM evidence): `same` saves checkpoint-10
# every time, `higher` ten steps past the one it resumed from; `ok` succeeds at once.
DYING_SCRIPT = textwrap.dedent(
    """\
    import argparse
    import json
    import os
    import signal
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    if args.mode == "ok":
        print(json.dumps({"eval_accuracy": 0.5}))
        raise SystemExit(0)
    step = int(Path(args.resume).name.removeprefix("checkpoint-")) if args.resume else 0
    save = 10 if args.mode == "same" else step + 10
    folder = args.out / f"checkpoint-{save}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"step": save}))
    print(f"saved step {save}; resumed from {args.resume}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_deaths_with_checkpoints_end_within_the_resume_cap_and_the_queue_moves_on(
    orch: Orch,
) -> None:
    (orch.root / "dying.py").write_text(DYING_SCRIPT)
    worker = f"{PY} dying.py --out {{run_dir}}/out --mode {{cfg.mode}} --resume={{resume}}"
    configs = {"same": {"mode": "same"}, "higher": {"mode": "higher"}}
    # 20 GiB a job on two 24 GiB cards: the two dying jobs hold both cards while they run
    write_script_suite(orch, "dying", worker, configs, mem_gib=20, max_attempts=3, max_resumes=2)
    write_script_suite(orch, "after", worker, {"ok": {"mode": "ok"}}, mem_gib=20)
    orch.submit("dying", "1:toy")
    orch.submit("after", "1:toy 2:toy 3:toy")
    orch.start_daemon()
    states = orch.wait_all_done(240)
    same, higher = (orch.json("show", str(job_id)) for job_id in (1, 2))
    assert (same["config"], higher["config"]) == ("same", "higher")
    assert states == {1: "failed", 2: "failed", 3: "succeeded", 4: "succeeded", 5: "succeeded"}

    # checkpoint-10 again and again: one resume (attempt 1 got somewhere), then no progress:
    # each death counts, 3 of them at most
    assert (same["resumes"], same["counted_attempts"], same["attempt"]) == (1, 3, 4)
    assert "checkpoint is left to resume from" in same["reason"]
    # a higher step each time: resumed at most twice, then failed saying why
    assert (higher["resumes"], higher["attempt"]) == (2, 3)
    assert "after 2 resumes from a checkpoint" in higher["reason"]
    assert "max_resumes: 2" in higher["reason"]
    assert higher["max_attempts"] == 3 and same["max_attempts"] == 3  # the limit never grew
    steps = [a["resumed_from"]["checkpoint"].rsplit("-", 1)[1] for a in higher["attempts"][1:]]
    assert steps == ["10", "20"]
    shown = orch.run("show", "2").stdout
    assert "attempt 1 of at most 3 (3 in all), resume 2 of at most 2" in shown
