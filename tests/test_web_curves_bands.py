"""A seed band on the curves page pools exactly the runs a row of `orch results` pools: seeds of
one effective setting and task. Jobs of one config name whose config file was edited between
submits are two bands (named by their settings' digests), with `?by=` too, and no seed is dropped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.web_load import build_sweep
from orchestrator.store import Store

pytest.importorskip("starlette", reason="needs the web extra")


def _sweep(db_path: Path) -> None:
    """Jobs 1-4: config c01 on rte, seeds 1-4; job 4's file said another learning rate."""
    build_sweep(db_path, 6, running=0, queued=0)
    with Store(db_path) as store, store.write():
        for job_id in range(1, 5):
            learning_rate = 1e-3 if job_id == 4 else 1e-4
            store.execute(
                "UPDATE jobs SET config_name = 'c01', data = 'glue-tvt_rte', seed = ?, config_json = ? WHERE id = ?",
                [job_id, json.dumps({"learning_rate": learning_rate, "seed": job_id, "data": "glue-tvt_rte"}), job_id],
            )
            attempt = store.query("SELECT max(id) AS id FROM attempts WHERE job_id = ?", [job_id])[0]["id"]
            for step in (10, 20):
                store.execute(
                    "INSERT OR REPLACE INTO metric_history (attempt_id, key, step, value) VALUES (?, ?, ?, ?)",
                    [attempt, "loss", step, 1.0 / job_id],
                )


def _bands(client: Any, query: str) -> list[dict[str, Any]]:
    text = client.get(f"/curves?{query}").text
    found = re.search(r'<script type="application/json">(.*?)</script>', text, re.S)
    assert found, text
    return list(json.loads(found.group(1))["bands"]["loss"])


def test_a_band_never_pools_runs_whose_settings_differ(db_path: Path) -> None:
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    _sweep(db_path)
    picked = "job=1&job=2&job=3&job=4&metric=loss&band=1"
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        for query in (picked, picked + "&by=config", picked + "&by=task"):
            bands = sorted(_bands(client, query), key=lambda band: band["n"])
            assert [band["n"] for band in bands] == [1, 3], (query, bands)
            assert bands[1]["mean"] == pytest.approx([(1 + 1 / 2 + 1 / 3) / 3] * 2)
            assert bands[0]["mean"] == pytest.approx([1 / 4] * 2)
            assert all(re.search(r"E1/c01 · glue-tvt_rte · setting [0-9a-f]{8}$", band["label"]) for band in bands)
            assert bands[0]["label"] != bands[1]["label"]
        alike = _bands(client, "job=1&job=2&metric=loss&band=1")
        assert [band["label"] for band in alike] == ["E1/c01 · glue-tvt_rte"]  # no digest where none is needed


def test_overrides_the_suite_calls_not_science_never_split_a_band(db_path: Path) -> None:
    """As they never split a results row (`not_science: [output_dir]`): each seed wrote elsewhere."""
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    _sweep(db_path)
    with Store(db_path) as store, store.write():
        for job_id in range(1, 4):
            store.execute("UPDATE jobs SET overrides_json = ?, not_science_json = ? WHERE id = ?",
                          [json.dumps({"output_dir": f"out/{job_id}"}), json.dumps(["output_dir"]), job_id])
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        (band,) = _bands(client, "job=1&job=2&job=3&metric=loss&band=1")
    assert band["n"] == 3 and band["label"] == "E1/c01 · glue-tvt_rte"
