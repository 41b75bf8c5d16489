"""An attempt's metric history: points from progress.jsonl lines and printed output, kept in the
database one value per (attempt, key, step), bounded by min/max downsampling, and stitched
across attempts by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.api.curves import as_csv, as_json, curve_points, stitch
from orchestrator.attempts.history_follow import HistoryFollower
from orchestrator.attempts.history_points import JsonLines, final_points, record_points
from orchestrator.attempts.printed_metrics import StdoutProgress
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.store.bulk_history import PastAttempt, PastJob, write_history
from orchestrator.store.db import Store
from orchestrator.store.history import HistoryPoint, iter_history, record_history
from orchestrator.store.history_bounds import MAX_KEYS, Point, downsample
from tests.conftest import OrchRunner


def _store(tmp_path: Path, attempts: int = 1) -> Store:
    store = Store(tmp_path / "state.db")
    jobs = [PastJob(1, "id1", "E1", "c1", "c1.yaml", 1, "rte", "sim", 1024, JobState.SUCCEEDED, 10.0,
                    max_attempts=3, hang_timeout_s=60.0)]  # fmt: skip
    rows = [PastAttempt(n, 1, n, 0, "GPU-0", 0, str(tmp_path / f"a{n}"), 900, 0, 800, 20.0 + n, 30.0 + n,
                        AttemptOutcome.SUCCEEDED) for n in range(1, attempts + 1)]  # fmt: skip
    write_history(store, jobs, rows, [], [], gpus=[], heartbeat_at=40.0)
    return store


def test_a_progress_line_gives_every_metric_at_its_step_and_nested_ones_flattened() -> None:
    points = record_points({"t": 1.0, "step": 7, "total": 40, "loss": 0.5, "lr": 1e-4, "grad_norm": 2.0,
                            "samples_per_s": 9.0, "val": {"accuracy": 0.8, "f1": float("nan")}, "bad": True})
    assert {(p.step, p.key, p.value) for p in points} == {
        (7.0, "loss", 0.5), (7.0, "lr", 1e-4), (7.0, "grad_norm", 2.0), (7.0, "val_accuracy", 0.8)}
    assert record_points({"loss": 0.5}) == []  # no step: not a point
    assert final_points({"val": {"accuracy": 0.7}, "test": {"accuracy": 0.6}}, 40.0) == [
        Point(40.0, "val_accuracy", 0.7), Point(40.0, "test_accuracy", 0.6)]


def test_json_lines_fed_in_chunks_keep_a_partial_line_for_later() -> None:
    lines = JsonLines()
    assert [p.step for p in lines.feed('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')] == [1.0]
    assert [p.step for p in lines.feed('ss": 1.5}\nnot json\n')] == [2.0]
    mid = JsonLines(skip_first=True)
    assert [p.step for p in mid.feed('p": 9, "loss": 1}\n{"step": 10, "loss": 1}\n')] == [10.0]


# What a Hugging Face Trainer prints under a terminal (tmux): tqdm's bar redrawn with carriage
# returns at most every few steps (so it lags), and every log dict through tqdm.write: the bar
# cleared, the dict on a line of its own, the bar drawn again at the current step. Log dicts every
# 5 steps, an evaluation bar and eval dict every 20, the summary at the end.
def hf_trainer_output(steps: int = 40, log_every: int = 5, eval_every: int = 20, eval_batches: int = 4) -> str:
    def bar(step: int, total: int = steps) -> str:
        return f"\r {100 * step // total}%|###  | {step}/{total} [00:0{step % 10}<00:10,  4.00it/s]"

    def write(line: str, step: int) -> str:
        return "\r" + " " * 40 + "\r" + line + "\n" + bar(step)

    out = []
    for step in range(1, steps + 1):
        if step % 3 == 0:
            out.append(bar(step))  # redrawn now and then: the bar before a dict may be behind
        if step % log_every == 0:
            out.append(write(f"{{'loss': {2.0 - step / 40:.4f}, 'grad_norm': 1.5, "
                             f"'learning_rate': {5e-5 * (1 - step / steps)}, 'epoch': {step / steps:.2f}}}", step))
        if step % eval_every == 0:
            out += ["\n" + bar(k, eval_batches) for k in range(1, eval_batches + 1)]
            out.append("\r" + " " * 40 + "\r\x1b[A")  # the evaluation bar cleared
            out.append(
                write(
                    f"{{'eval_loss': {1.9 - step / 100}, 'eval_accuracy': {0.5 + step / 100}, "
                    f"'eval_runtime': 0.5, 'eval_samples_per_second': 64.0, 'epoch': {step / steps:.2f}}}",
                    step,
                )
            )
    out.append(
        "\n"
        + write(
            "{'train_runtime': 10.0, 'train_samples_per_second': 32.0, 'train_loss': 1.5, 'epoch': 1.0}",
            steps,
        )
    )
    return "".join(out)


@pytest.mark.parametrize("eval_batches", [4, 63])  # an evaluation bar longer than training too
def test_printed_trainer_dicts_become_points_at_the_training_bars_step(eval_batches: int) -> None:
    parser = StdoutProgress()
    text = hf_trainer_output(eval_batches=eval_batches)
    for start in range(0, len(text), 333):  # chunks cut anywhere, as a pass reads them
        parser.feed(text[start:start + 333])
    points = parser.take_points(flush=True)
    losses = sorted((p.step, p.value) for p in points if p.key == "loss")
    assert [s for s, _ in losses] == [5.0 * k for k in range(1, 9)]
    assert losses[0][1] == 2.0 - 5 / 40
    assert sorted(p.step for p in points if p.key == "eval_accuracy") == [20.0, 40.0]
    assert {p.key for p in points} == {"loss", "grad_norm", "learning_rate", "eval_loss", "eval_accuracy", "train_loss"}
    assert parser.take_points() == []  # taken once


def test_downsampling_keeps_the_ends_and_every_buckets_extremes() -> None:
    points = [(float(i), 1.0) for i in range(1000)]
    points[333] = (333.0, 50.0)  # a spike
    points[777] = (777.0, -50.0)  # a dip
    kept = downsample(points, 100)
    assert len(kept) <= 100
    assert kept[0] == (0.0, 1.0) and kept[-1] == (999.0, 1.0)
    assert (333.0, 50.0) in kept and (777.0, -50.0) in kept
    assert [s for s, _ in kept] == sorted(s for s, _ in kept)
    assert downsample(points[:50], 100) == points[:50]


def test_the_store_keeps_one_value_per_step_a_bounded_history_and_few_keys(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        record_history(store, 1, [Point(float(s), "loss", float(s % 7)) for s in range(1, 301)], cap=100)
        record_history(store, 1, [Point(5.0, "loss", 99.0)])  # read again: the last value wins, no duplicate
        loss = [p for p in iter_history(store) if p.key == "loss"]
        assert len(loss) <= 100
        assert loss[0].step == 1.0 and loss[-1].step == 300.0
        assert {p.value for p in loss} >= {0.0, 6.0}  # the extremes survive the thinning
        many = [Point(1.0, f"k{i}", 1.0) for i in range(MAX_KEYS + 10)]
        record_history(store, 1, many)
        assert len({p.key for p in iter_history(store)}) == MAX_KEYS


def test_the_follower_reads_progress_as_it_grows_and_a_new_one_adds_nothing_twice(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        run_dir = tmp_path / "a1"
        run_dir.mkdir()
        progress = run_dir / "progress.jsonl"
        progress.write_text(
            "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 11))
            + '{"step": 11'
        )
        follower = HistoryFollower(store)
        assert follower.collect(1, run_dir) == 10
        with progress.open("a") as handle:
            handle.write(', "loss": 0.05}\n')
        assert follower.collect(1, run_dir) == 1
        (run_dir / "result.json").write_text(
            json.dumps({"status": "succeeded", "metrics": {"test": {"accuracy": 0.9}}})
        )
        HistoryFollower(store).finish(1, run_dir)  # a restarted daemon reads the file again
        rows = list(iter_history(store))
        assert len([p for p in rows if p.key == "loss"]) == 11
        assert HistoryPoint(1, 1, 11.0, "test_accuracy", 0.9) in rows


def test_stitching_lets_a_later_attempt_win_from_its_first_step() -> None:
    first = [HistoryPoint(1, 1, float(s), "loss", 1.0) for s in range(1, 13)]  # died at 12, checkpoint at 10
    second = [HistoryPoint(1, 2, float(s), "loss", 2.0) for s in range(11, 21)]
    restarted = [HistoryPoint(2, 1, float(s), "loss", 1.0) for s in range(1, 6)] + [
        HistoryPoint(2, 2, float(s), "loss", 2.0) for s in range(1, 4)]
    points, takeovers = stitch(first + second + restarted)
    job1 = [(p.attempt, p.step) for p in points if p.job == 1]
    assert job1 == [(1, float(s)) for s in range(1, 11)] + [(2, float(s)) for s in range(11, 21)]
    assert [(p.attempt, p.step) for p in points if p.job == 2] == [(2, 1.0), (2, 2.0), (2, 3.0)]
    assert [(t.job, t.attempt, t.step) for t in takeovers] == [(1, 2, 11.0), (2, 2, 1.0)]


def test_curves_as_tidy_csv_and_json(tmp_path: Path) -> None:
    with _store(tmp_path, attempts=2) as store:
        record_history(store, 1, [Point(1.0, "loss", 2.0), Point(2.0, "loss", 1.5)])
        record_history(store, 2, [Point(2.0, "loss", 1.4), Point(3.0, "=cmd", 1.0)])
        points = curve_points(store, jobs=[1], stitched=True)
        assert as_csv(points).splitlines() == ["job,attempt,step,key,value", "1,1,1,loss,2.0", "1,2,3,\"'=cmd\",1.0",
                                               "1,2,2,loss,1.4"]  # fmt: skip
        rows = json.loads(as_json(curve_points(store, keys=["loss"])))
        assert rows == [{"job": 1, "attempt": 1, "step": 1, "key": "loss", "value": 2.0},
                        {"job": 1, "attempt": 1, "step": 2, "key": "loss", "value": 1.5},
                        {"job": 1, "attempt": 2, "step": 2, "key": "loss", "value": 1.4}]


def test_a_dict_printed_after_a_bar_without_a_line_end_takes_that_bars_step() -> None:
    parser = StdoutProgress()
    parser.feed(" 10%|#   | 4/40 [00:01<00:09]\r 12%|#   | 5/40 [00:01<00:09]{'loss': 2.5, 'epoch': 0.1}\n")
    assert parser.take_points() == [Point(5.0, "loss", 2.5)]


def test_orch_curves_refuses_an_unknown_job_or_suite_in_one_line(orch_inproc: OrchRunner, db_path: Path) -> None:
    _store(db_path.parent).close()
    done = orch_inproc("curves", "--job", "1", "--job", "7")
    assert done.rc == 2 and done.stderr.strip() == "orch: error: no job 7 (see `orch jobs`)"
    done = orch_inproc("curves", "--suite", "../x")
    assert done.rc == 2 and "--suite '../x' is not a suite name" in done.stderr and "Traceback" not in done.stderr
    done = orch_inproc("curves", "--format", "xml")
    assert done.rc == 2 and "xml" in done.stderr
    assert orch_inproc("curves", "--job", "1").stdout == "job,attempt,step,key,value\n"  # no point yet


def test_orch_curves_refuses_a_key_the_chosen_jobs_never_reported(orch_inproc: OrchRunner, db_path: Path) -> None:
    with _store(db_path.parent) as store:
        assert orch_inproc("curves", "--key", "nope").rc == 0  # no history at all: nothing to name
        record_history(store, 1, [Point(1.0, "loss", 2.0), Point(1.0, "lr", 1e-4)])
    done = orch_inproc("curves", "--key", "loss", "--key", "nope")
    assert done.rc == 2 and done.stdout == ""
    assert (
        done.stderr.strip()
        == "orch: error: --key 'nope': no such metric in the chosen jobs' history (known: loss, lr)"
    )
    assert orch_inproc("curves", "--key", "loss").stdout.count("\n") == 2  # the header and the one point


def test_early_stopping_reads_what_it_needs_of_a_history_by_seeks(tmp_path: Path) -> None:
    from orchestrator.plans.early_stop import Mode
    from orchestrator.scheduling.early_stop import value_at
    from orchestrator.store.early_stop import metric_last_steps, metric_points_at, reached_steps

    with _store(tmp_path, attempts=2) as store:
        record_history(store, 1, [Point(float(s), "val_accuracy", s / 100) for s in range(5, 101, 5)])
        record_history(store, 2, [Point(90.0, "val_accuracy", 0.5), Point(110.0, "val_accuracy", 0.6),
                                  Point(130.0, "loss", 1.0)])  # resumed: its value wins at step 90
        assert metric_last_steps(store, [1], "val_accuracy") == {1: 110.0}
        assert metric_last_steps(store, [1], "f1") == {}
        assert reached_steps(store, [1]) == {1: 130.0}
        sparse = metric_points_at(store, [1], "val_accuracy", [12.0, 36.0, 92.0])[1]
        assert sparse == {10.0: 0.1, 35.0: 0.35, 90.0: 0.5, 110.0: 0.6}
        assert [value_at(sparse, s) for s in (12.0, 36.0, 92.0, 111.0)] == [0.1, 0.35, 0.5, None]
        # smooth_evals: the last 3 distinct steps at or before each rung step, attempt 2's at 90
        window = metric_points_at(store, [1], "val_accuracy", [12.0, 92.0], last_n=3)[1]
        assert window == {5.0: 0.05, 10.0: 0.1, 80.0: 0.8, 85.0: 0.85, 90.0: 0.5, 110.0: 0.6}
        assert value_at(window, 92.0, 3) == pytest.approx((0.8 + 0.85 + 0.5) / 3)
        # value: best: each rung step's best value at or before it, among the values no later
        # attempt reported again (attempt 1's 0.9 at step 90 was reported again by attempt 2)
        highest = metric_points_at(store, [1], "val_accuracy", [12.0, 92.0], best_of=Mode.MAX)[1]
        assert highest == {10.0: 0.1, 85.0: 0.85, 90.0: 0.5, 110.0: 0.6}
        assert value_at(highest, 92.0, best_of=Mode.MAX) == 0.85
        # attempt 1's 0.95 and 1.0 at steps 95 and 100 came after attempt 2 began (step 90): replaced
        later = metric_points_at(store, [1], "val_accuracy", [110.0], best_of=Mode.MAX)[1]
        assert value_at(later, 110.0, best_of=Mode.MAX) == 0.85  # not 1.0
        lowest = metric_points_at(store, [1], "val_accuracy", [92.0], best_of=Mode.MIN)[1]
        assert lowest == {5.0: 0.05, 90.0: 0.5, 110.0: 0.6} and value_at(lowest, 92.0, best_of=Mode.MIN) == 0.05


def test_a_prune_never_overrides_a_stop_already_asked(tmp_path: Path) -> None:
    from orchestrator.lifecycle import KillRequest
    from orchestrator.store.control import request_stop
    from orchestrator.store.early_stop import prune_jobs
    from orchestrator.store.queries import get_job, live_attempt

    with _store(tmp_path) as store:
        with store.write():  # the job back to running, its attempt live (a test's shortcut)
            store._db.execute("UPDATE jobs SET state = 'running' WHERE id = 1")
            store._db.execute("UPDATE attempts SET outcome = NULL, ended_at = NULL WHERE job_id = 1")
        request_stop(store, 1, KillRequest.CANCEL)
        record = {"step": 4, "metric": "val_accuracy", "value": 0.5, "rank": 2, "of": 2, "rule": "asha"}
        assert prune_jobs(store, [1], record, "pruned at step 4") == ([], [])
        assert get_job(store, 1).pruned == {}
        attempt = live_attempt(store, 1)
        assert attempt is not None and attempt.kill_requested is KillRequest.CANCEL


def test_the_daemon_judges_value_best_on_each_seeds_best_so_far(tmp_path: Path) -> None:
    """The daemon's early-stopping step reads `value: best` histories from the store: a setting
    whose loss bumps at the rung is told its best so far, and is not the one stopped."""
    from orchestrator.daemon.early_stop import EarlyStopper
    from orchestrator.store.early_stop import read_rungs

    store = Store(tmp_path / "state.db")
    jobs = [PastJob(j, f"id{j}", "E1", "c1", "c1.yaml", 1, "rte", "sim", 1024, JobState.RUNNING, 10.0,
                    max_attempts=3, hang_timeout_s=60.0) for j in range(1, 5)]  # fmt: skip
    rows = [PastAttempt(j, j, 1, 0, "GPU-0", 0, str(tmp_path / f"a{j}"), 900, 0, 800, 20.0) for j in range(1, 5)]
    write_history(store, jobs, rows, [], [], gpus=[], heartbeat_at=40.0)
    rule = {"metric": "val_loss", "mode": "min", "rule": "asha", "min_steps": 48, "reduction_factor": 3,
            "value": "best"}  # fmt: skip
    with store.write():
        for j in range(1, 5):  # four settings of one seed each: four learning rates
            store.execute("UPDATE jobs SET early_stop_json = ?, overrides_json = ? WHERE id = ?",
                          [json.dumps(rule), json.dumps({"learning_rate": j / 1000}), j])  # fmt: skip
    bumped = [Point(32.0, "val_loss", 0.40), Point(48.0, "val_loss", 0.80), Point(64.0, "val_loss", 0.35)]
    record_history(store, 1, bumped)
    for j in range(2, 5):
        record_history(store, j, [Point(32.0, "val_loss", 0.60), Point(48.0, "val_loss", 0.58 + j / 100),
                                  Point(64.0, "val_loss", 0.55)])  # fmt: skip
    with store:
        EarlyStopper(store).check()
        told = {r.setting.split(" ", 1)[1]: r.value for r in read_rungs(store, "E1", "rte", rule) if r.rung == 0}
        assert told['{"learning_rate": 0.001}'] == pytest.approx(0.40)  # its best so far, not its 0.80
        rows = store.query("SELECT id, pruned_json FROM jobs")
        stopped = [j for j in rows if j["pruned_json"] not in (None, "{}", "null")]
        assert stopped and all(json.loads(j["pruned_json"])["seed_value"] == "best" for j in stopped)
        assert 1 not in {j["id"] for j in stopped}


def test_a_suite_resubmitted_with_another_rule_is_judged_on_that_rule_s_rungs_alone(tmp_path: Path) -> None:
    """Rung values told under one early_stop rule (min_steps 48) are other steps than another
    rule's (min_steps 32): once the newest job carries the new rule, the old values are neither
    read back into the pruner nor kept, and the settings are told again at the new rule's rungs."""
    from orchestrator.daemon.early_stop import EarlyStopper
    from orchestrator.store.early_stop import read_rungs

    store = Store(tmp_path / "state.db")
    jobs = [PastJob(j, f"id{j}", "E1", "c1", "c1.yaml", 1, "rte", "sim", 1024, JobState.RUNNING, 10.0,
                    max_attempts=3, hang_timeout_s=60.0) for j in range(1, 6)]  # fmt: skip
    rows = [PastAttempt(j, j, 1, 0, "GPU-0", 0, str(tmp_path / f"a{j}"), 900, 0, 800, 20.0) for j in range(1, 6)]
    write_history(store, jobs, rows, [], [], gpus=[], heartbeat_at=40.0)
    old = {"metric": "val_loss", "mode": "min", "rule": "asha", "min_steps": 48, "reduction_factor": 3}
    new = {**old, "min_steps": 32}
    with store.write():
        for j in range(1, 6):  # five settings of one seed each
            store.execute("UPDATE jobs SET early_stop_json = ?, overrides_json = ? WHERE id = ?",
                          [json.dumps(old), json.dumps({"learning_rate": j / 1000}), j])  # fmt: skip
    for j in range(1, 6):
        record_history(store, j, [Point(32.0, "val_loss", 0.6 - j / 100), Point(48.0, "val_loss", 0.5 - j / 100),
                                  Point(64.0, "val_loss", 0.4 - j / 100)])  # fmt: skip
    with store:
        EarlyStopper(store).check()
        assert {r.step for r in read_rungs(store, "E1", "rte", old)} == {48.0}
        with store.write():  # the suite resubmitted: its newest job carries the new rule
            store.execute("UPDATE jobs SET early_stop_json = ? WHERE id = 5", [json.dumps(new)])
        EarlyStopper(store).check()
        assert read_rungs(store, "E1", "rte", old) == []
        told = read_rungs(store, "E1", "rte", new)
        assert told and {(r.rung, r.step) for r in told} == {(0, 32.0)}
        assert [r.value for r in told if r.setting.endswith('{"learning_rate": 0.005}')] == [pytest.approx(0.55)]
