"""Config parsing, data names and formats, tvt splits, LoRA spec translation (no torch needed)."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from workers.lora.config import ConfigError, load_config, parse_config
from workers.lora.data import (
    example_id,
    find_source,
    load_splits,
    parse_data_name,
    read_split,
    split_train_val,
)
from workers.lora.peft_spec import lora_kwargs, translate_targets
from workers.lora.sample_data import main as sample_main

WORKER_DIR = Path(__file__).resolve().parents[1] / "workers"


def base(**extra: object) -> dict[str, object]:
    return {"model": "tiny-llama", "data": "glue_rte", **extra}


def test_defaults_warnings_and_orch_keys(tmp_path: Path) -> None:
    orch_keys = {"sim_mem_gib": 3, "mem_gib": 2, "orch_note": "x", "host_mem_gib": 8, "cpus": 2}
    config = parse_config(base(**orch_keys), tmp_path, {})
    assert config.batch_size == 8 and config.max_seq_len == 256 and config.num_epochs == 1
    assert config.logits_to_keep == 0 and config.prec == "bf16"
    joined = " ".join(config.warnings)
    assert "sim_mem_gib" not in joined and "mem_gib" not in joined and "orch_note" not in joined


def test_an_unknown_training_key_is_a_config_error(tmp_path: Path) -> None:
    # a misspelt key must not train with the default instead of what the researcher meant
    said = r"^unknown config key 'warmup_step' \(did you mean 'warmup_steps'\?\) \(known: .*warmup_steps"
    with pytest.raises(ConfigError, match=said):
        parse_config(base(warmup_step=100), tmp_path, {})
    said = r"^unknown config keys 'foo', 'warmup_step' \(did you mean 'warmup_steps' for 'warmup_step'\?\) \("
    with pytest.raises(ConfigError, match=said):
        parse_config(base(warmup_step=100, foo=1), tmp_path, {})


@pytest.mark.parametrize(
    ("key", "value"),
    [("batch_size", 0), ("batch_size", "x"), ("learning_rate", -1), ("prec", "fp8"),
     ("gradient_checkpointing", "maybe"), ("num_data_workers", -1), ("max_steps", 1.5)],
)  # fmt: skip
def test_bad_values_are_config_errors(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key if key != "prec" else "prec"):
        parse_config(base(**{key: value}), tmp_path, {})


def test_learning_rate_written_as_yaml_string(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("model: tiny-llama\ndata: glue_rte\nlearning_rate: 1e-4\n")
    assert load_config(tmp_path / "c.yaml", env={}).learning_rate == pytest.approx(1e-4)


def test_missing_model_dir_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model directory not found"):
        parse_config(base(model=str(tmp_path / "nope")), tmp_path, {})


def test_peft_path_resolution(tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "lora.json").write_text(json.dumps({"r": 4, "targets": ["q_proj"]}))
    config_dir = tmp_path / "run"
    config_dir.mkdir()
    config = parse_config(base(peft="../plans/lora.json"), config_dir, {})  # relative to the config
    assert config.peft == {"r": 4, "targets": ["q_proj"]}
    config = parse_config(base(peft=str(plans / "lora.json")), config_dir, {})
    assert config.peft == {"r": 4, "targets": ["q_proj"]}
    with pytest.raises(ConfigError, match="not found"):  # no variable names another folder
        parse_config(base(peft="lora.json"), config_dir, {"ORCH_PLANS_DIR": str(plans)})
    (config_dir / "lora.json").write_text(json.dumps({"r": 2}))
    assert parse_config(base(peft="lora.json"), config_dir, {}).peft == {"r": 2}
    with pytest.raises(ConfigError, match="not found"):
        parse_config(base(peft="missing.json"), config_dir, {})


def test_data_names() -> None:
    assert parse_data_name("glue-tvt_qnli").kind == "glue-tvt"
    parsed = parse_data_name("glue-tvt_sst2_1000")
    assert (parsed.task, parsed.subset) == ("sst2", 1000)
    assert parse_data_name("glue_mnli").subset is None
    for bad, message in (
        ("glue_stsb", "regression"),
        ("glue_foo", "unknown task"),
        ("rte", "not glue"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_data_name(bad)


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("glue")
    sample_main(["--out", str(out), "--n-train", "50", "--n-dev", "20"])
    return out


def test_every_sample_task_loads_from_tsv(toy_data: Path) -> None:
    assert find_source(toy_data, "mnli") == ("tsv", toy_data / "MNLI")
    for task, n_classes in (("rte", 2), ("qnli", 2), ("sst2", 2), ("mrpc", 2), ("cola", 2),
                            ("mnli", 3), ("qqp", 2), ("wnli", 2)):  # fmt: skip
        splits = load_splits(f"glue_{task}", toy_data)
        assert len(splits["train"]) == 50 and len(splits["val"]) == 20
        assert {e.label for e in splits["train"]} == set(range(n_classes)), task


def test_jsonl_matches_tsv(tmp_path: Path, toy_data: Path) -> None:
    sample_main(["--out", str(tmp_path), "--tasks", "qnli", "--n-train", "50", "--n-dev", "20",
                 "--format", "jsonl"])  # fmt: skip
    assert find_source(tmp_path, "qnli")[0] == "jsonl"
    assert load_splits("glue_qnli", tmp_path) == load_splits("glue_qnli", toy_data)


def test_tvt_split_is_deterministic_disjoint_and_seed_free(toy_data: Path) -> None:
    first = load_splits("glue-tvt_rte", toy_data)
    again = load_splits("glue-tvt_rte", toy_data)
    assert first == again
    assert (len(first["train"]), len(first["val"]), len(first["test"])) == (40, 10, 20)
    official = load_splits("glue_rte", toy_data)
    assert first["test"] == official["val"]
    train, val = split_train_val(official["train"])
    assert not set(train) & set(val)
    assert sorted(train + val, key=repr) == sorted(official["train"], key=repr)


def test_splits_follow_content_not_row_order(tmp_path: Path, toy_data: Path) -> None:
    """A JSON Lines copy of the data with its rows shuffled gives the same splits, in the same
    order (the epoch permutations index the same examples), for every kind of data name."""
    sample_main(["--out", str(tmp_path), "--tasks", "rte", "--n-train", "50", "--n-dev", "20", "--format", "jsonl"])
    path = tmp_path / "rte" / "train.jsonl"
    lines = path.read_text().splitlines()
    random.Random(7).shuffle(lines)
    path.write_text("\n".join(lines) + "\n")
    for name in ("glue-tvt_rte", "glue_rte", "glue-tvt_rte_7"):
        shuffled, original = load_splits(name, tmp_path), load_splits(name, toy_data)
        assert shuffled["train"] == original["train"] and shuffled["val"] == original["val"], name
    # the TSV's rows in file order: train is sorted by example id, not the file's first rows
    rows = read_split("tsv", toy_data / "RTE", "rte", "train")
    train = load_splits("glue-tvt_rte", toy_data)["train"]
    assert train == sorted(train, key=example_id) and train != rows[: len(train)]


def test_subset_takes_n_training_examples(toy_data: Path) -> None:
    splits = load_splits("glue-tvt_rte_7", toy_data)
    assert len(splits["train"]) == 7 and len(splits["val"]) == 10
    assert set(splits["train"]) <= set(load_splits("glue-tvt_rte", toy_data)["train"])


def test_missing_data_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data directory not found"):
        find_source(tmp_path / "nope", "rte")
    with pytest.raises(ConfigError, match="no data for 'rte'"):
        find_source(tmp_path, "rte")


def test_gla_targets_translate_for_llama() -> None:
    names, layers, warnings = translate_targets(
        ["attn.q_proj", "attn.k_proj", "mlp.gate_proj", "attn.g_proj", "attn.gk_proj.0"]
    )
    assert names == ["q_proj", "k_proj", "gate_proj"]
    assert layers is None
    assert "attn.g_proj" in warnings[0] and "gk_proj.0" in warnings[0]
    names, layers, _ = translate_targets(["layers.3.attn.q_proj", "layers.1.attn.v_proj"])
    assert (names, layers) == (["q_proj", "v_proj"], [1, 3])
    with pytest.raises(ConfigError, match="no LoRA target"):
        translate_targets(["attn.g_proj", "attn.gk_proj.1"])


def test_lora_kwargs_short_keys_and_no_env_overrides() -> None:
    spec = {
        "r": 8,
        "alpha": 16,
        "dropout": 0.1,
        "targets": ["attn.q_proj"],
        "use_dora": True,
        "junk": 1,
    }
    kwargs, warnings = lora_kwargs(spec, "llama", {"ORCH_LORA_R": "4", "ORCH_LORA_DROPOUT": "0"})
    assert kwargs == {"task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
                      "target_modules": ["q_proj"], "use_dora": True}  # fmt: skip
    assert any("junk" in w for w in warnings)
    assert "ORCH_LORA_R is not read: set the LoRA setting in the peft spec" in warnings
    gla, _ = lora_kwargs(spec, "gla", {})
    assert gla["target_modules"] == ["attn.q_proj"]  # GLA keeps its own names
    with pytest.raises(ConfigError):
        lora_kwargs({"r": 0}, "llama", {})


def test_worker_imports_only_the_run_dir_names_of_orchestrator() -> None:
    """The LoRA worker runs with the training stack only: of orchestrator it may use the
    dependency-free run-dir names and writer and the config key table, nothing else (and the
    table pulls in nothing of orch's own dependencies)."""
    allowed = {"orchestrator.rundir_files", "orchestrator.plans.lora_keys", "orchestrator.plans.lora_values",
               "orchestrator.attempts.divergence", "orchestrator.executors.provenance"}
    for path in (WORKER_DIR / "lora").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert all(n.split(".")[0] != "orchestrator" or n in allowed for n in names), path
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, orchestrator.plans.lora_keys, orchestrator.plans.lora_values, "
            "orchestrator.attempts.divergence, "
            "orchestrator.executors.provenance; print(' '.join(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not {"sqlite_utils", "psutil", "libtmux", "pynvml", "click", "torch"} & {m.split(".")[0] for m in loaded}


def test_mnli_mismatched_is_read_where_the_data_has_it(tmp_path: Path, toy_data: Path) -> None:
    sample_main(["--out", str(tmp_path), "--tasks", "mnli", "--n-train", "30", "--n-dev", "12", "--format", "jsonl"])
    from_jsonl, from_tsv = load_splits("glue-tvt_mnli", tmp_path), load_splits("glue-tvt_mnli", toy_data)
    assert len(from_jsonl["test_mismatched"]) == 12 and len(from_tsv["test_mismatched"]) == 20
    assert from_jsonl["test_mismatched"] != from_jsonl["test"]  # the other set, not matched again
    (tmp_path / "mnli" / "validation_mismatched.jsonl").unlink()  # a copy with the matched set only
    assert "test_mismatched" not in load_splits("glue_mnli", tmp_path)
    assert "test_mismatched" not in load_splits("glue-tvt_rte", toy_data)
