"""A prediction above every card must not strand a job in the queue."""

from __future__ import annotations

import pytest
from e2e_helpers import Orch, requires_tmux

SIM_GPUS = "1x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


@requires_tmux
@pytest.mark.tmux
def test_declared_memory_above_every_card_is_capped_and_the_job_runs(orch: Orch) -> None:
    # The suite author declared 40 GiB on a machine of 24 GiB cards; the job really needs 3.
    orch.write_suite("big", {"big": {"sim_mem_gib": 3, "sim_seconds": 1}}, mem_gib=40)
    orch.submit("big", "1:a")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "succeeded"}
    (attempt,) = orch.attempts(1)
    assert attempt["prediction_source"] == "declared, capped at the largest card"
    # 24 GiB less the default headroom (10% of the card, 2.4 GiB): it fits an empty card.
    assert attempt["predicted_peak_mib"] == 24 * 1024 - int(0.10 * 24 * 1024)
