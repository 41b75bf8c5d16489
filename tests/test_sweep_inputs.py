"""What a sweep is given, checked before anything is queued: `Sweep`'s arguments as the CLI's
options are, grid values as values, a grid's size before it is built, suite files without
repeated keys or control characters, keys the worker command never receives, inline configs and
seeds without tasks; and a bad priority already stored fails its job, not every pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import orchestrator.submit.core as submit_core
from orchestrator.actions.user_actions import Done, cancel_job
from orchestrator.api import Sweep
from orchestrator.errors import OrchError, PlanError, UsageError
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.scheduling.dispatch import DispatchContext, schedule
from orchestrator.scheduling.packing.types import PackingPolicy
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store import Store
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queries import get_job
from tests.conftest import REPO_ROOT, OrchRunner
from tests.test_scale import _Recorder

SIM = {"learning_rate": 0.0001, "batch_size": 8, "name": "base", "sim_seconds": 1}


def write_plans(
    root: Path, suites: dict[str, Any], configs: dict[str, dict[str, Any]] | None = None
) -> Path:
    (root / "suites").mkdir(parents=True, exist_ok=True)
    for suite, body in suites.items():
        text = body if isinstance(body, str) else yaml.safe_dump(body)
        (root / "suites" / f"{suite}.yaml").write_text(text)
        (root / "configs" / suite).mkdir(parents=True, exist_ok=True)
        for name, content in (configs or {"base": SIM}).items():
            (root / "configs" / suite / f"{name}.yaml").write_text(yaml.safe_dump(content))
    return root


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    plans = write_plans(
        tmp_path / "plans", {"s": {"worker": "sim", "mem_gib": 1, "configs": ["base"]}}
    )
    return Sweep(tmp_path / "state.db", plans=plans)


# ------------------------------------------------------------------ Sweep's arguments


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], priority="high"),
            "priority 'high' is not a whole number",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], priority=2.5),
            "priority 2.5 is not a whole number",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], priority=10**30),
            "is not a whole number between -1000 and 1000",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], priority=None),
            "priority None is not a whole number",
        ),
        (lambda s: s.submit("s", pairs=[1]), "pairs: 1 is not one SEED:DATA pair"),
        (lambda s: s.submit(5, pairs=["1:glue_rte"]), "suite must be a string, not 5"),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], grid={"learning_rate": 0.1}),
            "must be a non-empty list of values",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], grid={"learning_rate": "0.1"}),
            "must be a non-empty list",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], sets={"name": {"a": 1}}),
            "is not one scalar value",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], sets={"name": [1, 2]}),
            "holds several values: use grid=",
        ),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], sets={"name=x": 1}),
            "'name=x' is not a config key name",
        ),
        (lambda s: s.submit("s", pairs=["1:glue_rte 2:glue_rte"]), "is not one SEED:DATA pair"),
        (
            lambda s: s.submit("s", pairs=["1:glue_rte"], dry_run="yes"),
            "dry_run must be True or False",
        ),
        (lambda s: s.curves(jobs="12"), "jobs must be a list of job ids"),
        (lambda s: s.curves(jobs=[True]), "True is not a job id"),
        (lambda s: s.curves(keys="loss"), "keys must be a list of names"),
        (lambda s: s.cancel("12"), "jobs must be a list of job ids"),
        (lambda s: s.retry([0]), "0 is not a job id"),
        (lambda s: s.jobs(as_frame="no"), "as_frame must be True or False"),
        (lambda s: s.wait([1], poll_s=0), "poll_s must be above 0"),
        (lambda s: Sweep(3), "db must be a path"),
    ],
)
def test_sweep_refuses_a_wrong_argument_in_one_line_and_writes_nothing(
    sweep: Sweep, call: Any, message: str
) -> None:
    with pytest.raises(UsageError) as refused:
        call(sweep)
    assert message in str(refused.value) and len(str(refused.value).splitlines()) == 1
    assert not sweep.db_path.exists()


def test_a_grid_value_is_one_value_whatever_it_holds(sweep: Sweep) -> None:
    rows = sweep.submit("s", pairs=["1:glue_rte"], grid={"name": ["a,b", "c"]}, as_frame=False)
    assert [json.loads(r["setting"].split("=", 1)[1]) for r in rows] == ["a,b", "c"]
    rows = sweep.submit(
        "s",
        pairs=["1:glue_rte"],
        sets={"name": "x,y z"},
        grid={"learning_rate": [1, 3e-4]},
        as_frame=False,
    )
    assert [r["setting"] for r in rows] == [
        'learning_rate=1.0 name="x,y z"',
        'learning_rate=0.0003 name="x,y z"',
    ]
    with Store(sweep.db_path) as store:
        assert [get_job(store, r["job"]).priority for r in rows] == [0, 0]


def test_the_store_refuses_a_priority_that_is_not_a_whole_number(tmp_path: Path) -> None:
    suite = load_suite("demo", REPO_ROOT / "plans")
    specs = expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0)
    with Store(tmp_path / "state.db") as store:
        for bad in ("high", 2.5, None, True):
            with pytest.raises(OrchError, match="is not a whole number"):
                submit_jobs(
                    store,
                    suite,
                    specs,
                    allowed_gpus=None,
                    priority=bad,
                    force=False,  # type: ignore[arg-type]
                    dry_run=False,
                )
        assert store.query("SELECT COUNT(*) AS n FROM jobs")[0]["n"] == 0


def test_a_pass_fails_a_job_whose_stored_priority_is_text_and_starts_the_others(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "state.db")
    suite = load_suite("demo", REPO_ROOT / "plans")
    specs = expand_jobs(suite, parse_pairs("1:glue_rte 2:glue_rte"), {}, None, 0)
    outcomes = submit_jobs(
        store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False
    )
    bad = outcomes[0].job_id
    with store.write():  # as an older orch wrote it, or a hand edit
        store.execute("UPDATE jobs SET priority = 'high' WHERE id = ?", [bad])
    assert get_job(store, bad).priority == 0  # readers (orch cancel, the web page) never fail on it
    with store.write():
        store.execute("UPDATE jobs SET priority = 'low' WHERE id = ?", [outcomes[-1].job_id])
    assert cancel_job(store, outcomes[-1].job_id) is Done.CANCELLED
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(order="fifo"), {})
    gpu = (
        GpuSnapshot(
            index=0,
            uuid="GPU-0",
            name="sim",
            total_mib=80_000,
            used_mib=0,
            free_mib=80_000,
            processes=(),
        ),
    )
    decision = schedule(store, gpu, _Recorder(), ctx, SchedulerState(), draining=False)
    failed = get_job(store, bad)
    assert failed.state is JobState.FAILED and "priority 'high' is not a whole number" in (
        failed.reason or ""
    )
    assert decision.placements and bad not in [p.job_id for p in decision.placements]
    store.close()


# ------------------------------------------------------------------ a grid's size


def test_a_huge_grid_is_refused_with_its_count_before_a_combination_is_built(
    sweep: Sweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    def built(*_: Any) -> Any:
        raise AssertionError("a combination list was built")

    monkeypatch.setattr(submit_core, "combinations", built)
    grid = {f"k{i}": list(range(10)) for i in range(8)}  # 10^8 combinations
    write_plans(
        sweep.plans_dir,
        {"big": {"worker": "sim", "mem_gib": 1, "configs": ["base"]}},  # type: ignore[arg-type]
        {"base": {**SIM, **dict.fromkeys(grid, 0)}},
    )
    with pytest.raises(PlanError, match="= 100000000 jobs, more than 100000"):
        sweep.submit("big", pairs=["1:glue_rte"], grid=grid)


def test_a_suite_files_huge_grid_is_refused_at_load(tmp_path: Path) -> None:
    grid = {f"k{i}": list(range(10)) for i in range(8)}
    plans = write_plans(
        tmp_path,
        {"big": {"worker": "sim", "mem_gib": 1, "configs": ["base"], "grid": grid}},
        {"base": {**SIM, **dict.fromkeys(grid, 0)}},
    )
    with pytest.raises(
        PlanError, match="1 config\\(s\\) × 100000000 grid combination\\(s\\) × 1 pair\\(s\\)"
    ):
        load_suite("big", plans)


# ------------------------------------------------------------------ suite files


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "worker: sim\nmem_gib: 1\nconfigs: [base]\ngrid: {learning_rate: [0.1], learning_rate: [0.2]}\n",
            "key 'learning_rate' is given twice in one mapping (line 4)",
        ),
        (
            "worker: sim\nmem_gib: 1\nconfigs: [base]\nseeds: [1]\nseeds: [2]\ntasks: [glue_rte]\n",
            "key 'seeds' is given twice",
        ),
        (
            'worker: sim\nmem_gib: 1\nconfigs: [base]\ngrid: {name: ["a\\nb"]}\n',
            "contains control characters",
        ),
        (
            'worker: sim\nmem_gib: 1\nconfigs: [base]\ngrid: {name: ["a\\u0007"]}\n',
            "contains control characters",
        ),
        (
            "worker: sim\nmem_gib: 1\nconfigs: [base]\nseeds: [1]\ntasks: ['a b']\n",
            "task 'a b' is not a task name",
        ),
    ],
)
def test_a_suite_file_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    plans = write_plans(tmp_path, {"bad": text})
    with pytest.raises(PlanError) as refused:
        load_suite("bad", plans)
    assert message in str(refused.value) and len(str(refused.value).splitlines()) == 1


def test_yaml_merge_keys_still_override(tmp_path: Path) -> None:
    text = (
        "worker: sim\nmem_gib: 1\nconfigs: {a: &a {learning_rate: 0.1, batch_size: 8}, "
        "b: {<<: *a, learning_rate: 0.2}}\n"
    )
    suite = load_suite("m", write_plans(tmp_path, {"m": text}))
    assert [c.content for c in suite.configs] == [
        {"learning_rate": 0.1, "batch_size": 8},
        {"learning_rate": 0.2, "batch_size": 8},
    ]


# ------------------------------------------------------------------ keys the command never receives


SCRIPT_CONFIG = {"learning_rate": 0.001, "weight_decay": 0.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--grid", "weight_decay=0,0.1"],
            "--grid weight_decay: the worker command never receives weight_decay (it has no {config} and no "
            "{cfg.weight_decay}): add e.g. `--weight-decay {cfg.weight_decay}` or `--config {config}`",
        ),
        (
            ["--set", "weight_decay=0.1"],
            "--set weight_decay: the worker command never receives weight_decay",
        ),
        (
            ["--set", "dropout=0.1"],
            "--set 'dropout': unknown config key (the configs' keys: learning_rate, weight_decay); "
            "add `dropout:` to your config file",
        ),
        (
            ["--set", "learning_rat=0.1"],
            "--set 'learning_rat': unknown config key (did you mean 'learning_rate'?) (the configs' keys: "
            "learning_rate, weight_decay)",
        ),
        (
            ["--set", "share_base=fused"],
            "--set 'share_base': share_base is a suite key, not a config key: set `share_base:` in the suite file",
        ),
        (
            ["--grid", "mem_gib=2,4"],
            "--grid 'mem_gib': mem_gib is a suite key, not a config key: set `mem_gib:` in the suite file",
        ),
    ],
)
def test_a_key_the_command_never_receives_is_refused(
    orch_inproc: OrchRunner, tmp_path: Path, db_path: Path, args: list[str], message: str
) -> None:
    plans = write_plans(
        tmp_path,
        {
            "own": {
                "worker": "python train.py --lr {cfg.learning_rate}",
                "mem_gib": 1,
                "configs": ["base"],
            }
        },
        {"base": SCRIPT_CONFIG},
    )
    done = orch_inproc("submit", "--plans", str(plans), "--suite", "own", "--seeds", "1", *args)
    assert done.rc == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
        done.stderr
    )
    assert not db_path.exists()
    reached = orch_inproc(
        "submit",
        "--plans",
        str(plans),
        "--suite",
        "own",
        "--seeds",
        "1",
        "--grid",
        "learning_rate=1e-3,3e-3",
    )
    assert reached.rc == 0, reached.stderr


def test_a_suite_grid_over_a_key_the_command_never_receives_is_refused(
    orch_inproc: OrchRunner, tmp_path: Path
) -> None:
    plans = write_plans(
        tmp_path,
        {
            "own": {
                "worker": "python train.py --lr {cfg.learning_rate}",
                "mem_gib": 1,
                "configs": ["base"],
                "seeds": [1],
                "grid": {"weight_decay": [0, 0.1]},
            }
        },
        {"base": SCRIPT_CONFIG},
    )
    done = orch_inproc("submit", "--plans", str(plans), "--suite", "own")
    assert (
        done.rc == 2
        and "grid: weight_decay: the worker command never receives weight_decay" in done.stderr
    )


# ------------------------------------------------------------------ one file, no task


def test_inline_configs_and_seeds_without_tasks(orch_inproc: OrchRunner, tmp_path: Path) -> None:
    plans = write_plans(
        tmp_path,
        {
            "one": (
                "worker: python train.py --config {config}\nmem_gib: 1\nseeds: [1, 2]\n"
                "configs:\n  lr_low: {learning_rate: 0.0005}\n  lr_high: {learning_rate: 0.005}\n"
            )
        },
    )
    suite = load_suite("one", plans)
    assert [(c.name, c.content) for c in suite.configs] == [
        ("lr_low", {"learning_rate": 0.0005}),
        ("lr_high", {"learning_rate": 0.005}),
    ]
    assert [(p.seed, p.data) for p in suite.pairs] == [(1, ""), (2, "")]
    done = orch_inproc("submit", "--plans", str(plans), "--suite", "one", "--json")
    assert done.rc == 0, done.stderr
    jobs = json.loads(done.stdout)["jobs"]
    assert [(j["config"], j["seed"], j["data"]) for j in jobs] == [
        ("lr_low", 1, ""),
        ("lr_low", 2, ""),
        ("lr_high", 1, ""),
        ("lr_high", 2, ""),
    ]
    seeds = orch_inproc(
        "submit", "--plans", str(plans), "--suite", "one", "--seeds", "3-5", "--dry-run", "--json"
    )
    assert seeds.rc == 0, seeds.stderr
    assert [j["seed"] for j in json.loads(seeds.stdout)["jobs"]] == [3, 4, 5, 3, 4, 5]
    both = orch_inproc(
        "submit", "--plans", str(plans), "--suite", "one", "--seeds", "1", "--pairs", "1:x"
    )
    assert both.rc == 2 and "give one" in both.stderr


def test_seeds_go_with_the_suites_tasks(tmp_path: Path) -> None:
    plans = write_plans(
        tmp_path,
        {
            "t": {
                "worker": "sim",
                "mem_gib": 1,
                "configs": ["base"],
                "seeds": [1],
                "tasks": ["glue_rte", "glue_sst2"],
            }
        },
    )
    rows = Sweep(tmp_path / "state.db", plans=plans).submit(
        "t", seeds=[7, 8], dry_run=True, as_frame=False
    )
    assert [(r["seed"], r["task"]) for r in rows] == [
        (7, "glue_rte"),
        (7, "glue_sst2"),
        (8, "glue_rte"),
        (8, "glue_sst2"),
    ]


def test_an_early_stop_no_lora_job_can_reach_is_noted_at_submit(
    orch_inproc: OrchRunner, tmp_path: Path, db_path: Path
) -> None:
    early_stop = {"metric": "val_accuracy", "min_steps": 100}
    lora = {"model": "tiny-llama", "peft": {"r": 4, "targets": ["q_proj"]}, "max_steps": 12}
    plans = write_plans(
        tmp_path, {"es": {"worker": "lora", "mem_gib": 1, "configs": ["base"], "early_stop": early_stop}},
        {"base": lora},
    )
    args = ("submit", "--plans", str(plans), "--suite", "es", "--pairs", "1:glue_rte", "--dry-run")
    short = orch_inproc(*args, "--grid", "max_steps=12,50")
    assert short.rc == 0 and (
        "note: early_stop.min_steps 100 is past every job's max_steps (at most 50): no job reaches the first "
        "rung, so early stopping stops none"
    ) in short.stderr
    reaching = orch_inproc(*args, "--grid", "max_steps=12,100")
    assert reaching.rc == 0 and "early_stop.min_steps" not in reaching.stderr


def test_a_loss_judged_as_a_maximum_is_noted_at_submit(
    orch_inproc: OrchRunner, tmp_path: Path, db_path: Path
) -> None:
    lora = {"model": "tiny-llama", "peft": {"r": 4, "targets": ["q_proj"]}, "max_steps": 200}
    suites = {
        "loss_max": {"early_stop": {"metric": "val_loss", "min_steps": 10}},  # mode left out: max
        "loss_min": {"early_stop": {"metric": "val_loss", "mode": "min", "min_steps": 10}},
        "acc": {"early_stop": {"metric": "val_accuracy", "min_steps": 10}},
    }
    common = {"worker": "lora", "mem_gib": 1, "configs": ["base"]}
    plans = write_plans(tmp_path, {name: common | body for name, body in suites.items()}, {"base": lora})
    said = {}
    for name in suites:
        result = orch_inproc("submit", "--plans", str(plans), "--suite", name, "--pairs", "1:glue_rte", "--dry-run")
        assert result.rc == 0, result
        said[name] = result.stderr
    assert ("note: early_stop.metric val_loss reads as a loss, but early_stop.mode is max (the default when left "
            "out): the highest value counts as best; write `mode: min` if lower is better") in said["loss_max"]
    assert "reads as a loss" not in said["loss_min"] and "reads as a loss" not in said["acc"]


def test_a_misspelt_simulator_key_is_refused_with_its_likely_meaning(tmp_path: Path) -> None:
    """`sim_secnds: 3` rehearsed the sweep at the default run time, silently."""
    plans = write_plans(tmp_path / "plans", {"s": {"worker": "sim", "mem_gib": 1, "configs": ["base"],
                                                   "ladder": [{"set": {"sim_mem_gb": 1}}]}},
                        {"base": {"sim_mem_gib": 1, "sim_secnds": 3, "learnig_rate": 0.1}})
    sweep = Sweep(tmp_path / "state.db", plans=plans)
    with pytest.raises(PlanError, match=r"^suite s, config base: the simulated worker reads no 'sim_secnds' "
                                        r"\(did you mean 'sim_seconds'\?\) \(its keys: sim_base_gib, "):
        sweep.submit("s", seeds=[1], dry_run=True)
    (plans / "configs" / "s" / "base.yaml").write_text(yaml.safe_dump({"sim_mem_gib": 1, "other_key": 2,
                                                                        "sim_temperature": 0.7}))  # the script's
    with pytest.raises(PlanError, match=r"^suite s, ladder set: the simulated worker reads no 'sim_mem_gb' "
                                        r"\(did you mean 'sim_mem_gib'\?\)"):
        sweep.submit("s", seeds=[1], dry_run=True)
    assert not (tmp_path / "state.db").exists()


@pytest.mark.parametrize(("key", "value"), [("batch_size", "1.5"), ("batch_size", "-4"), ("batch_size", "0"),
                                            ("gradient_accumulation_steps", "0.5"), ("num_data_workers", "-1")])
def test_a_ladder_knob_that_is_not_a_whole_number_at_its_floor_is_refused(tmp_path: Path, key: str,
                                                                         value: str) -> None:
    """`--set batch_size=1.5` was queued and failed at run time; `-4` ran."""
    plans = write_plans(tmp_path / "plans", {"s": {"worker": "sim", "mem_gib": 1, "configs": ["base"]}},
                        {"base": {"sim_mem_gib": 1, "batch_size": 8, "gradient_accumulation_steps": 1,
                                  "num_data_workers": 2}})
    sweep = Sweep(tmp_path / "state.db", plans=plans)
    with pytest.raises(PlanError, match=rf"^suite s, config base: {key}=[-0-9.]+ must be a whole number of [01] or "
                                        r"more$"):
        sweep.submit("s", seeds=[1], sets={key: value}, dry_run=True)
    assert sweep.submit("s", seeds=[1], sets={"batch_size": "4", "num_data_workers": "0"}, dry_run=True,
                        as_frame=False)[0]["state"] == "would be queued"


def test_a_ladder_knob_written_as_a_float_or_searched_below_its_floor_is_refused_and_text_passes(
    tmp_path: Path,
) -> None:
    def submit(config: dict[str, Any], **suite: Any) -> Any:
        plans = write_plans(tmp_path / "plans", {"s": {"worker": "sim", "mem_gib": 1, "configs": ["base"], **suite}},
                            {"base": {"sim_mem_gib": 1, **config}})
        return Sweep(tmp_path / "state.db", plans=plans).submit("s", seeds=[1], dry_run=True, as_frame=False)

    with pytest.raises(PlanError, match=r"batch_size=8\.0: write 8, a whole number \(orch's ladder halves only"):
        submit({"batch_size": 8.0})
    assert submit({"batch_size": "auto", "gradient_accumulation_steps": "auto"})[0]["state"] == "would be queued"
    space = {"method": "random", "trials": 2, "seed": 0, "space": {"batch_size": {"int_uniform": [0, 8]}}}
    with pytest.raises(PlanError, match=r"search\.space\.batch_size int_uniform \[0, 8\]: batch_size=0 must be a "
                                        r"whole number of 1 or more"):
        submit({"batch_size": 8}, search=space)
    space["space"] = {"batch_size": {"int_uniform": [1, 8]}}
    assert len(submit({"batch_size": 8}, search=space)) == 2
