"""What an attempt's reported history keeps: every earlier point of a progress.jsonl with one
line too long to be a record, no value moved to another step, a final metric never written over
a logged point, and curves of a script that prints no step placed at its epoch."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.attempts.history_follow import HistoryFollower
from orchestrator.attempts.history_points import JsonLines, record_points
from orchestrator.attempts.printed_metrics import StdoutProgress
from orchestrator.store.history import iter_history
from tests.test_metric_history import _store


def _line(record: dict[str, object]) -> str:
    return json.dumps(record) + "\n"


def test_a_line_over_the_first_reads_size_loses_no_earlier_point(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        run_dir = tmp_path / "a1"
        run_dir.mkdir()
        huge = _line({"step": 4, "loss": 9.0, "pad": "x" * (5 * 1024 * 1024)})
        text = "".join(_line({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)) + huge
        (run_dir / "progress.jsonl").write_text(text + _line({"step": 5, "loss": 0.1}))
        follower = HistoryFollower(store)
        follower.collect(1, run_dir)  # the daemon's first look at a new attempt
        follower.collect(1, run_dir)
        loss = {p.step: p.value for p in iter_history(store) if p.key == "loss"}
        assert loss == {
            1.0: 1.0,
            2.0: 0.5,
            3.0: 1.0 / 3,
            5.0: 0.1,
        }  # only the oversized line skipped


def test_an_ended_attempt_never_read_before_keeps_its_first_and_last_points(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        run_dir = tmp_path / "a1"
        run_dir.mkdir()
        lines = [
            _line({"step": s, "loss": 1.0, "pad": "x" * 200}) for s in range(1, 40_001)
        ]  # ~9 MiB
        (run_dir / "progress.jsonl").write_text("".join(lines))
        HistoryFollower(store).finish(1, run_dir)  # a short attempt: ended before any pass read it
        steps = {p.step for p in iter_history(store) if p.key == "loss"}
        assert min(steps) == 1.0 and max(steps) == 40_000.0


def test_json_lines_skip_a_line_too_long_whole_even_across_chunks() -> None:
    lines = JsonLines()
    assert lines.feed(_line({"step": 1, "loss": 1.0}) + '{"step": 2, "loss": 5, "pad": "') == [
        record_points({"step": 1, "loss": 1.0})[0]
    ]
    assert lines.feed("y" * 70000) == []
    # the end of the long line is not read as a record of its own, the next line is
    assert [p.step for p in lines.feed('", "x": 1}\n{"step": 3, "loss": 0.5}\n')] == [3.0]
    assert [p.step for p in lines.feed('{"loss": 1}\n{"step": 4, "loss": 1}\n')] == [4.0]


def test_a_value_whose_step_is_not_a_number_is_never_moved_to_another_step() -> None:
    parser = StdoutProgress()
    parser.feed(
        "{'step': 10, 'loss': 1.0}\n{'step': 'n/a', 'loss': 7.0}\n{'step': 2.5, 'loss': 8.0}\n"
    )
    parser.feed("{'global_step': -1, 'loss': 9.0}\n{'step': 11, 'loss': 0.9}\n")
    assert sorted((p.step, p.value) for p in parser.take_points(flush=True)) == [
        (10.0, 1.0),
        (11.0, 0.9),
    ]
    regex = StdoutProgress.with_regex(r"it (?P<step>\S+) loss (?P<loss>[0-9.]+)")
    regex.feed("it 3 loss 1.5\nit three loss 2.5\n")
    assert [(p.step, p.value) for p in regex.take_points(flush=True)] == [(3.0, 1.5)]
    assert record_points({"step": "7", "loss": 1.0}) == []


def test_a_script_printing_no_step_has_its_curve_at_its_epochs() -> None:
    parser = StdoutProgress()
    parser.feed(
        "{'loss': 2.0, 'epoch': 0.5}\n{'loss': 1.0, 'epoch': 1.0}\n{'eval_loss': 0.9, 'epoch': 1.0}\n"
    )
    parser.feed("{'loss': 0.5, 'iteration': 300}\n")
    points = {(p.key, p.step): p.value for p in parser.take_points(flush=True)}
    assert points == {
        ("loss", 0.5): 2.0,
        ("loss", 1.0): 1.0,
        ("eval_loss", 1.0): 0.9,
        ("loss", 300.0): 0.5,
    }
    plain = StdoutProgress()
    plain.feed("{'loss': 0.5}\n{'loss': 0.4}\n")  # no step, no epoch: the line's ordinal
    assert [(p.step, p.value) for p in plain.take_points(flush=True)] == [(1.0, 0.5), (2.0, 0.4)]
    assert [p.step for p in record_points({"epoch": 2, "loss": 0.3})] == [2.0]
    assert [p.step for p in record_points({"global_step": 40, "loss": 0.3})] == [40.0]


def test_final_metrics_never_overwrite_a_logged_point(tmp_path: Path) -> None:
    """The LoRA worker logs val scores as it evaluates and reports the best (at best_step) in
    result.json: the val curve ends at its last logged value, the best is a key of its own."""
    with _store(tmp_path) as store:
        run_dir = tmp_path / "a1"
        run_dir.mkdir()
        (run_dir / "progress.jsonl").write_text(
            _line({"step": 10, "loss": 1.0, "val": {"accuracy": 0.8}})
            + _line({"step": 20, "loss": 0.9, "val": {"accuracy": 0.6}})
        )
        (run_dir / "result.json").write_text(
            json.dumps(
                {
                    "status": "succeeded",
                    "best_step": 10,
                    "steps": 20,
                    "metrics": {"val": {"accuracy": 0.8}, "test": {"accuracy": 0.7}},
                }
            )
        )
        HistoryFollower(store).finish(1, run_dir)
        points = {(p.key, p.step): p.value for p in iter_history(store) if p.key != "loss"}
        assert points == {
            ("val_accuracy", 10.0): 0.8,
            ("val_accuracy", 20.0): 0.6,
            ("best_val_accuracy", 10.0): 0.8,
            ("test_accuracy", 20.0): 0.7,
        }
