"""Parsing of GPU plans, pairs, rounds and --set values; suite loading; job expansion; E1 specs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import PlanError, UsageError
from orchestrator.plans import (
    CRASH_LOOP_OFF,
    ConfigSpec,
    CrashLoop,
    Pair,
    Suite,
    default_plans_dir,
    expand_jobs,
    job_identity,
    load_suite,
    parse_gpu_plan,
    parse_gpus,
    parse_pairs,
    parse_round,
    parse_scalar,
    parse_set_overrides,
)
from orchestrator.plans.model import known_keys
from orchestrator.plans.suite import config_problem

REPO_ROOT = Path(__file__).resolve().parent.parent
PLANS = REPO_ROOT / "plans"
KNOWN = {"batch_size", "learning_rate", "model", "gradient_checkpointing", "prec"}


@pytest.fixture(scope="module")
def e1() -> Suite:
    return load_suite("E1", PLANS)


def write_suite(plans: Path, name: str, suite: Any, configs: dict[str, Any] | None = None) -> Path:
    """A suite file (dict dumped as YAML, or raw text) and its config files under `plans`."""
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    text = suite if isinstance(suite, str) else yaml.safe_dump(suite)
    (plans / "suites" / f"{name}.yaml").write_text(text)
    for config_name, content in (configs or {}).items():
        config_dir = plans / "configs" / name
        config_dir.mkdir(parents=True, exist_ok=True)
        body = content if isinstance(content, str) else yaml.safe_dump(content)
        (config_dir / f"{config_name}.yaml").write_text(body)
    return plans


# ---------------------------------------------------------------- GPUs and plans


def test_launcher_example_plan() -> None:
    gpus = parse_gpus("0 1 2 3 4 5 6")
    assert gpus == [0, 1, 2, 3, 4, 5, 6]
    plan = parse_gpu_plan("2,2,2,2,1,1,1", gpus)
    assert plan.slots_by_gpu == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1}
    assert plan.total_slots(gpus, fallback=1) == 11


def test_plan_follows_the_order_of_gpus() -> None:
    plan = parse_gpu_plan("2 1 0", parse_gpus("3,1,5"))
    assert plan.slots_by_gpu == {3: 2, 1: 1, 5: 0}


def test_single_integer_is_broadcast() -> None:
    assert parse_gpu_plan("3", [0, 2, 4]).slots_by_gpu == {0: 3, 2: 3, 4: 3}
    everywhere = parse_gpu_plan("2", None)
    assert everywhere.slots_by_gpu == {}
    assert everywhere.default_slots == 2
    assert everywhere.slots_for(7, fallback=1) == 2


def test_zero_keeps_a_gpu_visible_but_unused() -> None:
    plan = parse_gpu_plan("2,0,1", [0, 1, 2])
    assert plan.slots_for(1, fallback=1) == 0
    assert plan.total_slots([0, 1, 2], fallback=1) == 3


def test_plan_without_gpus_numbers_from_zero() -> None:
    plan = parse_gpu_plan("2,2,1", None)
    assert plan.slots_by_gpu == {0: 2, 1: 2, 2: 1}
    assert plan.slots_for(9, fallback=1) == 1  # a GPU the plan does not name


def test_plan_length_mismatch_is_an_error() -> None:
    with pytest.raises(PlanError, match=r"3 entries but --gpus names 2 GPUs"):
        parse_gpu_plan("2,2,1", [0, 1])


def test_an_empty_entry_is_refused_not_skipped() -> None:
    # "2,,2" is a typo for a three-GPU plan, not the plan "2,2".
    with pytest.raises(PlanError, match="empty entry"):
        parse_gpu_plan("2,,2", None)
    with pytest.raises(PlanError, match="empty entry"):
        parse_gpu_plan("2,2,", None)
    assert parse_gpu_plan(" 2 , 2 ", None).slots_by_gpu == {0: 2, 1: 2}
    assert parse_gpu_plan("2 2", None).slots_by_gpu == {0: 2, 1: 2}


@pytest.mark.parametrize("text", ["0", "0,0", "0 0 0"])
def test_a_plan_of_only_zeros_is_refused(text: str) -> None:
    with pytest.raises(PlanError, match="0 slots"):
        parse_gpu_plan(text, None)
    with pytest.raises(PlanError, match="0 slots"):
        parse_gpu_plan(text, [0, 1, 2] if text.count("0") == 3 else [0, 1][: max(1, text.count("0"))])
    # Taking named GPUs out of use stays possible where the caller allows it (orch plan set --gpus).
    assert parse_gpu_plan("0", [3], allow_all_zero=True).slots_by_gpu == {3: 0}


@pytest.mark.parametrize(
    "text", ["", "  ", ",", "-1", "2.5", "1e3", "99999999999999", "２", "65", "two", "2;1", "0x2", "+1"]
)
def test_bad_plans(text: str) -> None:
    with pytest.raises(PlanError):
        parse_gpu_plan(text, None)


@pytest.mark.parametrize("text", ["", "0 0", "-1", "1.0", "1024", "a", "0,1,1", "\x1b[31m0"])
def test_bad_gpus(text: str) -> None:
    with pytest.raises(PlanError):
        parse_gpus(text)


def test_plan_errors_are_usage_errors() -> None:
    with pytest.raises(UsageError) as info:
        parse_gpu_plan("x", None)
    assert info.value.exit_code == 2


# ---------------------------------------------------------------- pairs


@pytest.mark.parametrize(
    "text",
    [
        "87:glue-tvt_qnli 127:glue-tvt_rte",
        "87:glue-tvt_qnli,127:glue-tvt_rte",
        " 87:glue-tvt_qnli ,\t127:glue-tvt_rte ",
    ],
)
def test_pairs_comma_or_space_separated(text: str) -> None:
    assert parse_pairs(text) == [Pair(87, "glue-tvt_qnli"), Pair(127, "glue-tvt_rte")]


def test_pairs_keep_order_and_allow_same_seed_on_other_tasks() -> None:
    pairs = parse_pairs("13:glue_rte 13:glue-tvt_sst2_1000 0:a.b")
    assert [str(p) for p in pairs] == ["13:glue_rte", "13:glue-tvt_sst2_1000", "0:a.b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("87", "not SEED:DATA"),
        ("glue_rte", "not SEED:DATA"),
        ("-1:glue_rte", "not a non-negative integer"),
        ("x:glue_rte", "not a non-negative integer"),
        ("1.5:glue_rte", "not a non-negative integer"),
        ("2147483648:glue_rte", "too large"),
        ("99999999999999999999:glue_rte", "too large"),
        (":glue_rte", "not a non-negative integer"),
        ("87:", "not a task name"),
        ("87:a:b", "not a task name"),
        ("87:../etc", "not a task name"),
        ("87:glue;rm", "not a task name"),
        ("87:$(touch)", "not a task name"),
        ("87:tâche", "not a task name"),
        ("87:glue_rte 87:glue_rte", "given twice"),
        ("87:glue_rte\x1b[31m", "control characters"),
    ],
)
def test_bad_pairs(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace("$", r"\$")):
        parse_pairs(text)


def test_newline_in_pairs_is_refused() -> None:
    with pytest.raises(PlanError, match="control characters"):
        parse_pairs("87:glue_rte\n127:glue_rte")


# ---------------------------------------------------------------- rounds


@pytest.mark.parametrize(
    ("text", "expected"),
    [("all", None), ("ALL", None), ("1", 1), ("2", 2), (" 12 ", 12), ("r1", "r1")],
)
def test_round_values(text: str, expected: int | str | None) -> None:
    assert parse_round(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-1", "999999", "../x", "r 1", "\x1b"])
def test_bad_rounds(text: str) -> None:
    with pytest.raises(PlanError):
        parse_round(text)


def test_round_two_is_the_second_slice_of_sigma_plan(e1: Suite) -> None:
    pairs = parse_pairs("87:glue-tvt_qnli 127:glue-tvt_rte")
    everything = expand_jobs(e1, pairs, {}, None, 0)
    assert len(everything) == 88
    # Config-major, as the bash launchers ordered them: each config at every pair, in turn.
    names = e1.config_names()
    assert [(j.config_name, j.seed) for j in everything[:4]] == [
        (names[0], 87), (names[0], 127), (names[1], 87), (names[1], 127)
    ]
    round_two = expand_jobs(e1, pairs, {}, 2, 12)
    assert round_two == everything[12:24]
    assert [j.config_name for j in round_two[::2]] == names[6:12]
    assert [j.seed for j in round_two] == [87, 127] * 6


def test_last_round_is_short_and_one_past_it_is_an_error(e1: Suite) -> None:
    pairs = parse_pairs("87:glue-tvt_qnli 127:glue-tvt_rte")
    assert len(expand_jobs(e1, pairs, {}, 8, 12)) == 4  # ceil(88/12) = 8, the last has 4
    with pytest.raises(PlanError, match=r"88 jobs = 8 round\(s\) of 12 slots"):
        expand_jobs(e1, pairs, {}, 9, 12)
    with pytest.raises(PlanError, match="at least one slot"):
        expand_jobs(e1, pairs, {}, 1, 0)


def test_rounds_partition_the_suite(e1: Suite) -> None:
    pairs = parse_pairs("87:glue-tvt_qnli 127:glue-tvt_rte")
    rounds = [expand_jobs(e1, pairs, {}, n, 11) for n in range(1, 9)]
    assert [len(r) for r in rounds] == [11] * 8
    assert [j for r in rounds for j in r] == expand_jobs(e1, pairs, {}, None, 0)
    with pytest.raises(PlanError):
        expand_jobs(e1, pairs, {}, 9, 11)


def test_named_rounds(tmp_path: Path) -> None:
    plans = write_suite(
        tmp_path / "plans", "R",
        {"worker": "sim", "mem_gib": 1, "configs": ["a", "b", "c"], "rounds": {"first": ["c", "a"], "second": ["b"]}},
        {"a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}},
    )
    suite = load_suite("R", plans)
    pairs = parse_pairs("1:t")
    # A named round keeps the suite's order, not the round's listing order.
    assert [j.config_name for j in expand_jobs(suite, pairs, {}, "first", 0)] == ["a", "c"]
    assert [j.config_name for j in expand_jobs(suite, pairs, {}, 2, 0)] == ["b"]
    with pytest.raises(PlanError, match="has 2 named rounds"):
        expand_jobs(suite, pairs, {}, 3, 0)
    with pytest.raises(PlanError, match="no round 'third'"):
        expand_jobs(suite, pairs, {}, "third", 0)


# ---------------------------------------------------------------- --set


@pytest.mark.parametrize(
    ("item", "key", "value"),
    [
        ("batch_size=8", "batch_size", 8),
        ("learning_rate=0.0003", "learning_rate", 0.0003),
        ("learning_rate=3.0e-4", "learning_rate", 0.0003),
        ("gradient_checkpointing=true", "gradient_checkpointing", True),
        ("gradient_checkpointing=false", "gradient_checkpointing", False),
        ("model=null", "model", None),
        ("model=~", "model", None),
        ("model=/data/gla-1.3B", "model", "/data/gla-1.3B"),
        ("prec='bf16'", "prec", "bf16"),
        ('model="a=b"', "model", "a=b"),
        ("batch_size = 8", "batch_size", 8),
        ("env.HF_HOME=/tmp/hf", "env.HF_HOME", "/tmp/hf"),
        ("env._X1=1", "env._X1", 1),
    ],
)
def test_set_scalars(item: str, key: str, value: object) -> None:
    result = parse_set_overrides([item], KNOWN)
    assert result == {key: value}
    assert type(result[key]) is type(value)


def test_set_exponent_without_dot_still_reads_as_a_number() -> None:
    # YAML 1.1 reads 1e-4 as a string; the worker converts it. It must at least round-trip.
    assert float(parse_scalar("learning_rate", "1e-4")) == pytest.approx(1e-4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("batch_size=[1]", "not a list"),
        ("batch_size={x: 1}", "not a dict"),
        ("model=a: b", "not a dict"),
        ("model=- a", "not a list"),
        ("batch_size=--- 1\n--- 2", "control characters"),
        ("batch_size=1\n---\n2", "control characters"),
        ('model=!!python/object/apply:os.system ["touch pwned"]', "not a YAML scalar"),
        ("model=!!python/name:os.system", "not a YAML scalar"),
        ("model=*alias", "not a YAML scalar"),
        ("model=&a [1]", "not a list"),
        ("model=\x1b[31mred", "control characters"),
        ("model=a\tb", "not a YAML scalar"),
        ("batch_size=99999999999999999999", "too large"),
        ("learning_rate=.inf", "finite"),
        ("learning_rate=.nan", "finite"),
        ("bogus=1", "unknown config key"),
        ("__class__=1", "unknown config key"),
        ("env.1BAD=x", "not a valid environment variable name"),
        ("env.A-B=x", "not a valid environment variable name"),
        ("env.=x", "not a valid environment variable name"),
        ("env.A B=x", "not a valid environment variable name"),
        ("seed=1", "come from --pairs"),
        ("data=glue_rte", "come from --pairs"),
        ("=5", "not KEY=VALUE"),
        ("batch_size", "not KEY=VALUE"),
        ("model=" + "x" * 5000, "too long"),
    ],
)
def test_set_refused(item: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_set_overrides([item], KNOWN)


def test_set_error_quotes_control_characters_safely() -> None:
    with pytest.raises(PlanError) as info:
        parse_set_overrides(["model=\x1b[31mred"], KNOWN)
    assert "\x1b" not in str(info.value)
    assert "\\x1b" in str(info.value)


def test_suite_known_keys_exclude_pair_keys(e1: Suite) -> None:
    keys = e1.known_keys()
    assert {"batch_size", "model", "peft", "max_seq_len"} <= keys
    assert not keys & {"seed", "data"}


# ---------------------------------------------------------------- expansion and identity


def test_overrides_merge_into_config_and_env(e1: Suite) -> None:
    overrides = parse_set_overrides(["batch_size=2", "env.HF_HOME=/tmp/hf", "env.EMPTY=null"], e1.known_keys())
    (job,) = expand_jobs(e1, parse_pairs("42:glue-tvt_rte"), overrides, None, 0)[:1]
    assert job.config["batch_size"] == 2
    assert job.config["seed"] == 42 and job.config["data"] == "glue-tvt_rte"
    assert "HF_HOME" not in job.config and "env.HF_HOME" not in job.config
    assert job.env == {"HF_HOME": "/tmp/hf", "EMPTY": ""}
    assert e1.configs[0].content["batch_size"] == 4  # the loaded suite is not mutated


def test_identity_is_stable_and_sensitive(e1: Suite) -> None:
    config = e1.configs[0]
    base = job_identity("E1", config, Pair(87, "glue_rte"), {})
    assert base == job_identity("E1", load_suite("E1", PLANS).configs[0], Pair(87, "glue_rte"), {})
    changed_content = ConfigSpec(config.name, config.path, {**config.content, "batch_size": 2})
    others = {
        job_identity("E1", config, Pair(13, "glue_rte"), {}),
        job_identity("E1", config, Pair(87, "glue_cola"), {}),
        job_identity("E1", config, Pair(87, "glue_rte"), {"batch_size": 2}),
        job_identity("E5", config, Pair(87, "glue_rte"), {}),
        job_identity("E1", changed_content, Pair(87, "glue_rte"), {}),
    }
    assert base not in others and len(others) == 5


# ---------------------------------------------------------------- suite loading


def test_shipped_suites_load() -> None:
    assert len(load_suite("E1", PLANS).configs) == 44
    e5 = load_suite("E5", PLANS)
    assert len(e5.configs) == 18
    assert set(e5.config_names()) <= set(load_suite("E1", PLANS).config_names())
    demo = load_suite("demo", PLANS)
    assert demo.worker == "sim" and demo.configs


def test_default_plans_dir_is_the_shipped_one_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./plans here
    assert default_plans_dir() == PLANS
    (tmp_path / "plans" / "suites").mkdir(parents=True)
    assert default_plans_dir() == tmp_path / "plans"


def test_unknown_suite_lists_the_known_ones() -> None:
    with pytest.raises(PlanError, match=r"unknown suite 'E99' in .*suites \(known suites: .*E1"):
        load_suite("E99", PLANS)


@pytest.mark.parametrize("name", ["../etc/passwd", "E1/../E1", "E1;ls", "", ".hidden", "E1 ", "E1\x00"])
def test_bad_suite_names(name: str) -> None:
    with pytest.raises(PlanError):
        load_suite(name, PLANS)


GOOD = {"worker": "sim", "mem_gib": 2, "configs": ["a"]}


@pytest.mark.parametrize(
    ("suite", "configs", "message"),
    [
        ({**GOOD, "mem_gib": "lots"}, {"a": {}}, "`mem_gib` must be int/float, not str"),
        ({**GOOD, "mem_gib": True}, {"a": {}}, "not bool"),
        ({**GOOD, "mem_gib": 0}, {"a": {}}, "above 0 and at most 4096"),
        ({**GOOD, "mem_gib": 1e9}, {"a": {}}, "above 0 and at most 4096"),
        ({**GOOD, "configs": "E1"}, {"a": {}}, "`configs` must be list/dict, not str"),
        ({**GOOD, "configs": []}, {}, "non-empty list"),
        ({**GOOD, "configs": [1]}, {}, "config name 1 is not valid"),
        ({**GOOD, "configs": ["../x"]}, {}, "is not valid"),
        ({**GOOD, "configs": ["café_β 模型"]}, {},
         r"config name 'café_β 模型' is not valid \(ASCII letters and digits, then also '_', '\.', '\+', '-'; "
         r"at most 128 characters\)$"),
        ({**GOOD, "rounds": {"r 1": ["a"]}}, {"a": {}},
         r"round name 'r 1' is not valid \(ASCII letters and digits, then also '_', '\.', '-'; "
         r"at most 64 characters\)$"),
        ({**GOOD, "configs": ["a", "a"]}, {"a": {}}, "listed twice"),
        ({**GOOD, "env": ["a"]}, {"a": {}}, "`env` must be dict, not list"),
        ({**GOOD, "env": {"1X": "y"}}, {"a": {}}, "not a valid variable name"),
        ({**GOOD, "env": {"X": [1]}}, {"a": {}}, "must be a scalar"),
        ({**GOOD, "worker": 5}, {"a": {}}, "`worker` must be str, not int"),
        ({**GOOD, "worker": " "}, {"a": {}}, "`worker` is required"),
        ({"mem_gib": 2, "configs": ["a"]}, {"a": {}}, "`worker` is required"),
        ({**GOOD, "surprise": 1}, {"a": {}}, r"unknown key\(s\) surprise$"),
        ({**GOOD, "fused_member": 2}, {"a": {}}, r"unknown key\(s\) fused_member \(did you mean 'fused_members'\?\)$"),
        ({**GOOD, "rounds": {"r1": ["zzz"]}}, {"a": {}}, "names unknown config 'zzz'"),
        ({**GOOD, "rounds": {"r1": []}}, {"a": {}}, "must list config names"),
        ({**GOOD, "rounds": ["a"]}, {"a": {}}, "`rounds` must be dict"),
        ({**GOOD, "max_attempts": 0}, {"a": {}}, "between 1 and 100"),
        ({**GOOD, "max_attempts": "3"}, {"a": {}}, "must be int"),
        ({**GOOD, "hang_timeout_s": -1}, {"a": {}}, "must be positive"),
        ({**GOOD, "one_token_tasks": [1]}, {"a": {}}, "list of task patterns"),
        (
            {**GOOD, "crash_loop": True},
            {"a": {}},
            "`crash_loop` must be off or a mapping .*, not True",
        ),
        (
            {**GOOD, "crash_loop": None},
            {"a": {}},
            "`crash_loop` must be off or a mapping .*, not None",
        ),
        (
            {**GOOD, "crash_loop": "sometimes"},
            {"a": {}},
            "must be off or a mapping .*, not 'sometimes'",
        ),
        ({**GOOD, "crash_loop": [3, 30]}, {"a": {}}, "must be off or a mapping"),
        (
            {**GOOD, "crash_loop": {"count": 3}},
            {"a": {}},
            r"`crash_loop` has unknown key\(s\) count",
        ),
        (
            {**GOOD, "crash_loop": {"failures": -1}},
            {"a": {}},
            r"`crash_loop.failures` must be between 0 \(off\) and 1000",
        ),
        (
            {**GOOD, "crash_loop": {"failures": 2.5}},
            {"a": {}},
            "`crash_loop.failures` must be an integer .*not float",
        ),
        (
            {**GOOD, "crash_loop": {"failures": True}},
            {"a": {}},
            "`crash_loop.failures` must be an integer .*not bool",
        ),
        (
            {**GOOD, "crash_loop": {"failures": "3"}},
            {"a": {}},
            "`crash_loop.failures` must be an integer .*not str",
        ),
        (
            {**GOOD, "crash_loop": {"within_s": 0}},
            {"a": {}},
            "`crash_loop.within_s` must be between 0 and 604800 seconds",
        ),
        (
            {**GOOD, "crash_loop": {"window_s": -5}},
            {"a": {}},
            "`crash_loop.window_s` must be between 0 and",
        ),
        (
            {**GOOD, "crash_loop": {"window_s": 1e9}},
            {"a": {}},
            "`crash_loop.window_s` must be between 0 and",
        ),
        (
            {**GOOD, "crash_loop": {"window_s": "5 min"}},
            {"a": {}},
            "`crash_loop.window_s` must be a number of seconds, not str",
        ),
        (
            "worker: sim\nmem_gib: 2\nconfigs: [a]\ncrash_loop: {within_s: .inf}\n",
            {"a": {}},
            "`crash_loop.within_s` must be between 0 and",
        ),
        (GOOD, {}, "config file not found"),
        (GOOD, {"a": "- 1\n- 2\n"}, "must be a YAML mapping, not list"),
        (GOOD, {"a": "x: [\n"}, "is not valid YAML"),
        (GOOD, {"a": "1: x\n"}, "is not a string"),
        (GOOD, {"a": "class_weights: {0: 1.0, 1: 2.5}\n"}, r"config .*a\.yaml: class_weights has a key 0 that is "
         r"not a string: quote it \('0'\) or use a list$"),
        (GOOD, {"a": "heads: [{name: x, sizes: {true: 1}}]\n"}, r"heads\[0\]\.sizes has a key true that"),
        ({**GOOD, "configs": {"a": {"class_weights": {0: 1.0}}}}, {},
         r"suite .*bad\.yaml: config a: class_weights has a key 0 that is not a string"),
        (GOOD, {"a": "!!python/object/apply:os.system [x]\n"}, "is not valid YAML"),
        ("- a\n- b\n", {}, "must be a YAML mapping, not list"),
        ("", {}, "is empty: it must be a YAML mapping"),
        ("worker: sim\nmem_gib: 0\nconfigs: [a]\n", {"a": {}}, "above 0 and at most 4096, not 0$"),
        ("worker: sim\nmem_gib: 2\nconfigs: [a]\ndivergence_factor: 0.5\n", {"a": {}}, "or off, not 0.5$"),
        ("worker: [\n", {}, "is not valid YAML"),
    ],
)
def test_bad_suite_files(tmp_path: Path, suite: Any, configs: dict[str, Any], message: str) -> None:
    plans = write_suite(tmp_path / "plans", "bad", suite, configs)
    with pytest.raises(PlanError, match=message):
        load_suite("bad", plans)


def test_a_config_problem_names_its_path() -> None:
    assert config_problem({"a": {"b": [1, {"c": {"d": 1}}]}, "e": {}}) is None
    assert config_problem({1: "x"}) == "key 1 is not a string: quote it ('1')"
    assert config_problem({"a": [{"b": {2.5: 1}}]}) == (
        "a[0].b has a key 2.5 that is not a string: quote it ('2.5') or use a list")
    assert config_problem({"a": {None: 1}}) == "a has a key null that is not a string: quote it ('null') or use a list"
    assert config_problem({"lr": float("nan")}) == "lr is .nan: a value must be a finite number"
    assert config_problem({"a": {"b": [1.0, float("-inf")]}}) == (
        "a.b[1] is -.inf: a value must be a finite number (for no limit, a large number, or null where the script "
        "reads null so)")
    assert config_problem({"a": 1e308, "b": True, "c": None}) is None


def test_a_config_value_that_is_not_finite_is_refused_at_load(tmp_path: Path) -> None:
    """As `--set learning_rate=.nan` is: before, a suite's `.nan` was queued and stored as JSON."""
    plans = write_suite(tmp_path / "plans", "ok", GOOD, {"a": {"learning_rate": float("nan")}})
    with pytest.raises(PlanError, match=r"a\.yaml: learning_rate is \.nan: a value must be a finite number"):
        load_suite("ok", plans)


