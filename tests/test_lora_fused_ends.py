"""`share_base: fused`: how members end when a batch-mate stops, when the process becomes unusable
and when memory runs out outside the shared forward. In process (FusedTrainer), on CPU, with the
tiny Llama.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.test_lora_fused import config, member, progress, train_group
from workers.harness import Heartbeat

pytest.importorskip("torch")
pytest.importorskip("peft")

pytestmark = [pytest.mark.train]


class RaiseAt(Heartbeat):
    """A heartbeat whose beat at step `at` calls `act` (sets a stop, raises)."""

    def __init__(self, run_dir: Path, at: int, act: Any) -> None:
        super().__init__(run_dir)
        self.at, self.act = at, act

    def beat(self, step: int, *args: Any, **kwargs: Any) -> None:
        super().beat(step, *args, **kwargs)
        if step == self.at and args[1] is not None:  # a step's line, not an evaluation's
            self.act()


def test_a_job_stopped_while_queued_or_waiting_ends_at_once_without_training(tmp_path: Path, data_dir: Path) -> None:
    from workers.lora.base_cache import BaseCache
    from workers.lora.fused import FusedTrainer

    ends: dict[str, int] = {}
    queued = member(tmp_path / "queued", config(data_dir, 1), ends)
    queued.stop.set()
    train_group([queued])
    assert ends == {"queued": 143} and not (tmp_path / "queued" / "result.json").exists()
    # a stop while it waits (to train alone): its stop's handler withdraws it; the trainer skips it
    waiting = member(tmp_path / "waiting", config(data_dir, 2), ends)
    assert waiting.withdraw() and not waiting.claim()
    trainer = FusedTrainer(BaseCache())
    trainer.waiting_solo.append((waiting, "DoRA"))
    trainer.run_solo()
    assert "waiting" not in ends and not (tmp_path / "waiting" / "progress.jsonl").exists()
    # one the trainer took up is not withdrawn: its stop is the trainer's to honour
    taken = member(tmp_path / "taken", config(data_dir, 3), ends)
    assert taken.claim() and not taken.withdraw()


def test_a_stop_is_honoured_before_a_batch_mates_evaluation(tmp_path: Path, data_dir: Path) -> None:
    ends: dict[str, int] = {}
    other = member(tmp_path / "other", config(data_dir, 2, eval_every_steps=1), ends)
    first = member(tmp_path / "first", config(data_dir, 1, eval_every_steps=1), ends,
                   heartbeat=lambda run_dir, stop: RaiseAt(run_dir, 1, other.stop.set))  # fmt: skip
    train_group([first, other])
    assert ends == {"first": 0, "other": 143}
    assert other.seen.is_set() and not (tmp_path / "other" / "result.json").exists()
    # it left at first's evaluation of step 1, before its own loss of that tick: no step 1
    lines = (tmp_path / "other" / "progress.jsonl").exists() and progress(tmp_path / "other")
    assert not [p for p in lines or [] if p[0] >= 1]


def test_an_unusable_process_ends_the_others_with_no_result(tmp_path: Path, data_dir: Path) -> None:
    from workers.lora.base_cache import BaseCache
    from workers.lora.fused import FusedTrainer
    from workers.lora.member import PROCESS_ENDED

    def broken() -> None:
        raise RuntimeError("the device is in a bad state")  # not the job's own: the process is unusable

    ends: dict[str, int] = {}
    culprit = member(tmp_path / "culprit", config(data_dir, 1), ends,
                     heartbeat=lambda run_dir, stop: RaiseAt(run_dir, 1, broken))  # fmt: skip
    innocent = member(tmp_path / "innocent", config(data_dir, 2), ends)
    dora = member(tmp_path / "dora", config(data_dir, 3, peft={"r": 4, "alpha": 8, "targets": ["q_proj"],
                                                            "use_dora": True}), ends)  # fmt: skip
    queued = member(tmp_path / "queued", config(data_dir, 4), ends)
    waves = [[queued], [culprit, innocent, dora]]
    trainer = FusedTrainer(BaseCache())
    assert not trainer.run(lambda idle: waves.pop() if waves else [])
    assert ends == {"culprit": 1, "innocent": PROCESS_ENDED, "dora": PROCESS_ENDED, "queued": PROCESS_ENDED}
    assert json.loads((tmp_path / "culprit" / "result.json").read_text())["status"] == "failed"
    assert not any((tmp_path / name / "result.json").exists() for name in ("innocent", "dora", "queued"))


def test_an_oom_in_a_members_own_step_or_the_batchs_concatenation_is_the_groups(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from workers.lora import fused

    def oom(*args: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    ends: dict[str, int] = {}
    own = member(tmp_path / "own", config(data_dir, 1), ends, heartbeat=lambda run_dir, stop: RaiseAt(run_dir, 1, oom))
    train_group([own, member(tmp_path / "mate", config(data_dir, 2), ends)])
    assert ends == {"own": 75, "mate": 75}
    assert capsys.readouterr().err.count("orch: fused group of 2 members ran out of memory") == 2
    assert not (tmp_path / "own" / "result.json").exists()
    monkeypatch.setattr(fused, "concatenate", oom)
    train_group([member(tmp_path / "x", config(data_dir, 3), ends), member(tmp_path / "y", config(data_dir, 4), ends)])
    assert ends["x"] == 75 and ends["y"] == 75


def test_threading_event_default_is_per_spec(tmp_path: Path, data_dir: Path) -> None:
    ends: dict[str, int] = {}
    a, b = member(tmp_path / "a", config(data_dir, 1), ends), member(tmp_path / "b", config(data_dir, 2), ends)
    assert a.seen is not b.seen and isinstance(a.seen, threading.Event)


def test_a_client_tries_the_next_slot_when_a_closing_process_breaks_its_pipe(tmp_path: Path) -> None:
    import socket

    from workers.lora.client import _fused_connection
    from workers.lora.share import messages, send, slot_paths

    folder, key = tmp_path / "warm", "0" * 16
    folder.mkdir()
    listeners = []
    for slot in (0, 1):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(slot_paths(folder, key, slot)[0]))
        listener.listen(1)
        listeners.append(listener)

    def closing() -> None:  # slot 0: a process leaving, it closes what it accepts unread
        conn, _ = listeners[0].accept()
        conn.close()

    def taking() -> None:
        conn, _ = listeners[1].accept()
        next(messages(conn))
        send(conn, {"accepted": {"pid": 7, "base_mem_mib": None}})

    threads = [threading.Thread(target=closing), threading.Thread(target=taking)]
    for thread in threads:
        thread.start()
    hello = {"job": {"pad": "x" * 4_000_000}, "fuse_max": 2}  # larger than the socket's buffer
    conn, where, answer = _fused_connection(folder, key, hello)
    assert conn is not None and where == f"{key}-1" and answer == {"accepted": {"pid": 7, "base_mem_mib": None}}
    conn.close()
    for thread in threads:
        thread.join(10)
    for listener in listeners:
        listener.close()


def test_the_peak_starts_over_when_the_groups_membership_changes(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.lora import fused

    sizes: list[int] = []
    trainer: list[Any] = []
    real_init = fused.FusedTrainer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        trainer.append(self)

    monkeypatch.setattr(fused.FusedTrainer, "__init__", init)
    monkeypatch.setattr(fused, "reset_peak", lambda device: sizes.append(len(trainer[0].members)))
    ends: dict[str, int] = {}
    short = member(tmp_path / "short", config(data_dir, 1, max_steps=2), ends)
    train_group([short, member(tmp_path / "long", config(data_dir, 2), ends)])
    assert ends == {"short": 0, "long": 0}
    assert sizes == [1, 2, 1]  # each join, then the short one's leaving; none when the last leaves
