"""The early-stopping benchmark's replay of recorded learning curves (benchmarks/recorded_curves.py,
benchmarks/early_stop_sim.py `--curves recorded`): the committed recording is a whole grid, each
benchmark seed draws its 3 seeds per setting reproducibly, and a damaged recording is refused."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks.recorded_curves import RECORDED, RecordingError, load


def test_the_committed_recording_is_a_whole_grid_of_histories() -> None:
    recorded = load(RECORDED)
    assert len(recorded.learning_rates) == 11 and recorded.ranks == [4, 8, 16, 32]
    assert len(recorded.curves) == 44 and recorded.seeds() >= 6
    assert recorded.steps // recorded.eval_every >= 20  # at least 20 evaluations per run
    finals = sorted(recorded.true_final(s) for s in recorded.curves)
    # learnable, not saturated: the settings' finals are graded, none at 1.0
    assert finals[-1] < 0.95 and finals[-1] - finals[0] > 0.1 and len(set(finals)) > 30


def test_a_benchmark_seed_draws_the_same_seeds_and_queue_every_time() -> None:
    recorded = load(RECORDED)
    first = recorded.draw(random.Random(7), shuffled=True)
    again = recorded.draw(random.Random(7), shuffled=True)
    other = recorded.draw(random.Random(8), shuffled=True)
    assert [(d.setting, d.curve) for d in first] == [(d.setting, d.curve) for d in again]
    assert [(d.setting, d.curve) for d in first] != [(d.setting, d.curve) for d in other]
    assert len(first) == 132
    settings = [d.setting for d in first]
    assert settings[::3] != list(recorded.curves)  # shuffled, setting by setting
    for index in range(0, 132, 3):
        group = first[index : index + 3]
        assert len({d.setting for d in group}) == 1
        recorded_seeds = recorded.curves[group[0].setting]
        drawn = [recorded_seeds.index(d.curve) for d in group]
        assert len(set(drawn)) == 3  # without replacement
    assert [d.setting for d in recorded.draw(random.Random(7), shuffled=False)][::3] == list(
        recorded.curves
    )


def test_the_replay_runs_through_the_decision_core(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import early_stop_sim

    assert early_stop_sim.main(["--seeds", "1", "--no-search", "--explain", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["curves"] == "recorded" and summary["min_steps"] == 48 and summary["steps"] == 480
    )
    assert 0 < summary["early_stop_gpu_hours_mean"] < summary["full_grid_gpu_hours"] == 132


def test_a_damaged_recording_is_refused(tmp_path: Path) -> None:
    document = json.loads(RECORDED.read_text(encoding="utf-8"))
    document["runs"][5]["val"] = document["runs"][5]["val"][:-1]  # a history cut short
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(RecordingError, match="not evaluated every"):
        load(path)
    document = json.loads(RECORDED.read_text(encoding="utf-8"))
    document["runs"] = [run for run in document["runs"] if run["seed"] > 5]
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(RecordingError, match="fewer than 3 seeds"):
        load(path)
    path.write_text(
        json.dumps({"steps": 480, "eval_every_steps": 16, "learning_rates": ["x"]}),
        encoding="utf-8",
    )
    with pytest.raises(RecordingError, match="not a recording"):
        load(path)


def test_the_recording_holds_each_runs_validation_loss_and_the_replay_judges_it_as_a_minimum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import early_stop_sim

    losses, accuracies = load(RECORDED, "loss"), load(RECORDED)
    assert losses.metric == "val_loss" and losses.mode.value == "min" and accuracies.metric == "val_accuracy"
    assert losses.curves.keys() == accuracies.curves.keys()
    # held negated (higher is better in the benchmark): the best is the lowest recorded final loss
    document = json.loads(RECORDED.read_text(encoding="utf-8"))
    finals: dict[str, list[float]] = {}
    for run in document["runs"]:
        finals.setdefault(f"lr={run['lr']:.3g} r={run['r']}", []).append(run["val_loss"][-1][1])
    lowest = min(finals, key=lambda s: sum(finals[s]) / len(finals[s]))
    assert max(losses.curves, key=losses.true_final) == lowest
    assert all(v < 0 for seed in losses.curves[lowest] for v in seed)
    # early, the loss ranks the settings as their ends do far better than accuracy does
    assert rank_agreement(losses, 48) > 0.8 > 0 > rank_agreement(accuracies, 48)
    assert early_stop_sim.main(["--seeds", "1", "--no-search", "--metric", "loss", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["metric"] == "val_loss" and summary["mode"] == "min"
    assert 0 < summary["early_stop_gpu_hours_mean"] < summary["full_grid_gpu_hours"]


def test_a_recording_without_loss_histories_is_refused_for_the_loss(tmp_path: Path) -> None:
    document = json.loads(RECORDED.read_text(encoding="utf-8"))
    for run in document["runs"]:
        del run["val_loss"]
    path = tmp_path / "accuracy-only.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert len(load(path).curves) == 44  # accuracy still replays
    with pytest.raises(RecordingError, match=r"no val_loss history .*record again"):
        load(path, "loss")


def rank_agreement(recorded: Any, step: int) -> float:
    """Spearman's correlation of the settings' mean value at `step` with their true finals."""
    settings = list(recorded.curves)
    index = step // recorded.eval_every - 1
    at = [sum(seed[index] for seed in recorded.curves[s]) / len(recorded.curves[s]) for s in settings]
    final = [recorded.true_final(s) for s in settings]
    return pearson(ranks(at), ranks(final))


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    for position, index in enumerate(order):
        result[index] = float(position)
    return result


def pearson(a: list[float], b: list[float]) -> float:
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    covariance = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    spread = (sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b)) ** 0.5
    return covariance / spread


def test_the_loss_replay_says_a_gap_is_above_and_the_family_has_no_loss(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import early_stop_sim

    assert early_stop_sim.main(["--seeds", "1", "--no-search", "--metric", "loss"]) == 0
    assert "above the grid best's by" in capsys.readouterr().out
    assert early_stop_sim.main(["--seeds", "1", "--no-search"]) == 0
    assert "below the grid best's by" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        early_stop_sim.main(["--curves", "parametric", "--metric", "loss"])
    assert refused.value.code == 2 and "the recorded curves only" in capsys.readouterr().err


def test_the_replay_judges_each_seed_on_its_best_so_far(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import early_stop_sim

    assert early_stop_sim.main(["--seeds", "1", "--no-search", "--metric", "loss", "--value", "best"]) == 0
    assert "value best" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        early_stop_sim.main(["--value", "best", "--smooth-evals", "3"])
    assert refused.value.code == 2 and "choose one" in capsys.readouterr().err