def test_good_minimal_suite_loads(tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "ok", {**GOOD, "env": {"A": 1, "B": True}}, {"a": {"x": 1}})
    suite = load_suite("ok", plans)
    assert suite.env == {"A": "1", "B": "True"}
    assert suite.max_attempts == 8 and suite.hang_timeout_s == 1800.0
    assert suite.crash_loop == CrashLoop(failures=3, within_s=30.0, window_s=300.0)
    assert suite.crash_loop.enabled
    assert suite.configs[0].content == {"x": 1}


@pytest.mark.parametrize(
    ("crash_loop", "expected"),
    [
        ({"failures": 5, "within_s": 60, "window_s": 900.5}, CrashLoop(5, 60.0, 900.5)),
        ({"failures": 1}, CrashLoop(1, 30.0, 300.0)),  # missing keys keep the defaults
        ({"within_s": 10}, CrashLoop(3, 10.0, 300.0)),
        ({}, CrashLoop()),
    ],
)
def test_crash_loop_setting_loads(tmp_path: Path, crash_loop: dict[str, Any], expected: CrashLoop) -> None:
    plans = write_suite(tmp_path / "plans", "ok", {**GOOD, "crash_loop": crash_loop}, {"a": {}})
    suite = load_suite("ok", plans)
    assert suite.crash_loop == expected
    assert suite.crash_loop.enabled


