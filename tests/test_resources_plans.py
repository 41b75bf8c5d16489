"""`gpus:`, `cpus:` and `host_mem_gib` in suites and configs, `{nproc}`/`{port}` in templates,
the host readings and the pass's view of multi-GPU attempts. Pure or file-only: no tmux, no db."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rows_helpers import attempt_of

from orchestrator.errors import PlanError
from orchestrator.gpu.host import SimHost, sim_topology
from orchestrator.plans.resources import job_resources
from orchestrator.plans.suite import expand_jobs, load_suite
from orchestrator.plans.template import parse_template
from orchestrator.rundir_files import write_json
from orchestrator.scheduling.resources import (
    free_port,
    host_state,
    predict_host_mib,
    running_attempts,
)
from workers.sim import hold_host


def _suite(tmp_path: Path, suite: dict, config: dict) -> Path:
    (tmp_path / "suites").mkdir()
    (tmp_path / "configs" / "s").mkdir(parents=True)
    (tmp_path / "configs" / "s" / "c.yaml").write_text(yaml.safe_dump({"sim_mem_gib": 4, **config}))
    (tmp_path / "suites" / "s.yaml").write_text(
        yaml.safe_dump({"worker": "sim", "mem_gib": 4, "configs": ["c"], **suite})
    )
    return tmp_path


def test_gpus_and_cpus_come_from_the_config_else_the_suite(tmp_path: Path) -> None:
    from orchestrator.plans.inputs import Pair

    suite = load_suite("s", _suite(tmp_path, {"gpus": 2, "cpus": 8}, {}))
    (spec,) = expand_jobs(suite, [Pair(1, "glue_rte")], {}, None, 1)
    assert (spec.gpus, spec.cpus) == (2, 8)
    (spec,) = expand_jobs(suite, [Pair(1, "glue_rte")], {"gpus": 4}, None, 1)
    assert spec.gpus == 4
    assert job_resources({}, 1, None, "x") == (1, None)


@pytest.mark.parametrize("bad", [0, -1, 65, "2", 1.5, True])
def test_bad_gpu_counts_are_refused_with_the_key_named(tmp_path: Path, bad: object) -> None:
    with pytest.raises(PlanError, match="`gpus` must be a whole number from 1 to 64"):
        load_suite("s", _suite(tmp_path, {"gpus": bad}, {}))


def test_bad_config_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="`cpus` must be"):
        load_suite("s", _suite(tmp_path, {}, {"cpus": 0}))
    with pytest.raises(PlanError, match="`host_mem_gib` must be"):
        job_resources({"host_mem_gib": "lots"}, 1, None, "config c")


def test_nproc_and_port_are_template_names() -> None:
    template = parse_template("torchrun --nproc_per_node={nproc} --master_port={port} t.py")
    assert template.fill({"nproc": "2", "port": "41234"}, {}) == [
        "torchrun", "--nproc_per_node=2", "--master_port=41234", "t.py"]
    with pytest.raises(PlanError):
        parse_template("torchrun --nnodes={nodes} t.py")


def test_a_gang_attempt_is_one_running_attempt_per_card() -> None:
    row = {"job_id": 3, "gpu_index": 2, "gpu_uuid": "U2", "gpu_uuids_json": json.dumps(["U2", "U3"]),
           "held_by_gpu_json": json.dumps({"U2": 100, "U3": 200}), "held_mib": 200,
           "predicted_peak_mib": 500, "reached_peak": 0, "run_alone": 0}
    assert attempt_of(**row).cards == ("U2", "U3")
    ranks = running_attempts([attempt_of(**row)], {"U2": 2, "U3": 3}, lambda a: 99.0)
    assert [(r.gpu_index, r.held_mib, r.expected_end_s) for r in ranks] == [(2, 100, 99.0), (3, 200, 99.0)]
    assert attempt_of(**{**row, "gpu_uuid": "U1", "gpu_uuids_json": "not json"}).cards == ("U1",)


def test_host_prediction_and_state() -> None:
    assert predict_host_mib(5000, 7000, 9000) == (5000, "measured")
    assert predict_host_mib(None, 7000, 6000) == (7000, "declared")
    assert predict_host_mib(None, 7000, None) == (7000, "running")
    assert predict_host_mib(None, None, None) == (0, "unknown")
    from orchestrator.gpu.host import HostSnapshot

    live = [attempt_of(job_id=1, reached_peak=0, predicted_host_mib=4000, host_held_mib=1000),
            attempt_of(job_id=2, reached_peak=1, predicted_host_mib=4000, host_held_mib=1000)]
    state = host_state(HostSnapshot(32000, 20000, 16), 2000, live, {1: 4, 2: None}, True)
    assert (state.available_mib, state.total_mib, state.free_cpus) == (15000, 30000, 12)


def test_sim_host_counts_what_sim_workers_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("ORCH_SIM_DIR", str(tmp_path))
    monkeypatch.setenv("ORCH_SIM_HOST", "16GiB")
    held = hold_host({"sim_host_gib": 10})
    assert held is not None
    host = SimHost(tmp_path, 16 * 1024)
    assert host.snapshot().available_mib == 6 * 1024
    assert host.tree_mib([os.getpid()]) == 10 * 1024
    held.release()
    assert host.snapshot().available_mib == 16 * 1024
    # another process holding 10 GiB: 8 more do not fit, as the kernel would refuse them
    write_json(
        tmp_path / "host" / "foreign-test.json",
        {"pid": 0, "used_mib": 10 * 1024, "create_time": 0},
        parents=True,
    )
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator: can't allocate memory"):
        hold_host({"sim_host_gib": 8})


def test_sim_topology_pairs_and_free_ports() -> None:
    topology = sim_topology(4)
    assert topology[(0, 1)] < topology[(1, 2)] and topology[(2, 3)] == topology[(0, 1)]
    port = free_port(set())
    assert 0 < port < 65536


def test_status_shows_host_ram_ours_others_free() -> None:
    from orchestrator.api.status_snapshot import host_summary
    from orchestrator.cli.status.rich_view import host_line

    summary = host_summary({"total_mib": 65536, "available_mib": 9728, "ours_mib": 40960, "reserve_mib": 2048})
    assert summary == {
        "total_mib": 65536,
        "ours_mib": 40960,
        "others_mib": 14848,
        "free_mib": 9728,
        "reserve_mib": 2048,
    }
    text = host_line(summary).plain
    assert "ours 40.0 GiB" in text and "others 14.5 GiB" in text and "free 9.5 GiB" in text
    assert host_summary(None) is None and host_summary({"total_mib": "x"}) is None
