"""Curves from any script, through the real daemon, tmux, SQLite and sim GPUs: a script that
prints what a Hugging Face Trainer prints has its whole loss and eval history in `orch curves`,
and a job resumed from a checkpoint reads as one curve."""

from __future__ import annotations

import csv
import io
import json
import shlex
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e_helpers import Orch, orch_env, requires_tmux

pytestmark = requires_tmux

PY = shlex.quote(sys.executable)

# A Trainer's output: tqdm's bar on stderr (redrawn with \r), log dicts every 5 steps and eval
# dicts every 20 on stdout, the summary dict; 40 steps. `--resume DIR` continues from DIR's step;
# without it, a first run with --die-at N saves checkpoint-10 and dies of a CUDA OOM at step N.
TRAINER_LIKE = textwrap.dedent(
    """\
    import argparse, json, sys
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--resume", default="")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--accum", type=int)
    args = parser.parse_args()
    steps, step = 40, 0
    if args.resume:
        step = json.loads((Path(args.resume) / "state.json").read_text())["step"]
    while step < steps:
        step += 1
        sys.stderr.write(f"\\r {100 * step // steps}%|####  | {step}/{steps} [00:01<00:02,  9.00it/s]")
        if step % 5 == 0:
            print({"loss": round(3.0 - step / 20, 4), "grad_norm": 1.25, "learning_rate": 5e-05 * (1 - step / steps),
                   "epoch": round(step / steps, 2)})
        if step % 20 == 0:
            for k in range(1, 5):
                sys.stderr.write(f"\\r{k}/4 [00:00<00:00, 20.00it/s]")
            print({"eval_loss": 2.5 - step / 40, "eval_accuracy": 0.5 + step / 100, "eval_runtime": 0.2,
                   "epoch": round(step / steps, 2)})
        if step == 10 and not args.resume:
            (args.out / "checkpoint-10").mkdir(parents=True)
            (args.out / "checkpoint-10" / "state.json").write_text(json.dumps({"step": 10}))
        if step == args.die_at and not args.resume:
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", file=sys.stderr)
            sys.exit(1)
    print({"train_runtime": 4.0, "train_samples_per_second": 80.0, "train_loss": 2.0, "epoch": 1.0})
    print(json.dumps({"eval_accuracy": 0.9}))
    """
)


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        (env.root / "trainer_like.py").write_text(TRAINER_LIKE)
        config_dir = env.plans / "configs" / "hf"
        config_dir.mkdir(parents=True)
        for name, die_at in (("whole", 0), ("dies", 13)):
            (config_dir / f"{name}.yaml").write_text(yaml.safe_dump({"batch_size": 16, "gradient_accumulation_steps": 1, "die_at": die_at}))
        worker = f"{PY} trainer_like.py --out {{run_dir}}/out --die-at {{cfg.die_at}} --resume={{resume}} --batch-size {{cfg.batch_size}} --accum {{cfg.gradient_accumulation_steps}}"
        suite = {"worker": worker, "mem_gib": 1, "max_attempts": 3, "ladder": ["halve_batch"], "configs": ["whole", "dies"]}
        (env.plans / "suites" / "hf.yaml").write_text(yaml.safe_dump(suite))
        yield env


def test_a_trainer_like_scripts_history_is_exported_whole_and_a_resumed_job_stitched(orch: Orch) -> None:
    orch.submit("hf", "0:toy")
    orch.start_daemon()
    assert orch.wait_all_done(120) == {1: "succeeded", 2: "succeeded"}, orch.run("show", "2").stdout

    rows = json.loads(orch.run("curves", "--job", "1", "--format", "json").stdout)
    loss = [r for r in rows if r["key"] == "loss"]
    assert [r["step"] for r in loss] == [5 * k for k in range(1, 9)]
    assert loss[0]["value"] == 2.75 and {r["job"] for r in rows} == {1} and {r["attempt"] for r in rows} == {1}
    assert [(r["step"], r["value"]) for r in rows if r["key"] == "eval_accuracy"] == [(20, 0.7), (40, 0.9)]
    assert {"eval_loss", "learning_rate", "grad_norm"} <= {r["key"] for r in rows}
    table = list(csv.DictReader(io.StringIO(orch.run("curves", "--job", "1", "--key", "loss").stdout)))
    assert list(table[0]) == ["job", "attempt", "step", "key", "value"]
    assert [int(r["step"]) for r in table] == [5 * k for k in range(1, 9)]

    attempts = orch.json("show", "2")["attempts"]
    assert [a["outcome"] for a in attempts] == ["oom", "succeeded"]
    each = json.loads(orch.run("curves", "--job", "2", "--key", "loss", "--format", "json").stdout)
    assert [(r["attempt"], r["step"]) for r in each] == [(1, 5), (1, 10), (2, 15), (2, 20), (2, 25), (2, 30), (2, 35), (2, 40)]
    stitched = json.loads(orch.run("curves", "--job", "2", "--stitch", "--format", "json").stdout)
    assert [(r["attempt"], r["step"]) for r in stitched if r["key"] == "loss"] == [
        (1, 5), (1, 10), *[(2, s) for s in range(15, 41, 5)]]