@pytest.mark.parametrize(
    "text", ["crash_loop: off", "crash_loop: false", "crash_loop: 'OFF'", "crash_loop: {failures: 0, window_s: 60}"]
)
def test_crash_loop_can_be_switched_off(tmp_path: Path, text: str) -> None:
    plans = write_suite(tmp_path / "plans", "ok", f"worker: sim\nmem_gib: 2\nconfigs: [a]\n{text}\n", {"a": {}})
    suite = load_suite("ok", plans)
    assert not suite.crash_loop.enabled
    assert suite.crash_loop.failures == 0
    if "window_s" not in text:
        assert suite.crash_loop == CRASH_LOOP_OFF


# ---------------------------------------------------------------- E1 LoRA specs against the reference table

_MODULES = {
    "q": "attn.q_proj", "k": "attn.k_proj", "v": "attn.v_proj", "o": "attn.o_proj",
    "g": "attn.g_proj", "gk.0": "attn.gk_proj.0", "gk.1": "attn.gk_proj.1",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj", "lm_head": "lm_head",
}
_QKVO = "q,k,v,o"
_GK = "gk.0,gk.1"
_OMLP = "o,gate,up,down"
_LAYERS = {"first6": range(0, 6), "middle6": range(9, 15), "last6": range(18, 24)}

