"""Resume: which workers take a checkpoint, how a template passes it, and finding it in run dirs
written by user code (symlinks never followed, bounded search, half-written saves skipped)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.errors import PlanError
from orchestrator.executors.checkpoints import MAX_DEPTH, find_in_run_dir, latest_checkpoint
from orchestrator.plans.keymap import NO_KEYS, parse_keys
from orchestrator.plans.resume import (
    resume_config,
    takes_resume_argument,
    takes_resume_key,
    worker_can_resume,
)
from orchestrator.plans.template import parse_template

HF_KEYS = parse_keys(
    {
        "batch_size": "per_device_train_batch_size",
        "resume_from_checkpoint": "resume_from_checkpoint",
    },
    "t",
)


def test_an_argument_using_resume_is_left_out_without_a_checkpoint() -> None:
    template = parse_template("python t.py --out {run_dir}/out --resume_from_checkpoint={resume} {resume}")
    names = {"run_dir": "/r/attempt-2"}
    assert template.fill({**names, "resume": ""}, {}) == ["python", "t.py", "--out", "/r/attempt-2/out"]
    assert template.fill(names, {}) == ["python", "t.py", "--out", "/r/attempt-2/out"]
    assert template.fill({**names, "resume": "/r/attempt-1/out/checkpoint-40"}, {}) == [
        "python", "t.py", "--out", "/r/attempt-2/out",
        "--resume_from_checkpoint=/r/attempt-1/out/checkpoint-40", "/r/attempt-1/out/checkpoint-40",
    ]


@pytest.mark.parametrize(
    ("worker", "keys", "config", "can"),
    [
        ("lora", NO_KEYS, {}, True),
        ("sim", NO_KEYS, {}, False),
        ("python t.py --resume={resume}", NO_KEYS, {}, True),
        ("python t.py --bs {cfg.batch_size}", NO_KEYS, {}, False),
        # a {config} script is given the key only where it is known to read it
        ("python t.py {config}", NO_KEYS, {}, False),
        ("python t.py {config}", HF_KEYS, {}, True),
        ("python t.py {config}", NO_KEYS, {"resume_from_checkpoint": None}, True),
        ("python t.py {config}", parse_keys({"resume_from_checkpoint": "ckpt"}, "t"), {}, True),
        ("python t.py --ckpt {cfg.resume_from_checkpoint}", NO_KEYS, {}, True),
        ("python t.py {cfg.resume_from_checkpoint?--resume}", NO_KEYS, {}, False),  # no path in a flag
        ("python t.py {nonsense}", NO_KEYS, {}, False),
    ],
)
def test_worker_can_resume(worker: str, keys: object, config: dict[str, object], can: bool) -> None:
    assert worker_can_resume(worker, keys, config) is can  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("worker", "argument", "key"),
    [
        ("lora", False, True),
        ("python t.py --resume={resume}", True, False),  # opted in by the argument only: no key in config.yaml
        ("python t.py --resume={resume} {config}", True, False),
        ("python t.py --ckpt {cfg.resume_from_checkpoint}", False, True),
        ("python t.py --r={resume} --ckpt {cfg.resume_from_checkpoint}", True, True),
    ],
)
def test_the_argument_and_the_key_are_told_apart(worker: str, argument: bool, key: bool) -> None:
    assert (takes_resume_argument(worker), takes_resume_key(worker, NO_KEYS, {})) == (argument, key)


def test_the_resume_key_goes_under_the_scripts_name() -> None:
    keys = parse_keys({"resume_from_checkpoint": "ckpt"}, "t")
    assert resume_config({"lr": 1}, keys, "/c") == {"lr": 1, "ckpt": "/c"}
    assert resume_config({"lr": 1}, NO_KEYS, "/c") == {"lr": 1, "resume_from_checkpoint": "/c"}
    assert HF_KEYS.to_json()["resume_from_checkpoint"] == "resume_from_checkpoint"  # kept: it opts in
    with pytest.raises(PlanError):
        parse_keys(
            {
                "resume_from_checkpoint": "per_device_train_batch_size",
                "batch_size": "per_device_train_batch_size",
            },
            "t",
        )


def _checkpoint(path: Path, *files: str) -> Path:
    path.mkdir(parents=True)
    for name in files or ("adapter.bin",):
        (path / name).write_text("x")
    return path


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    return root


def run_dir(runs: Path, n: int) -> Path:
    path = runs / "suite" / "000001-job" / f"attempt-{n}"
    path.mkdir(parents=True)
    return path


def test_the_highest_step_in_the_run_dir_or_an_output_dir_below_it(runs: Path) -> None:
    attempt = run_dir(runs, 1)
    _checkpoint(attempt / "checkpoint-5")
    _checkpoint(attempt / "out" / "checkpoint-40")
    _checkpoint(attempt / "out" / "checkpoint-200")
    (attempt / "out" / "checkpoint-300").mkdir()  # empty: nothing was saved in it
    (attempt / "checkpoint-999").write_text("a file, not a folder")
    found = find_in_run_dir(1, attempt)
    assert found is not None and (found.path, found.step) == (attempt / "out" / "checkpoint-200", 200)


def test_symlinks_are_never_followed(runs: Path, tmp_path: Path) -> None:
    attempt = run_dir(runs, 1)
    _checkpoint(attempt / "out" / "checkpoint-10")
    outside = _checkpoint(tmp_path / "elsewhere" / "checkpoint-500")
    os.symlink(outside, attempt / "checkpoint-500")
    _checkpoint(tmp_path / "other-out" / "checkpoint-700")
    os.symlink(tmp_path / "other-out", attempt / "linked-out")
    found = find_in_run_dir(1, attempt)
    assert found is not None and found.path == attempt / "out" / "checkpoint-10"
    linked = run_dir(runs, 2).parent / "attempt-3"
    os.symlink(attempt, linked)  # a run dir that is itself a link
    assert find_in_run_dir(3, linked) is None


def test_the_search_is_bounded_in_depth(runs: Path) -> None:
    attempt = run_dir(runs, 1)
    deep = attempt.joinpath(*[f"d{i}" for i in range(MAX_DEPTH)])
    _checkpoint(deep / "checkpoint-9")
    _checkpoint(attempt.joinpath(*[f"d{i}" for i in range(MAX_DEPTH - 1)]) / "checkpoint-2")
    found = find_in_run_dir(1, attempt)
    assert found is not None and found.step == 2


def test_a_trainer_save_that_died_half_way_is_skipped(runs: Path) -> None:
    attempt = run_dir(runs, 1)
    _checkpoint(attempt / "out" / "checkpoint-20", "model.safetensors", "trainer_state.json")
    _checkpoint(attempt / "out" / "checkpoint-30", "model.safetensors")  # trainer_state.json comes last
    found = find_in_run_dir(1, attempt)
    assert found is not None and found.step == 20


def test_the_latest_attempt_that_left_one_wins(runs: Path) -> None:
    first, second, third = run_dir(runs, 1), run_dir(runs, 2), run_dir(runs, 3)
    _checkpoint(first / "checkpoint-100")
    _checkpoint(second / "checkpoint-60")  # a later attempt's, though its step is lower
    found = latest_checkpoint([(1, first), (2, second), (3, third)])
    assert found is not None and (found.attempt_n, found.step) == (2, 60)
    (second / "checkpoint-60" / "adapter.bin").unlink()
    found = latest_checkpoint([(3, third), (1, first), (2, second)])
    assert found is not None and (found.attempt_n, found.path) == (1, first / "checkpoint-100")
    assert latest_checkpoint([(4, runs / "suite" / "000001-job" / "attempt-4")]) is None  # never made


def test_a_half_saved_checkpoint_of_a_later_attempt_loses_to_a_complete_one(runs: Path) -> None:
    first, second = run_dir(runs, 1), run_dir(runs, 2)
    _checkpoint(first / "out" / "checkpoint-100", "model.safetensors", "trainer_state.json")
    _checkpoint(second / "out" / "checkpoint-150", "model.safetensors")  # died mid-save: no marker
    found = latest_checkpoint([(1, first), (2, second)])
    assert found is not None and (found.attempt_n, found.step) == (1, 100)


def test_a_linked_marker_does_not_make_a_save_complete(runs: Path, tmp_path: Path) -> None:
    attempt = run_dir(runs, 1)
    _checkpoint(attempt / "checkpoint-10", "model.safetensors", "trainer_state.json")
    half = _checkpoint(attempt / "checkpoint-20", "model.safetensors")
    (tmp_path / "state.json").write_text("{}")
    os.symlink(tmp_path / "state.json", half / "trainer_state.json")
    found = find_in_run_dir(1, attempt)
    assert found is not None and found.step == 10


def test_checkpoints_are_visited_before_other_folders_and_a_cut_search_says_so(runs: Path) -> None:
    from orchestrator.executors.checkpoints import MAX_ENTRIES, search_checkpoints

    attempt = run_dir(runs, 1)
    clutter = attempt / "aaa-clutter"
    clutter.mkdir()
    for i in range(MAX_ENTRIES):
        (clutter / f"f{i}").mkdir()  # read in part: the budget runs out here
    _checkpoint(attempt / "out" / "checkpoint-7")
    search = search_checkpoints([(1, attempt)])
    assert search.checkpoint is not None and search.checkpoint.step == 7
    assert search.searched_in_part == (1,)


def test_a_succeeded_jobs_earlier_checkpoints_are_removed_without_following_links(runs: Path, tmp_path: Path) -> None:
    from orchestrator.executors.checkpoints import remove_checkpoints

    first = run_dir(runs, 1)
    _checkpoint(first / "checkpoint-5")
    _checkpoint(first / "out" / "checkpoint-10", "model.safetensors", "trainer_state.json")
    (first / "out" / "eval.json").write_text("{}")
    outside = _checkpoint(tmp_path / "elsewhere" / "checkpoint-7")
    os.symlink(outside, first / "checkpoint-7")
    os.symlink(tmp_path / "elsewhere", first / "out" / "linked")
    removed = remove_checkpoints([first])
    assert sorted(removed) == sorted([first / "checkpoint-5", first / "out" / "checkpoint-10"])
    assert not (first / "checkpoint-5").exists() and not (first / "out" / "checkpoint-10").exists()
    assert (first / "out" / "eval.json").exists() and (outside / "adapter.bin").exists()


def test_a_lora_checkpoint_counts_only_with_its_state_json(runs: Path) -> None:
    from orchestrator.executors.checkpoints import search_checkpoints
    from orchestrator.plans.resume import checkpoint_marker

    marker = checkpoint_marker("lora")
    assert marker == "state.json" and checkpoint_marker("python train.py {resume}") is None
    first = run_dir(runs, 1)
    _checkpoint(first / "checkpoint-20", "lora.pt", "optimizer.pt", "state.json")
    second = run_dir(runs, 2)
    # a removal killed half-way
    cut_short = _checkpoint(second / "checkpoint-30", "lora.pt", "optimizer.pt")
    found = search_checkpoints([(1, first), (2, second)], marker).checkpoint
    assert found is not None and (found.attempt_n, found.step) == (1, 20)
    assert search_checkpoints([(2, second)], marker).checkpoint is None
    # a link is no marker
    (cut_short / "state.json").symlink_to(first / "checkpoint-20" / "state.json")
    assert search_checkpoints([(2, second)], marker).checkpoint is None
    # a script of the user's own: no marker orch knows, so the folder is taken as it is
    assert search_checkpoints([(2, second)]).checkpoint is not None


def test_a_trainer_save_cut_short_is_skipped_even_where_no_other_is_whole(runs: Path) -> None:
    from orchestrator.executors.checkpoints import search_checkpoints

    first = run_dir(runs, 1)
    saved = ("model.safetensors", "training_args.bin")
    _checkpoint(first / "out" / "checkpoint-4", *saved)  # killed before trainer_state.json
    assert search_checkpoints([(1, first)]).checkpoint is None
    _checkpoint(first / "out" / "checkpoint-2", *saved, "trainer_state.json")
    found = search_checkpoints([(1, first)]).checkpoint
    assert found is not None and found.step == 2
    # a script's own checkpoint (no Trainer files) is taken as it is
    own = run_dir(runs, 2)
    _checkpoint(own / "checkpoint-6", "weights.pt")
    found = search_checkpoints([(2, own)]).checkpoint
    assert found is not None and found.path == own / "checkpoint-6"
