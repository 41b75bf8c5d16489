"""Curves from any script, through the real daemon, tmux, SQLite and sim GPUs: a script that
prints what a Hugging Face Trainer prints has its whole loss and eval history in `orch curves`,
and a job resumed from a checkpoint reads as one curve."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_pages import ARTIFACTS, browser_missing, chromium, web_server
from tests.e2e_helpers import Orch, orch_env, requires_tmux, wait_until
from tests.script_suites import PY, write_script_suite
from tests.tiny_models import TOY_DATA_AND_TINY_LLAMA

pytestmark = requires_tmux

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
        configs = {name: {"batch_size": 16, "gradient_accumulation_steps": 1, "die_at": die_at}
                   for name, die_at in (("whole", 0), ("dies", 13))}  # fmt: skip
        worker = (
            f"{PY} trainer_like.py --out {{run_dir}}/out --die-at {{cfg.die_at}} "
            f"--resume={{resume}} --batch-size {{cfg.batch_size}} --accum {{cfg.gradient_accumulation_steps}}"
        )
        write_script_suite(env, "hf", worker, configs, max_attempts=3, ladder=["halve_batch"])
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
    assert [(r["attempt"], r["step"]) for r in each] == [
        (1, 5),
        (1, 10),
        (2, 15),
        (2, 20),
        (2, 25),
        (2, 30),
        (2, 35),
        (2, 40),
    ]
    stitched = json.loads(orch.run("curves", "--job", "2", "--stitch", "--format", "json").stdout)
    assert [(r["attempt"], r["step"]) for r in stitched if r["key"] == "loss"] == [
        (1, 5), (1, 10), *[(2, s) for s in range(15, 41, 5)]]
    listed = orch.json("jobs")
    assert [(j["metric"]["key"], j["metric"]["value"]) for j in listed] == [("eval_accuracy", 0.9)] * 2
    assert [j["metric"]["attempt"] for j in listed] == [j["attempt"] for j in listed]  # the latest reported it
    assert all(j["run_s"] > 0 for j in listed)
    plain = orch.run("jobs").stdout.splitlines()
    assert plain[0].split()[10:12] == ["metric", "time"] and plain[1].split()[10] == "eval_accuracy=0.9"
    _web_draws_them(orch)


def _web_draws_them(orch: Orch) -> None:
    """The job page draws the script's loss and eval points; /curves draws the resumed job whole,
    its resume marked, with a legend table whose toggles hide and show a run."""
    if missing := browser_missing():
        pytest.skip(missing)
    with web_server(orch) as web:
        assert web.token(), web.printed
        with chromium() as browser:
            _check_pages(browser.new_context(viewport={"width": 1280, "height": 900}).new_page(), web.url)


def _drawn(page: Any) -> Any:
    chart = page.locator('[data-chart="curves"]')
    wait_until(lambda: chart.get_attribute("data-drawn") == "yes", 30, "the curves chart")
    return chart


def _check_pages(page: Any, url: str) -> None:
    page.goto(url + "/job/1")
    chart = _drawn(page)
    assert chart.get_attribute("data-metric") == "loss" and chart.get_attribute("data-series") == "1"
    data = json.loads(chart.locator('script[type="application/json"]').text_content())
    assert data["runs"][0]["curves"]["loss"][0] == [5 * k for k in range(1, 9)]  # the 8 logged losses
    assert {"eval_accuracy", "eval_loss", "learning_rate"} <= set(data["metrics"])
    merged = page.locator(".merged-config").inner_text()
    assert "die_at: 0" in merged and "batch_size: 16" in merged and "seed: 0" in merged  # the merged config
    chart.locator("select.metric").select_option("eval_accuracy")
    wait_until(lambda: chart.get_attribute("data-metric") == "eval_accuracy", 10, "the eval curve")
    page.screenshot(path=str(ARTIFACTS / "job-curves.png"), full_page=True)

    page.goto(url + "/jobs")
    assert page.locator('tr[data-job="1"] td.metric').inner_text().split() == ["eval_accuracy", "0.9"]
    assert page.locator('tr[data-job="1"] td.run-time').inner_text().endswith("s")

    page.goto(url + "/curves?job=1&job=2")
    chart = _drawn(page)
    assert chart.get_attribute("data-series") == "2" and chart.get_attribute("data-marks") == "1"  # job 2 resumed
    data = json.loads(chart.locator('script[type="application/json"]').text_content())
    resumed = next(r for r in data["runs"] if r["key"] == "job-2")
    # its first point after the resume
    assert resumed["curves"]["loss"][0] == [5 * k for k in range(1, 9)] and resumed["marks"] == [15]
    rows = chart.locator("table.curve-legend tbody tr")
    assert rows.count() == 2 and "dies" in rows.nth(1).inner_text()
    rows.nth(0).locator("input.toggle").uncheck()
    wait_until(lambda: chart.get_attribute("data-series") == "1", 10, "the unticked run hidden")
    rows = chart.locator("table.curve-legend tbody tr")
    rows.nth(0).locator("input.toggle").check()
    wait_until(lambda: chart.get_attribute("data-series") == "2", 10, "the run shown again")
    page.screenshot(path=str(ARTIFACTS / "curves-stitched.png"), full_page=True)


# A real Hugging Face Trainer on a tiny Llama on CPU: 40 steps, a log every 5, an evaluation
# every 20 over more batches (48) than training has steps.
REAL_TRAINER = textwrap.dedent(
    """\
    import sys

    import torch
    import yaml
    from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    settings = yaml.safe_load(open(sys.argv[1])) | {"output_dir": sys.argv[2]}
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(settings, allow_extra_keys=True)

    """
) + TOY_DATA_AND_TINY_LLAMA + textwrap.dedent(
    """\
    Trainer(model=model, args=args, train_dataset=Toy(160), eval_dataset=Toy(48)).train()
    """
)


def test_a_real_trainers_printed_logs_become_its_curves(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with orch_env(tmp_path) as orch:
        (orch.root / "hf_train.py").write_text(REAL_TRAINER)
        config = {
            "per_device_train_batch_size": 4,
            "per_device_eval_batch_size": 1,
            "gradient_accumulation_steps": 1,
            "max_steps": 40,
            "logging_steps": 5,
            "eval_strategy": "steps",
            "eval_steps": 20,
            "save_strategy": "no",
            "report_to": "none",
            "use_cpu": True,
            "learning_rate": 0.001,
            "dataloader_num_workers": 0,
        }
        write_script_suite(orch, "real", f"{PY} hf_train.py {{config}} {{run_dir}}/out", {"real": config},
                           hang_timeout_s="off", keys={"batch_size": "per_device_train_batch_size"})  # fmt: skip
        orch.submit("real", "0:toy")
        orch.start_daemon()
        assert orch.wait_all_done(240) == {1: "succeeded"}, orch.run("show", "1").stdout
        rows = json.loads(orch.run("curves", "--job", "1", "--format", "json").stdout)
        assert [r["step"] for r in rows if r["key"] == "loss"] == [5 * k for k in range(1, 9)]
        assert [r["step"] for r in rows if r["key"] == "eval_loss"] == [20, 40]  # at the training step, not batch 48
        assert {"learning_rate", "grad_norm", "train_loss"} <= {r["key"] for r in rows}