# config -> (targets, r, alpha, method, layer range name or "")
REFERENCE: dict[str, tuple[str, int, int, str, str]] = {
    "E1_QKVO_r8_alpha8": (_QKVO, 8, 8, "lora", ""),
    "E1_QKVO_r8_alpha12": (_QKVO, 8, 12, "lora", ""),
    "E1_QKVO_r8_alpha16": (_QKVO, 8, 16, "lora", ""),
    "E1_QKVO_r8_alpha20": (_QKVO, 8, 20, "lora", ""),
    "E1_QKVO_r4_alpha8": (_QKVO, 4, 4, "lora", ""),  # the name says 8; the spec has 4
    "E1_QKVO_r10_alpha20": (_QKVO, 10, 20, "lora", ""),
    "E1_QKVO_plus_G_r8_alpha8": (f"{_QKVO},g", 8, 8, "lora", ""),
    "E1_QKVO_plus_G_r8_alpha16": (f"{_QKVO},g", 8, 16, "lora", ""),
    "E1_QKVO_plus_GK_r8_alpha8": (f"{_QKVO},{_GK}", 8, 8, "lora", ""),
    "E1_QKVO_plus_GK_r8_alpha16": (f"{_QKVO},{_GK}", 8, 16, "lora", ""),
    "E1_QKVO_plus_G_plus_GK_r8_alpha8": (f"{_QKVO},g,{_GK}", 8, 8, "lora", ""),
    "E1_QKVO_plus_G_plus_GK_r8_alpha16": (f"{_QKVO},g,{_GK}", 8, 16, "lora", ""),
    "E1_QKVO_plus_MLP_r8_alpha16": (f"{_QKVO},gate,up,down", 8, 16, "lora", ""),
    "E1_QKVO_plus_G_plus_GK_plus_MLP_r8_alpha16": (f"{_QKVO},g,{_GK},gate,up,down", 8, 16, "lora", ""),
    "E1_QKVO_first6_r8_alpha16": (_QKVO, 8, 16, "lora", "first6"),
    "E1_QKVO_last6_r8_alpha16": (_QKVO, 8, 16, "lora", "last6"),
    "E2_OMLP_last6_r8_alpha16": (_OMLP, 8, 16, "lora", "last6"),
    "E2_OMLP_middle6_r8_alpha16": (_OMLP, 8, 16, "lora", "middle6"),
    "E2_OMLP_r8_alpha8": (_OMLP, 8, 8, "lora", ""),
    "E2_OMLP_r8_alpha16": (_OMLP, 8, 16, "lora", ""),
    "E2_OMLP_plus_G_r8_alpha16": (f"{_OMLP},g", 8, 16, "lora", ""),
    "E2_OMLP_plus_GK_r8_alpha16": (f"{_OMLP},{_GK}", 8, 16, "lora", ""),
    "E2_OMLP_plus_G_plus_GK_r8_alpha16": (f"{_OMLP},g,{_GK}", 8, 16, "lora", ""),
}
for _method in ("DoRA", "RSLoRA"):
    for _stem, _targets in (("E1_QKVO_plus_G", f"{_QKVO},g"), ("E1_QKVO_plus_GK", f"{_QKVO},{_GK}"),
                            ("E1_QKVO_plus_G_plus_GK", f"{_QKVO},g,{_GK}")):
        REFERENCE[f"{_stem}_{_method}_r8_alpha16"] = (_targets, 8, 16, _method.lower(), "")
