"""A foreign script's sweep of one memory family, declared far too low, end to end: CLI, daemon,
tmux, SQLite, sim GPUs. The family probes one job on the card, then its fit sizes the rest."""

from __future__ import annotations

import shlex
import sys

import pytest
from e2e_helpers import Orch, requires_tmux

pytestmark = [requires_tmux, pytest.mark.tmux]

PY = shlex.quote(sys.executable)
# A command template, not one of orch's workers: orch knows none of its memory keys.
FOREIGN = f"{PY} -m workers.sim --config {{config}} --run-dir {{run_dir}}"


SIM_GPUS = "1x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


def _overlap(attempts: list[dict]) -> int:  # type: ignore[type-arg]
    """The most attempts that ran at once."""
    edges = sorted([(a["started_at"], 1) for a in attempts] + [(a["ended_at"], -1) for a in attempts])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.slow
def test_a_family_declared_far_too_low_fills_one_card_with_at_most_two_ooms(orch: Orch) -> None:
    # peak = 1 GiB + 7 GiB × batch / 256: 2.75, 4.5, 6.25 and 8 GiB, two seeds each; declared
    # 0.25 GiB. At the declared figure, all eight would start at once on the 24 GiB card and OOM.
    configs = {
        f"b{batch}": {"batch_size": batch, "sim_mem_gib": 8, "sim_base_gib": 1, "sim_reference_batch": 256,
                      "sim_seconds": 4, "sim_ramp_s": 0.5}
        for batch in (64, 128, 192, 256)
    }
    orch.write_suite("fam", configs, worker=FOREIGN, mem_gib=0.25)
    orch.submit("fam", "1:glue_rte,2:glue_rte", "--gpu-plan", "8")
    orch.start_daemon()
    assert set(orch.wait_all_done(150).values()) == {"succeeded"}
    attempts = orch.attempts()
    ooms = [a for a in attempts if a["outcome"] == "oom"]
    assert len(ooms) <= 2, [(a["job_id"], a["predicted_peak_mib"], a["prediction_source"]) for a in attempts]
    sources = [a["prediction_source"] for a in attempts]
    assert any(s.startswith("family fit") for s in sources), sources
    assert _overlap([a for a in attempts if a["outcome"] == "succeeded"]) >= 2  # probed, then stacked
    shown = orch.run("memory").stdout
    assert "fam: b64, b128, b192, b256 (tiny-llama): fit " in shown and "error" in shown, shown
    (family,) = orch.json("memory")["families"]
    assert len(family["points"]) == 4 and family["error"] < 0.05, family
