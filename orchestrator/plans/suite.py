"""Suites: loading a suite file and its configs.

`load_suite` reads `plans_dir/suites/NAME.yaml` and its config files; everything else here is
pure. Every problem raises PlanError (exit 2) with one line naming it. Expanding a suite into
jobs is `plans.expand` (its names are importable from here too).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

from orchestrator.errors import PlanError, SuiteNotFound, UsageError
from orchestrator.plans.early_stop import parse_early_stop

# JobSpec, expand_jobs and job_identity are re-exported: callers have always found them here.
from orchestrator.plans.expand import expand_jobs, job_identity  # noqa: F401
from orchestrator.plans.grid import check_grid_size, suite_grid, suite_pairs
from orchestrator.plans.inputs import (
    ENV_NAME_RE,
    SUITE_KEYS,
    SUITE_NAME_RE,
    check_env_name,
    check_text,
    shown_repr,
    shown_value,
)
from orchestrator.plans.keymap import parse_keys
from orchestrator.plans.model import (  # noqa: F401
    CRASH_LOOP_FAILURES,
    CRASH_LOOP_WINDOW_S,
    CRASH_LOOP_WITHIN_S,
    DEFAULT_MAX_RESUMES,
    KNOWN_CONFIG_KEYS,
    ConfigSpec,
    CrashLoop,
    JobSpec,
    Suite,
    canonical_json,
    known_keys,
)
from orchestrator.plans.resources import MAX_CPUS, MAX_GPUS, job_resources, parse_count
from orchestrator.plans.search import parse_search
from orchestrator.plans.spelling import did_you_mean
from orchestrator.plans.template import parse_template
from orchestrator.plans.worker_output import (
    parse_fused_members,
    parse_hang_timeout,
    parse_regex,
    parse_share_base,
)
from orchestrator.yaml_limits import read_yaml_file

_CONFIG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_CONFIG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")

MAX_CRASH_LOOP_FAILURES = 1000
MAX_CRASH_LOOP_S = 7 * 24 * 3600.0


CRASH_LOOP_OFF = CrashLoop(failures=0)


def default_plans_dir() -> Path:
    """`./plans` when it exists, else the plans/ shipped beside the orchestrator package."""
    local = Path.cwd() / "plans"
    if (local / "suites").is_dir():
        return local
    return shipped_plans_dir()


def shipped_plans_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "plans"  # orchestrator/plans/suite.py -> repo


def _path_hint(name: str) -> str:
    """For `--suite plans/suites/E1.yaml`: the name and folder that say the same."""
    if "/" not in name and not name.endswith((".yaml", ".yml")):
        return ""
    given = Path(name)
    stem = given.name.rsplit(".", 1)[0] if given.suffix in (".yaml", ".yml") else given.name
    if given.parent.name == "suites":
        return f"; --suite takes a name: --suite {stem} --plans {given.parent.parent or '.'}"
    return f"; --suite takes a name, read from DIR/suites/NAME.yaml of --plans DIR: --suite {stem}"


def _shipped_hint(name: str, plans_dir: Path) -> str:
    """When a local plans folder hides a suite that ships with orch: how to reach it."""
    shipped = shipped_plans_dir()
    if plans_dir.resolve() == shipped.resolve() or not (shipped / "suites" / f"{name}.yaml").is_file():
        return ""
    return f"; suite {name} ships with orch, but {plans_dir} is read instead: --plans {shipped}"


def list_suites(plans_dir: Path) -> list[str]:
    suites_dir = plans_dir / "suites"
    if not suites_dir.is_dir():
        return []
    return sorted(p.stem for p in suites_dir.glob("*.yaml"))


def _read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    data = read_yaml_file(path, what)  # size-, alias- and depth-limited
    if data is None:
        raise PlanError(f"{what} {path} is empty: it must be a YAML mapping (`key: value` lines)")
    if not isinstance(data, dict):
        raise PlanError(f"{what} {path} must be a YAML mapping, not {type(data).__name__}")
    return data


_NUMBER_WITH_EXPONENT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+-]?[0-9]+")


def _typed(path: Path, data: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any) -> Any:
    value = data.get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) and bool not in kinds:
        raise PlanError(f"suite {path}: `{key}` must be {'/'.join(k.__name__ for k in kinds)}, not bool")
    if not isinstance(value, kinds):
        hint = ""
        if float in kinds and isinstance(value, str) and _NUMBER_WITH_EXPONENT.fullmatch(value.strip()):
            # YAML 1.1 reads 1e-3 (no dot) and 1.0e3 (no sign) as text; a plain decimal always works
            hint = f" (YAML reads {value} as text: write {format(Decimal(value.strip()), 'f')})"
        raise PlanError(
            f"suite {path}: `{key}` must be {'/'.join(k.__name__ for k in kinds)}, "
            f"not {type(value).__name__}{hint}"
        )
    return value


def load_suite(name: str, plans_dir: Path) -> Suite:
    """Load `plans_dir/suites/NAME.yaml` and its configs; every problem is a PlanError."""
    check_text("--suite", name)
    if not SUITE_NAME_RE.fullmatch(name):
        raise PlanError(f"suite name {shown_value(name)} is not valid (letters, digits, '_', '-', '.')"
                        + _path_hint(name))
    if not plans_dir.is_dir():
        raise PlanError(f"the plans folder {plans_dir} does not exist (--plans DIR or ORCH_PLANS: a folder "
                        "holding suites/ and configs/)")
    path = plans_dir / "suites" / f"{name}.yaml"
    if not path.is_file():
        known = list_suites(plans_dir)
        hint = f" (known suites: {', '.join(known)})" if known else ""
        raise SuiteNotFound(
            f"unknown suite {name!r} in "
            f"{plans_dir / 'suites'}{hint}{_path_hint(name) or _shipped_hint(name, plans_dir)}"
        )
    data = _read_yaml_mapping(path, "suite file")
    unknown = sorted(set(data) - SUITE_KEYS)
    if unknown:
        # a misspelt key (`fused_member`) is the usual cause: name the key it was likely meant as
        hint = did_you_mean(unknown, SUITE_KEYS)
        raise PlanError(f"suite {path}: unknown key(s) {', '.join(map(str, unknown))}{hint}")
    worker = _typed(path, data, "worker", (str,), None)
    if not worker or not worker.strip():
        raise PlanError(f"suite {path}: `worker` is required (lora, sim, or a command template)")
    check_text(f"suite {path} worker", worker)
    if worker.strip() not in ("lora", "sim"):
        parse_template(worker.strip())  # an unknown placeholder is refused here, at submit
    if data.get("mem_gib") is None:
        raise PlanError(f"suite {path}: `mem_gib` is required: the GiB one job needs, used until orch has "
                        "measured it (e.g. `mem_gib: 20`)")
    mem_gib = _typed(path, data, "mem_gib", (int, float), None)
    if not (0 < float(mem_gib) <= 4096):
        raise PlanError(f"suite {path}: `mem_gib` must be a number of GiB above 0 and at most 4096, not {mem_gib}")
    env_raw = _typed(path, data, "env", (dict,), {})
    env: dict[str, str] = {}
    for env_name, env_value in env_raw.items():
        if not isinstance(env_name, str) or not ENV_NAME_RE.fullmatch(env_name):
            raise PlanError(f"suite {path}: env name {env_name!r} is not a valid variable name")
        check_env_name(f"suite {path}: env", env_name)
        if not isinstance(env_value, (str, int, float, bool)):
            raise PlanError(f"suite {path}: env {env_name} must be a scalar")
        check_text(f"suite {path} env {env_name}", str(env_value))
        env[env_name] = str(env_value)
    configs = _load_configs(path, data, name)
    seen = {c.name for c in configs}
    rounds_raw = _typed(path, data, "rounds", (dict,), {})
    rounds: dict[str, tuple[str, ...]] = {}
    for round_name, members in rounds_raw.items():
        if not isinstance(round_name, str) or not SUITE_NAME_RE.fullmatch(round_name):
            raise PlanError(f"suite {path}: round name {round_name!r} is not valid (ASCII letters and digits, "
                            "then also '_', '.', '-'; at most 64 characters)")
        if not isinstance(members, list) or not members:
            raise PlanError(f"suite {path}: round {round_name} must list config names")
        for member in members:
            if member not in seen:
                raise PlanError(f"suite {path}: round {round_name} names unknown config {member!r}")
        rounds[round_name] = tuple(members)
    one_token = _typed(path, data, "one_token_tasks", (list,), [])
    if not all(isinstance(p, str) for p in one_token):
        raise PlanError(f"suite {path}: `one_token_tasks` must be a list of task patterns")
    ladder = _typed(path, data, "ladder", (list, str, dict), None)
    if ladder is not None:
        # A bad rung must be refused at submit, not found at the first OOM.
        from orchestrator.plans.ladder_spec import load_ladder

        try:
            load_ladder(ladder)
        except PlanError as exc:
            raise PlanError(f"suite {path}: {exc}") from None
    max_attempts = _typed(path, data, "max_attempts", (int,), 8)
    if not 1 <= max_attempts <= 100:
        raise PlanError(f"suite {path}: `max_attempts` must be between 1 and 100")
    max_resumes = _typed(path, data, "max_resumes", (int,), DEFAULT_MAX_RESUMES)
    if not 0 <= max_resumes <= 100:
        raise PlanError(f"suite {path}: `max_resumes` must be between 0 and 100")
    hang_timeout_s = parse_hang_timeout(path, data.get("hang_timeout_s", 1800.0))
    crash_loop = _parse_crash_loop(path, data.get("crash_loop", {}))
    notify_raw = _typed(path, data, "notify", (str, list), [])
    notify = [notify_raw] if isinstance(notify_raw, str) else notify_raw
    if not all(isinstance(u, str) and u.strip() for u in notify):
        raise PlanError(f"suite {path}: `notify` must be a notification URL or a list of them")
    for url in notify:
        check_text(f"suite {path} notify", url)
    memory_keys = _typed(path, data, "memory_keys", (list,), [])
    if not all(isinstance(k, str) and _CONFIG_KEY.fullmatch(k) for k in memory_keys) or len(memory_keys) > 100:
        raise PlanError(f"suite {path}: `memory_keys` must be a list of config key names")
    min_stack_gain = _typed(path, data, "min_stack_gain", (int, float), None)
    if min_stack_gain is not None and not (math.isfinite(min_stack_gain) and 0 <= min_stack_gain <= 1):
        raise PlanError(f"suite {path}: `min_stack_gain` must be a fraction between 0 and 1 (e.g. 0.10)")
    fail_on_divergence = _typed(path, data, "fail_on_divergence", (bool,), False)
    divergence_factor = _parse_divergence_factor(path, data.get("divergence_factor"))
    gpus = parse_count(data["gpus"], "gpus", f"suite {path}", MAX_GPUS) if data.get("gpus") is not None else 1
    cpus = parse_count(data["cpus"], "cpus", f"suite {path}", MAX_CPUS) if data.get("cpus") is not None else None
    for spec in configs:
        job_resources(spec.content, gpus, cpus, f"config {spec.path}")
    grid_keys = known_keys(worker.strip(), configs)
    grid = suite_grid(f"suite {path}", data.get("grid"), grid_keys, configs)
    pairs = suite_pairs(f"suite {path}", data.get("seeds"), data.get("tasks")) or []
    check_grid_size(f"suite {path}", grid, len(configs), max(1, len(pairs)))
    not_science = _typed(path, data, "not_science", (list,), [])
    if not all(isinstance(k, str) and _CONFIG_KEY.fullmatch(k) for k in not_science) or len(not_science) > 100:
        raise PlanError(f"suite {path}: `not_science` must be a list of config key names")
    early_stop = parse_early_stop(f"suite {path}", data["early_stop"]) if data.get("early_stop") is not None else None
    search = parse_search(f"suite {path}", data["search"], grid_keys, tuple(configs)) if data.get("search") else None
    if search is not None and data.get("grid"):
        raise PlanError(f"suite {path}: `search` and `grid` both choose values: keep one")
    share_base = parse_share_base(path, data.get("share_base"), worker.strip())
    return Suite(
        early_stop=early_stop,
        search=search,
        grid=grid,
        pairs=tuple(pairs),
        not_science=tuple(not_science),
        gpus=gpus,
        cpus=cpus,
        name=name,
        path=path.resolve(),
        worker=worker.strip(),
        mem_gib=float(mem_gib),
        env=env,
        configs=tuple(configs),
        rounds=rounds,
        one_token_tasks=tuple(one_token),
        ladder=ladder,
        max_attempts=max_attempts,
        max_resumes=max_resumes,
        hang_timeout_s=hang_timeout_s,
        description=str(data.get("description", "")),
        crash_loop=crash_loop,
        notify=tuple(u.strip() for u in notify),
        keys=parse_keys(data.get("keys"), f"suite {path}"),
        progress_regex=parse_regex(path, data, "progress_regex", required_group="step"),
        result_regex=parse_regex(path, data, "result_regex", required_group=None),
        memory_keys=tuple(memory_keys),
        min_stack_gain=None if min_stack_gain is None else float(min_stack_gain),
        slurm=_parse_slurm(path, data.get("slurm")),
        fail_on_divergence=fail_on_divergence,
        divergence_factor=divergence_factor,
        share_base=share_base,
        fused_members=parse_fused_members(path, data.get("fused_members"), share_base),
    )


def _load_configs(path: Path, data: dict[str, Any], name: str) -> list[ConfigSpec]:
    """`configs: [names]`, each read from `config_dir` (default configs/<suite>/NAME.yaml), or
    `configs: {name: {key: value}}` held inline in the suite file (relative paths in them are
    read from the suite file's folder)."""
    raw = _typed(path, data, "configs", (list, dict), None)
    if not raw:
        raise PlanError(f"suite {path}: `configs` must be a non-empty list of config names, "
                        "or a mapping of config name to its settings")
    if isinstance(raw, dict) and "config_dir" in data:
        raise PlanError(f"suite {path}: `config_dir` is for configs read from files; "
                        "these configs are inline")
    config_dir = path.parent / str(_typed(path, data, "config_dir", (str,), f"../configs/{name}"))
    configs: list[ConfigSpec] = []
    seen: set[str] = set()
    for config_name in raw:
        if not isinstance(config_name, str) or not _CONFIG_NAME.fullmatch(config_name):
            raise PlanError(f"suite {path}: config name {config_name!r} is not valid (ASCII letters and digits, "
                            "then also '_', '.', '+', '-'; at most 128 characters)")
        if config_name in seen:
            raise PlanError(f"suite {path}: config {config_name} is listed twice")
        seen.add(config_name)
        if isinstance(raw, dict):
            config_path, content = path, raw[config_name]
            if not isinstance(content, dict):
                raise PlanError(f"suite {path}: config {config_name} must be a mapping of "
                                "settings, e.g. {learning_rate: 0.0005}")
            where = f"suite {path}: config {config_name}"
        else:
            config_path = config_dir / f"{config_name}.yaml"
            content = _read_yaml_mapping(config_path, "config file")
            where = f"config {config_path}"
        if problem := config_problem(content):
            raise PlanError(f"{where}: {problem}")
        configs.append(ConfigSpec(config_name, config_path.resolve(), content))
    return configs


def _yaml_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else shown_repr(key)


def config_problem(value: Any, where: str = "") -> str | None:
    """What is wrong in a config (at any depth, lists included), or None: a mapping key that is
    not a string (a job's config is stored as JSON, which turns `{0: 1.0}` into `{"0": 1.0}`, so
    the script's `cfg["class_weights"].get(0)` would silently miss it), or a number that is not
    finite (`.nan`, `.inf`: refused as `--set` refuses them; JSON has no such numbers)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                shown = _yaml_key(key)
                if not where:
                    return f"key {shown} is not a string: quote it ('{shown}')"
                return f"{_path_said(where)} has a key {shown} that is not a string: quote it ('{shown}') or use a list"
            if found := config_problem(item, f"{where}.{key}" if where else key):
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if found := config_problem(item, f"{where}[{index}]"):
                return found
    elif isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return f"{_path_said(where)} is .nan: a value must be a finite number"
        shown = "-.inf" if value < 0 else ".inf"
        return (f"{_path_said(where)} is {shown}: a value must be a finite number (for no limit, a large "
                "number, or null where the script reads null so)")
    return None


def _path_said(where: str) -> str:
    return where if len(where) <= 120 and where.isprintable() else shown_value(where, 120)


def _parse_divergence_factor(path: Path, raw: Any) -> float | None:
    """`divergence_factor: K` (a last epoch above K × the run's minimum loss diverged; K >= 1),
    `off` (YAML reads it as false: only the first-steps rule), or absent (the default)."""
    if raw is None:
        return None
    if raw is False:
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not (math.isfinite(raw) and 1 <= raw <= 1e6):
        shown = str(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else shown_value(str(raw))
        raise PlanError(f"suite {path}: `divergence_factor` must be a number >= 1 or off, not {shown}")
    return float(raw)


def _parse_slurm(path: Path, raw: Any) -> dict[str, Any]:
    """Checked at submit, so a bad time limit or sbatch option never reaches the cluster."""
    if raw is None:
        return {}
    from orchestrator.plans.slurm_settings import parse_settings

    try:
        return parse_settings(raw, f"suite {path}").to_json()
    except UsageError as exc:
        raise PlanError(str(exc)) from None


_CRASH_LOOP_SHAPE = "`crash_loop` must be off or a mapping of failures, within_s, window_s"


def _parse_crash_loop(path: Path, raw: Any) -> CrashLoop:
    """`crash_loop: off` (YAML reads it as false), or a mapping whose missing keys keep the defaults."""
    if raw is False or (isinstance(raw, str) and raw.strip().lower() == "off"):
        return CRASH_LOOP_OFF
    if not isinstance(raw, dict):
        shown = shown_value(raw) if isinstance(raw, str) else repr(raw)
        raise PlanError(f"suite {path}: {_CRASH_LOOP_SHAPE}, not {shown}")
    unknown = sorted(str(k) for k in set(raw) - {"failures", "within_s", "window_s"})
    if unknown:
        raise PlanError(f"suite {path}: `crash_loop` has unknown key(s) {', '.join(unknown)} ({_CRASH_LOOP_SHAPE})")
    failures = raw.get("failures", CRASH_LOOP_FAILURES)
    if isinstance(failures, bool) or not isinstance(failures, int):
        raise PlanError(f"suite {path}: `crash_loop.failures` must be an integer (0 switches the guard off), "
                        f"not {type(failures).__name__}")
    if not 0 <= failures <= MAX_CRASH_LOOP_FAILURES:
        raise PlanError(f"suite {path}: `crash_loop.failures` must be between 0 (off) and {MAX_CRASH_LOOP_FAILURES}")
    seconds: dict[str, float] = {}
    for key, default in (("within_s", CRASH_LOOP_WITHIN_S), ("window_s", CRASH_LOOP_WINDOW_S)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PlanError(f"suite {path}: `crash_loop.{key}` must be a number of seconds, not {type(value).__name__}")
        if not (math.isfinite(value) and 0 < value <= MAX_CRASH_LOOP_S):
            raise PlanError(f"suite {path}: `crash_loop.{key}` must be between 0 and {MAX_CRASH_LOOP_S:.0f} seconds")
        seconds[key] = float(value)
    return CrashLoop(failures=failures, within_s=seconds["within_s"], window_s=seconds["window_s"])
