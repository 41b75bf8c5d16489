"""The curves page's address: `?by=config` (and task, seed, setting) colours by what it names,
a `by` that names nothing is said on the page, and `&metric=eval_accuracy` picks the metric drawn
first, so a shared link can point at the eval curve."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.web_load import build_sweep
from orchestrator.store import Store

starlette = pytest.importorskip("starlette", reason="needs the web extra")


@pytest.fixture
def client(db_path: Path) -> Iterator[Any]:
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    build_sweep(db_path, 30, running=2, queued=4)
    with Store(db_path) as store, store.write():  # jobs 1 and 2 also reported an eval accuracy
        for row in store.query("SELECT id FROM attempts WHERE job_id IN (1, 2)"):
            store.execute(
                "INSERT OR REPLACE INTO metric_history (attempt_id, key, step, value) "
                "VALUES (?, 'eval_accuracy', 10, 0.8)",
                [row["id"]],
            )
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as test_client:
        yield test_client


def page(client: Any, query: str) -> tuple[str, dict[str, Any]]:
    text = client.get(f"/curves?{query}").text
    found = re.search(r'<script type="application/json">(.*?)</script>', text, re.S)
    assert found, text
    return text, json.loads(found.group(1))


def test_by_config_task_and_seed_colour_by_the_jobs_own_fields(client: Any, db_path: Path) -> None:
    with Store(db_path) as store:
        jobs = {
            r["id"]: r
            for r in store.query("SELECT id, config_name, data, seed FROM jobs WHERE id <= 8")
        }
    picked = "&".join(f"job={i}" for i in jobs)
    for by, field in (("config", "config_name"), ("task", "data"), ("seed", "seed")):
        text, spec = page(client, f"{picked}&by={by}")
        assert "names nothing" not in text
        colour_of: dict[str, str] = {}
        for run in spec["runs"]:
            job = jobs[int(run["key"].removeprefix("job-"))]
            assert f" · {by}={job[field]} · " in run["label"]  # its band stays its setting's (run["group"])
            assert colour_of.setdefault(str(job[field]), run["colour"]) == run["colour"]
        assert (
            len(set(colour_of.values()))
            == len(colour_of)
            == len({str(j[field]) for j in jobs.values()})
        )
        assert f'<option value="{by}" selected>' in text


def test_a_by_that_names_nothing_is_said_and_the_runs_keep_their_colours(client: Any) -> None:
    text, spec = page(client, "job=1&job=2&job=3&by=nonsense")
    assert "colour by &#39;nonsense&#39; names nothing" in text
    assert (
        len({r["colour"] for r in spec["runs"]}) == 3
    )  # coloured by config and task, not all alike


def test_the_metric_in_the_address_is_the_one_drawn(client: Any) -> None:
    text, spec = page(client, "job=1&job=2&metric=eval_accuracy")
    assert spec["metric"] == "eval_accuracy" and "eval_accuracy" in spec["metrics"]
    assert '<input type="hidden" name="metric" value="eval_accuracy">' in text
    text, spec = page(client, "job=3&metric=eval_accuracy")
    assert "no picked run reported &#39;eval_accuracy&#39;: showing loss" in text
    assert page(client, "job=1")[1]["metric"] == "loss"
