"""`orch status` and the web page read a card from one place (store.status.cards_now): a
multi-GPU attempt counts on every card it holds in both, with what it holds on each card."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptPlan, start_attempt, update_attempt
from orchestrator.store.daemon_row import register_daemon, write_heartbeat
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.web_queries import overview
from tests.store_reads import job_ids

PLANS = Path(__file__).resolve().parents[1] / "plans"


def _card(index: int, used_mib: int) -> dict[str, object]:
    return {"index": index, "uuid": f"GPU-{index}", "name": "sim 24GiB", "total_mib": 24576,
            "used_mib": used_mib, "free_mib": 24576 - used_mib, "utilization_pct": None, "processes": []}


def test_a_gang_counts_on_every_card_in_orch_status_and_on_the_web_page(db_path: Path) -> None:
    suite = load_suite("demo", PLANS)
    with Store(db_path) as store:
        submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0),
                    allowed_gpus=None, priority=0, force=False, dry_run=False)
        job_id = job_ids(store)[0]
        plan = AttemptPlan(job_id, 0, "GPU-0", 0, "base", {}, {}, False, 4096,
                           PredictionSource(SourceKind.DECLARED), 4096, gpu_uuids=("GPU-0", "GPU-1"))
        attempt = start_attempt(store, plan, lambda n: db_path.parent / f"run-{n}")
        update_attempt(store, attempt.id, held_mib=3000, held_by_gpu_json=json.dumps({"GPU-0": 3000, "GPU-1": 2000}))
        register_daemon(store, 1, 0.0, 0.0, lambda pid, created: None)
        write_heartbeat(store, 1.0, [_card(0, 3500), _card(1, 2500), _card(2, 0)], None)

        status = {g["uuid"]: (g["running"], g["orch_mib"], g["foreign_mib"]) for g in status_snapshot(store)["gpus"]}
        web = {g.uuid: (g.running, g.orch_mib, g.foreign_mib) for g in overview(store).gpus}

    assert status == web == {"GPU-0": (1, 3000, 500), "GPU-1": (1, 2000, 500), "GPU-2": (0, 0, 0)}