for _stem, _targets in (("E3_GATINGONLY", f"g,{_GK}"), ("E6_QKONLY", "q,k"), ("E7_KVONLY", "k,v"),
                        ("E8_QK_plus_GATING", f"q,k,g,{_GK}"), ("E9_OplusHEAD", "o,lm_head")):
    REFERENCE[f"{_stem}_r8_alpha16"] = (_targets, 8, 16, "lora", "")
    for _method in ("DoRA", "RSLoRA"):
        REFERENCE[f"{_stem}_{_method}_r8_alpha16"] = (_targets, 8, 16, _method.lower(), "")


def test_reference_table_has_44_configs_matching_suite(e1: Suite) -> None:
    assert len(REFERENCE) == 44
    assert sorted(e1.config_names()) == sorted(REFERENCE)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_e1_lora_spec_matches_reference(e1: Suite, name: str) -> None:
    targets, r, alpha, method, layers = REFERENCE[name]
    config = next(c for c in e1.configs if c.name == name)
    spec_path = (config.path.parent / config.content["peft"]).resolve()
    assert spec_path == PLANS / "peft" / f"{name}.json"
    spec = json.loads(spec_path.read_text())
    assert spec["peft_type"] == "LORA" and spec["task_type"] == "CAUSAL_LM"
    assert spec["lora_dropout"] == 0.05 and spec["bias"] == "none"
    assert spec["r"] == r and spec["lora_alpha"] == alpha
    assert spec["use_dora"] is (method == "dora")
    assert spec["use_rslora"] is (method == "rslora")
    modules = [_MODULES[t] for t in targets.split(",")]
    expected = (
        [f"layers.{n}.{m}" for n in _LAYERS[layers] for m in modules] if layers else modules
    )
    assert sorted(spec["target_modules"]) == sorted(expected)
    assert len(spec["target_modules"]) == len(set(spec["target_modules"]))


