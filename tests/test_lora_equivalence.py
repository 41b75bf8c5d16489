"""What each ladder rung keeps, measured the way a researcher publishes: bf16 (the LoRA worker's
default), LoRA dropout 0.05 on q, v and lm_head, 100 optimizer steps on RTE with a quarter of the
training labels flipped (so scores are neither 0 nor 1 and can move), a validation every 5 steps.

Each rung declared exact gives the same losses bit for bit, the same validation history, the same
best step and the same val and test scores as level 0. Halving the micro-batch and doubling the
accumulation does not, even without dropout: bf16 sums the gradient in another order."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.noisy_rte import flip_every_fourth_label, numerics_config
from orchestrator.plans.ladder_spec import load_ladder
from orchestrator.prediction.ladder import expand_levels

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from workers.lora import train  # noqa: E402
from workers.lora.config import parse_config  # noqa: E402

pytestmark = pytest.mark.train

# the sample GLUE data of the data_dir fixture (tests/conftest.py): 48 train / 12 val, 40 test
SAMPLE_GLUE = ("rte", 60, 40)
STEPS = 100
EVAL_EVERY = 5


@dataclass(frozen=True)
class Numbers:
    losses: list[float]
    val_history: list[dict[str, float]]  # every validation, in order
    best_step: int
    metrics: dict[str, dict[str, float]]  # best val and its test


@pytest.fixture(scope="module")
def noisy_data(data_dir: Path) -> Path:
    """Flip every fourth training label: the task stays learnable but not perfectly."""
    return flip_every_fourth_label(data_dir)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: the machine's cores are shared, and the numbers must not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def train_numbers(
    noisy_data: Path, tmp_path_factory: pytest.TempPathFactory, one_thread: None
) -> Callable[..., Numbers]:
    cache: dict[str, Numbers] = {}

    def run(dropout: float = 0.05, **rung: Any) -> Numbers:
        raw = numerics_config(noisy_data, steps=STEPS, eval_every_steps=EVAL_EVERY, prec="bf16", seed=1,
                              dropout=dropout) | rung  # fmt: skip
        name = json.dumps(raw, sort_keys=True)
        if name not in cache:
            run_dir = tmp_path_factory.mktemp("run")
            outcome = train.run(parse_config(raw, run_dir, {}), run_dir, train.Heartbeat(run_dir),
                                lambda _: None)  # fmt: skip
            beats = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
            cache[name] = Numbers(outcome.losses, [b["val"] for b in beats if "val" in b],
                                  outcome.best_step, outcome.metrics)  # fmt: skip
        return cache[name]

    return run


def test_level_zero_is_a_run_whose_scores_can_move(train_numbers: Callable[..., Numbers]) -> None:
    level_zero = train_numbers()
    assert len(level_zero.losses) == STEPS and len(level_zero.val_history) == STEPS // EVAL_EVERY
    val_scores = {v["accuracy"] for v in level_zero.val_history}
    assert len(val_scores) > 1  # validation moves over the run: an equal history says something
    assert 0 < level_zero.metrics["test"]["accuracy"] < 1


@pytest.mark.parametrize(
    "rung",
    [
        {"gradient_checkpointing": True},
        {"logits_to_keep": 1},  # lm_head has LoRA with dropout: its input is the last position only
        {"num_data_workers": 2},  # level 0 loads in-process; the (seed, epoch) order is the same
        {"gradient_checkpointing": True, "logits_to_keep": 1},  # the default ladder's first rung
    ],
    ids=["checkpointing", "logits_to_keep", "data_workers", "checkpointing+logits_to_keep"],
)
def test_an_exact_rung_gives_the_same_numbers_in_bf16_with_dropout(
    train_numbers: Callable[..., Numbers], rung: dict[str, Any]
) -> None:
    level_zero, at_rung = train_numbers(), train_numbers(**rung)
    assert at_rung.losses == level_zero.losses  # bit for bit, all 100 steps
    assert at_rung.val_history == level_zero.val_history
    assert at_rung.best_step == level_zero.best_step
    assert at_rung.metrics == level_zero.metrics  # val and test


def test_running_alone_changes_nothing_the_worker_receives() -> None:
    """`run_alone` is a placement: its level gives the worker the config of the level before it,
    and a run repeated at one config is bit-equal (test_an_exact_rung_..., every rung against
    the one level-0 run; tests/test_lora_numerics.py runs one config twice)."""
    levels = expand_levels(load_ladder(None), {"batch_size": 8, "num_data_workers": 2}, True)
    alone = next(level for level in levels if level.run_alone)
    before = levels[alone.index - 1]
    assert alone.changes == {} and alone.overrides == before.overrides and not before.run_alone


def test_half_batch_double_accumulation_is_not_bit_equal_in_bf16(
    train_numbers: Callable[..., Numbers],
) -> None:
    """Without dropout, so masks cannot be the cause: each half is padded to its own longest
    prompt and goes through bf16 matmuls of another shape, and two halves' gradients are added
    where level 0 computes one. The losses part at the first step and never meet again, and the
    scores a researcher would publish move (on this seed: best step, val and test)."""
    level_zero = train_numbers(dropout=0.0)
    halved = train_numbers(dropout=0.0, batch_size=4, gradient_accumulation_steps=2)
    assert halved.losses[0] == pytest.approx(level_zero.losses[0], rel=1e-5)  # same data, weights
    assert sum(a != b for a, b in zip(halved.losses, level_zero.losses, strict=True)) > STEPS * 0.9
    assert (halved.val_history, halved.best_step, halved.metrics) != (
        level_zero.val_history, level_zero.best_step, level_zero.metrics)  # fmt: skip
