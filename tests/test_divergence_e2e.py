"""A script whose loss blows up, run through the real daemon, tmux, SQLite and sim GPUs: marked
in results from the losses orch parsed from its output, or failed under `fail_on_divergence`."""

from __future__ import annotations

import shlex
import sys
import textwrap

import yaml

from tests.e2e_helpers import Orch, requires_tmux

pytestmark = requires_tmux

PY = shlex.quote(sys.executable)
SCRIPT = textwrap.dedent(
    """\
    import json
    import sys

    rate = float(sys.argv[1])  # < 1: the loss falls; > 1: it blows up
    loss = 0.7
    for step in range(1, 41):
        loss *= rate
        print(str({"loss": round(loss, 6), "learning_rate": 0.001, "epoch": step / 40}), flush=True)
    print(json.dumps({"test_accuracy": 0.5 if rate > 1 else 0.7}))
    """
)




def write_suite(orch: Orch, name: str, **suite: object) -> None:
    config_dir = orch.plans / "configs" / name
    config_dir.mkdir(parents=True, exist_ok=True)
    for config, rate in (("calm", 0.97), ("wild", 1.6)):
        (config_dir / f"{config}.yaml").write_text(yaml.safe_dump({"rate": rate}))
    body = {"worker": f"{PY} train.py {{cfg.rate}}", "mem_gib": 1, "max_attempts": 3, **suite,
            "configs": ["calm", "wild"]}
    (orch.plans / "suites" / f"{name}.yaml").write_text(yaml.safe_dump(body))


def test_a_diverging_script_is_marked_or_failed(orch: Orch) -> None:
    (orch.root / "train.py").write_text(SCRIPT)
    write_suite(orch, "marked")
    write_suite(orch, "strict", fail_on_divergence=True)
    orch.submit("marked", "1:toy,2:toy")
    orch.submit("strict", "1:toy")
    orch.start_daemon()
    states = orch.wait_all_done(120)
    jobs = {(j["suite"], j["config"], j["seed"]): j for j in orch.json("jobs")}
    assert jobs[("strict", "wild", 1)]["state"] == "failed"
    assert {k: j["state"] for k, j in jobs.items() if k != ("strict", "wild", 1)} == dict.fromkeys(
        [("marked", "calm", 1), ("marked", "calm", 2), ("marked", "wild", 1), ("marked", "wild", 2),
         ("strict", "calm", 1)], "succeeded"), states
    failed = orch.json("show", str(jobs[("strict", "wild", 1)]["id"]))
    (attempt,) = failed["attempts"]  # never retried: it would diverge again
    assert attempt["reason"].startswith("diverged: final loss") and "(fail_on_divergence)" in attempt["reason"]

    rows = {(r["suite"], r["config"]): r for r in orch.json("results")}
    wild, calm = rows[("marked", "wild")], rows[("marked", "calm")]
    assert wild["diverged"] == 2 and "♯" in wild["marks"] and calm["diverged"] == 0 and "♯" not in calm["marks"]
    assert all(run["diverged"].startswith("final loss") for run in wild["runs"])
    table = orch.run("results", "--suite", "marked", "--format", "markdown").stdout
    assert "♯ a run's loss diverged" in table
    shown = orch.json("show", str(jobs[("marked", "wild", 1)]["id"]))
    assert shown["attempts"][0]["diverged"].startswith("final loss")
    assert shown["attempts"][0]["loss"]["steps"] == 40