def test_e1_shared_training_settings(e1: Suite) -> None:
    for config in e1.configs:
        content = config.content
        assert (content["batch_size"], content["learning_rate"], content["num_epochs"]) == (4, 0.0003, 10), config.name
        assert content["prec"] == "bf16" and content["no_save"] is False, config.name


def test_every_sim_worker_key_can_be_set_from_the_command_line() -> None:
    """`--set` accepts known keys only: each key the sim worker reads must be one of them."""
    import re

    from orchestrator.plans import KNOWN_CONFIG_KEYS

    source = (Path(__file__).resolve().parents[1] / "workers" / "sim.py").read_text()
    read_by_sim = set(re.findall(r"""["'](sim_[a-z_]+)["']""", source))
    assert {"sim_mem_gib", "sim_fail", "sim_host_max_workers"} <= read_by_sim
    assert read_by_sim <= KNOWN_CONFIG_KEYS, read_by_sim - KNOWN_CONFIG_KEYS


def test_a_missing_suite_is_its_own_error(tmp_path: Path) -> None:
    from orchestrator.errors import SuiteNotFound
    from orchestrator.plans import load_suite

    (tmp_path / "suites").mkdir()
    with pytest.raises(SuiteNotFound, match="unknown suite 'nope'"):
        load_suite("nope", tmp_path)


