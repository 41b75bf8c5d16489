"""A resume waits until the job that wrote its checkpoint has stopped (a warm process may still
train it after its client was killed), and reads a checkpoint that still exists."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from workers.lora.resume_guard import (
    ResumeBlocked,
    holding_job,
    job_lock_path,
    resume_point,
    wait_until_stopped,
)
from workers.lora.share import SHARE_DIR_VAR


def _checkpoint(run_dir: Path, step: int, whole: bool = True) -> Path:
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if whole:
        (folder / "state.json").write_text(json.dumps({"step": step}))
    return folder


def test_a_resume_waits_while_a_warm_process_trains_the_job_and_goes_on_once_it_stopped(tmp_path: Path) -> None:
    env = {SHARE_DIR_VAR: str(tmp_path / ".warm")}
    run_dir = tmp_path / "runs" / "attempt-1"
    run_dir.mkdir(parents=True)
    training, release = threading.Event(), threading.Event()

    def warm_job() -> None:
        with holding_job(run_dir, env):
            training.set()
            release.wait(30)

    thread = threading.Thread(target=warm_job)
    thread.start()
    assert training.wait(10)
    lines: list[str] = []
    with pytest.raises(ResumeBlocked, match=r"did not stop within 0\.3 s"):
        wait_until_stopped(run_dir, env, lines.append, deadline_s=0.3)
    assert "waiting up to 0.3 s" in lines[0] and str(run_dir) in lines[0]

    started = time.monotonic()
    threading.Timer(0.5, release.set).start()
    wait_until_stopped(run_dir, env, lines.append, deadline_s=20)
    assert time.monotonic() - started >= 0.4  # it did wait for the release
    assert lines[-1].startswith("it stopped after")
    thread.join(10)
    assert not job_lock_path(tmp_path / ".warm", run_dir).exists()  # no lock file is left behind


def test_no_wait_without_a_share_folder_or_a_job_in_training(tmp_path: Path) -> None:
    lines: list[str] = []
    wait_until_stopped(tmp_path, {}, lines.append, deadline_s=0)
    wait_until_stopped(tmp_path, {SHARE_DIR_VAR: str(tmp_path / ".warm")}, lines.append, deadline_s=0)
    assert lines == []


def test_a_gone_checkpoint_is_replaced_by_a_later_whole_one_of_its_run_dir_and_said_so(tmp_path: Path) -> None:
    named = tmp_path / "checkpoint-3"
    assert resume_point(_checkpoint(tmp_path, 3)).note is None
    named.joinpath("state.json").unlink()
    named.rmdir()
    with pytest.raises(ResumeBlocked, match="no later whole checkpoint"):
        resume_point(named)
    _checkpoint(tmp_path, 2)  # older: never
    _checkpoint(tmp_path, 9, whole=False)  # a save cut short: never
    (tmp_path / "checkpoint-12").symlink_to(_checkpoint(tmp_path / "elsewhere", 12))  # not its own: never
    with pytest.raises(ResumeBlocked):
        resume_point(named)
    later = _checkpoint(tmp_path, 6)
    point = resume_point(named)
    assert point.checkpoint == later
    assert point.note is not None and str(named) in point.note and str(later) in point.note


def test_a_job_stopped_while_it_saves_keeps_its_older_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from workers.lora.checkpoint import LoopState, save_checkpoint
    from workers.lora.config import parse_config

    config = parse_config({"model": "tiny-llama", "data": "glue-tvt_rte", "data_dir": str(tmp_path)}, tmp_path, {})
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def save(step: int, stopped: bool) -> None:
        def check() -> None:
            if stopped:
                raise RuntimeError("stopped")

        save_checkpoint(tmp_path, LoopState(step=step), model, optimizer, scheduler, {}, config, check_stopped=check)

    save(3, stopped=False)
    save(6, stopped=False)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6"]
    with pytest.raises(RuntimeError):
        save(9, stopped=True)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-9"]
    assert (tmp_path / "checkpoint-9" / "state.json").is_file()


def test_the_worker_resumes_from_the_later_checkpoint_and_result_json_says_so(tmp_path: Path) -> None:
    from workers.lora.__main__ import _resume_point
    from workers.lora.config import ConfigError, parse_config

    run_dir = tmp_path / "attempt-1"
    raw = {"model": "tiny-llama", "data": "glue-tvt_rte", "data_dir": str(tmp_path),
           "resume_from_checkpoint": str(run_dir / "checkpoint-3")}  # fmt: skip
    config = parse_config(raw, tmp_path, {})
    with pytest.raises(ConfigError, match="checkpoint-3 is gone"):
        _resume_point(config)
    later = _checkpoint(run_dir, 6)
    used, record = _resume_point(config)
    assert used.resume_from_checkpoint == later
    assert record["resumed_from_checkpoint"] == str(later) and "checkpoint-3 is gone" in record["resume_note"]
