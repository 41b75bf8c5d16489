"""Run dir, worker env and argv preparation: no text concatenation, no shell."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import UsageError
from orchestrator.executors.run_dir import build_argv, build_worker_env, prepare_run_dir


def test_prepare_run_dir_writes_yaml_and_private_env(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "job1" / "a1"
    config = {"model": "gla-1.3b", "lr": 1e-4, "note": "a: b\n- c", "nested": {"k": [1, 2]}}
    prepare_run_dir(run_dir, config, {"A": "1", "ODD": "x'y\"z $(rm -rf /)"})
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "env.json").stat().st_mode) == 0o600
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == config
    assert json.loads((run_dir / "env.json").read_text())["ODD"] == "x'y\"z $(rm -rf /)"
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]  # no temp files left



def test_a_run_dir_left_by_an_earlier_database_is_moved_aside_not_read(tmp_path: Path) -> None:
    # after `rm state.db`, job 1 of the new database gets job 1's old attempt dir: its
    # result.json would be read as the new attempt's outcome
    run_dir = tmp_path / "runs" / "suite" / "000001-cfg-s1-rte" / "attempt-1"
    assert prepare_run_dir(run_dir, {"model": "old"}, {}) is None
    (run_dir / "result.json").write_text('{"status": "ok"}')
    (run_dir / "checkpoint.bin").write_bytes(b"weights")
    assert prepare_run_dir(run_dir, {"model": "new"}, {}) == run_dir.with_name("attempt-1.stale-1")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "env.json"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == {"model": "new"}
    kept = run_dir.with_name("attempt-1.stale-1")
    assert (kept / "checkpoint.bin").read_bytes() == b"weights"  # user output is kept
    assert yaml.safe_load((kept / "config.yaml").read_text()) == {"model": "old"}

    (run_dir / "result.json").write_text("{}")
    assert prepare_run_dir(run_dir, {}, {}) == run_dir.with_name("attempt-1.stale-2")
    empty = tmp_path / "runs" / "suite" / "000002-cfg-s1-rte" / "attempt-1"
    empty.mkdir(parents=True)
    assert prepare_run_dir(empty, {}, {}) is None  # an empty dir is taken as it is


def test_prepare_run_dir_rejects_bad_env_before_writing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'BAD-NAME'"):
        prepare_run_dir(tmp_path / "r", {}, {"BAD-NAME": "1"})
    assert not (tmp_path / "r" / "env.json").exists()


def test_worker_env() -> None:
    env = build_worker_env(
        gpu_uuid="GPU-1234",
        gpu_index=3,
        seed=87,
        suite_env={"OMP_NUM_THREADS": "4", "HF_HOME": "/data/hf"},
        extra={"ORCH_JOB_ID": "12"},
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1234"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["MKL_NUM_THREADS"] == "1"
    assert env["OMP_NUM_THREADS"] == "4"  # the suite's own env wins over our default
    assert env["ORCH_SEED"] == env["PYTHONHASHSEED"] == "87"
    assert env["HF_HOME"] == "/data/hf" and env["ORCH_JOB_ID"] == "12"
    assert "ORCH_SEED" not in build_worker_env(
        gpu_uuid="u", gpu_index=0, seed=None, suite_env={}, extra={}
    )


@pytest.mark.parametrize(
    ("suite_env", "match"),
    [({"1X": "a"}, "'1X'"), ({"A B": "a"}, "'A B'"), ({"A": "x\0y"}, "NUL"), ({"": "a"}, "''")],
)
def test_worker_env_validation(suite_env: dict[str, str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        build_worker_env(gpu_uuid="u", gpu_index=0, seed=1, suite_env=suite_env, extra={})


def test_argv_for_our_workers(tmp_path: Path) -> None:
    cfg, run = tmp_path / "config.yaml", tmp_path / "run"
    for worker, module in (("lora", "workers.lora"), ("sim", "workers.sim")):
        assert build_argv(worker, config_path=cfg, run_dir=run, values={}) == [
            sys.executable,
            "-m",
            module,
            "--config",
            str(cfg),
            "--run-dir",
            str(run),
        ]


def test_argv_template_substitutes_inside_tokens_without_a_shell(tmp_path: Path) -> None:
    cfg = tmp_path / "dir with space" / "config.yaml"
    argv = build_argv(
        "python train_gla_only.py --cfg {config} --out={run_dir}/ckpt --seed {seed} "
        "--name 'job {job} on {data}' --overwrite",
        config_path=cfg,
        run_dir=tmp_path / "r",
        values={"seed": "87", "data": "glue; rm -rf ~ $(id)", "job": "5"},
    )
    assert argv == [
        "python",
        "train_gla_only.py",
        "--cfg",
        str(cfg),
        f"--out={tmp_path / 'r'}/ckpt",
        "--seed",
        "87",
        "--name",
        "job 5 on glue; rm -rf ~ $(id)",
        "--overwrite",
    ]


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("python t.py {cfg}", "unknown placeholder {cfg}"),
        ("python t.py {config.__class__}", "unknown placeholder"),
        ("python t.py {0}", "unknown placeholder"),
        ("python t.py {config!r}", "unknown placeholder"),
        ("python t.py {config", "invalid worker command"),
        ("python 'unclosed", "invalid worker command"),
        ("   ", "empty worker command"),
        ("python t.py --data {data}", "has no value"),
    ],
)
def test_argv_template_errors(template: str, match: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=match):
        build_argv(template, config_path=tmp_path / "c.yaml", run_dir=tmp_path, values={})


def test_argv_template_literal_braces(tmp_path: Path) -> None:
    argv = build_argv(
        "python -c 'print({{1: 2}})'", config_path=tmp_path, run_dir=tmp_path, values={}
    )
    assert argv == ["python", "-c", "print({1: 2})"]