def test_divergence_settings_are_checked_and_stored_with_the_job(tmp_path: Path) -> None:
    base = {"worker": "lora", "mem_gib": 1, "configs": ["a"]}
    write_suite(tmp_path, "D", {**base, "fail_on_divergence": True, "divergence_factor": 5}, {"a": {"lr": 1}})
    suite = load_suite("D", tmp_path)
    sharing = {"share_base": "sequential"}  # the LoRA worker's default
    assert suite.worker_output == {"fail_on_divergence": True, "divergence_factor": 5.0, **sharing}
    write_suite(tmp_path, "D", {**base, "divergence_factor": "off"}, {"a": {"lr": 1}})
    with pytest.raises(PlanError, match="`divergence_factor` must be a number >= 1 or off"):
        load_suite("D", tmp_path)
    write_suite(tmp_path, "D", {**base, "divergence_factor": False}, {"a": {"lr": 1}})  # YAML's off
    assert load_suite("D", tmp_path).worker_output == {"divergence_factor": 0.0, **sharing}
    for bad in ({"divergence_factor": 0.5}, {"fail_on_divergence": "yes"}):
        write_suite(tmp_path, "D", {**base, **bad}, {"a": {"lr": 1}})
        with pytest.raises(PlanError, match="divergence"):
            load_suite("D", tmp_path)
    write_suite(tmp_path, "D", base, {"a": {"lr": 1}})
    assert load_suite("D", tmp_path).worker_output == sharing  # no divergence setting: the defaults


def test_the_lora_workers_known_keys_leave_out_the_simulators() -> None:
    # a refusal naming the keys a LoRA suite may set listed sim_mem_gib, sim_seconds, ...: keys only
    # orch's simulator reads
    lora, sim = known_keys("lora", ()), known_keys("sim", ())
    assert "learning_rate" in lora and "sim_mem_gib" in sim
    assert not any(key.startswith("sim_") for key in lora)
