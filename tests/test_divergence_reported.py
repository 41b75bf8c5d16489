"""Divergence judged from every loss record a run leaves, through the real daemon, tmux, SQLite
and sim GPUs: a few printed losses, the reported history (progress.jsonl, no loss printed) and
a worker's own `loss_summary` in result.json (what the LoRA worker writes) each flag a run whose
loss rose finitely, marked ♯ in `orch results`."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.attempts.divergence import LossTrack, summarise_losses, verdict
from tests.e2e_helpers import Orch, orch_env, requires_tmux

PY = shlex.quote(sys.executable)
SCRIPT = textwrap.dedent(
    """\
    import json
    import os
    import sys

    how, run_dir = sys.argv[1], sys.argv[2]
    result = {"status": "succeeded", "metrics": {"test": {"accuracy": 0.5}}}
    if how == "printed":  # five losses, 1e4 to 1e8, and a result.json
        for step in range(5):
            print(str({"loss": 10.0 ** (4 + step), "epoch": (step + 1) / 5}), flush=True)
        result["final_loss"] = 1e8
    elif how == "reported":  # progress.jsonl only, as the LoRA worker writes it: nothing printed
        with open(os.path.join(run_dir, "progress.jsonl"), "a") as handle:
            for step in range(1, 21):
                handle.write(json.dumps({"step": step, "total": 20, "loss": 24.4 * 3.0 ** step}) + "\\n")
    elif how == "summary":  # a worker's own summary of its losses
        result["loss_summary"] = {"initial": 24.4, "minimum": 20.0, "final": 5.2e9, "steps": 30,
                                  "final_steps": 10, "nonfinite": False}
    with open(os.path.join(run_dir, "result.json"), "w") as handle:
        json.dump(result, handle)
    """
)


def test_a_short_run_is_judged_on_every_reading_as_the_lora_worker_judges_it() -> None:
    rising = [10.0 ** (4 + step) for step in range(5)]
    track = LossTrack()
    for loss in rising:
        track.add(loss)
    assert track.summary() == summarise_losses(rising)
    assert verdict(track.summary()) == "final loss 1e+08 above the first steps' 1e+04"
    falling = LossTrack()
    for loss in (2.0, 1.5, 1.2, 1.0, 0.9):
        falling.add(loss)
    assert verdict(falling.summary()) is None


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        yield env


@requires_tmux
def test_every_record_of_a_finitely_rising_loss_flags_the_run(orch: Orch) -> None:
    (orch.root / "train.py").write_text(SCRIPT)
    config_dir = orch.plans / "configs" / "loss"
    config_dir.mkdir(parents=True)
    for how in ("printed", "reported", "summary"):
        (config_dir / f"{how}.yaml").write_text(yaml.safe_dump({"how": how}))
    (orch.plans / "suites" / "loss.yaml").write_text(
        yaml.safe_dump(
            {
                "worker": f"{PY} train.py {{cfg.how}} {{run_dir}}",
                "mem_gib": 1,
                "configs": ["printed", "reported", "summary"],
            }
        )
    )
    orch.submit("loss", "1:toy")
    orch.start_daemon()
    assert set(orch.wait_all_done(90).values()) == {"succeeded"}
    rows = {row["config"]: row for row in orch.json("results")}
    for how in ("printed", "reported", "summary"):
        assert rows[how]["diverged"] == 1 and "♯" in rows[how]["marks"], (
            how,
            json.dumps(rows[how]),
        )
    assert rows["printed"]["runs"][0]["diverged"] == "final loss 1e+08 above the first steps' 1e+04"
    assert (
        rows["summary"]["runs"][0]["diverged"] == "final loss 5.2e+09 above the first steps' 24.4"
    )
