"""`share_base: fused`: jobs of one base train at once in one process, each row routed to its own
adapter. In process (FusedTrainer), on CPU, with the tiny Llama; and one end-to-end run through a
fused warm process and its clients' sockets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.noisy_rte import numerics_config
from tests.lora_runs import wait_listening
from workers.harness import Heartbeat

pytest.importorskip("torch")
pytest.importorskip("peft")

pytestmark = [pytest.mark.train]

REPO = Path(__file__).resolve().parents[1]
SAMPLE_GLUE = ("rte", 60, 40)


def config(data_dir: Path, seed: int, prec: str = "fp32", **changes: Any) -> dict[str, Any]:
    raw = numerics_config(data_dir, steps=6, eval_every_steps=3, prec=prec, seed=seed, dropout=0.1)
    return raw | changes


WIDE: dict[str, Any] = {  # another rank, other targets, another rate and micro-batch
    "peft": {"r": 4, "alpha": 4, "dropout": 0.1, "targets": ["q_proj", "k_proj", "o_proj"]},
    "learning_rate": 5e-3, "batch_size": 4, "gradient_accumulation_steps": 2,
}  # fmt: skip


def member(run_dir: Path, raw: dict[str, Any], ends: dict[str, int], **kwargs: Any) -> Any:
    from workers.lora.member import MemberSpec

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    return MemberSpec(run_dir, run_dir / "config.yaml", done=lambda code: ends.update({run_dir.name: code}), **kwargs)


def train_group(specs: list[Any], later: dict[int, list[Any]] | None = None) -> Any:
    """Train `specs` as one group; `later[k]`: members that join before tick k."""
    from workers.lora.base_cache import BaseCache
    from workers.lora.fused import FusedTrainer

    trainer = FusedTrainer(BaseCache())
    waves, ticks = [list(specs)], [0]

    def admit(idle: bool) -> list[Any] | None:
        ticks[0] += 1
        joining = (waves.pop() if waves else []) + (later or {}).pop(ticks[0], [])
        return joining or (None if idle and not later else [])

    assert trainer.run(admit)
    return trainer


def progress(run_dir: Path, val_loss: bool = True) -> list[tuple[Any, ...]]:
    """(step, loss, grad norm, val scores) of each line; `val_loss=False`: the val scores without
    their loss (see val_losses)."""
    lines = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [(p["step"], p.get("loss"), p.get("grad_norm"), _val(p.get("val"), val_loss)) for p in lines]


def _val(scores: dict[str, float] | None, val_loss: bool) -> dict[str, float] | None:
    return scores if scores is None or val_loss else {k: v for k, v in scores.items() if k != "loss"}


def val_losses(run_dir: Path) -> list[float]:
    lines = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [p["val"]["loss"] for p in lines if p.get("val")]


def weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_a_member_trains_alike_whatever_its_batch_mates(tmp_path: Path, data_dir: Path) -> None:
    """One job with B (same settings, another rate) and with C (other rank, targets, rate and
    micro-batch; another seed, so other prompt lengths pad the fused batch): in fp32 on CPU its
    every training loss, validation score and final weight are bit-equal; its gradient norms
    agree to 1e-6 (bit-equal on one CPU, 6.6e-8 relative apart at the last step on an AVX2 AMD
    EPYC, where a stack of one and a stack of two take other matmul paths) and the validation
    loss too (it shows the padding's rounding, which the others do not). In bf16 they are
    within 1e-4 (relative) of each other: measured 3.6e-5 against the C group, whose longer
    prompts pad the member's rows further (extra left padding alone changes bf16 numbers on CPU).
    With batch-mates that pad it no further, bf16 is bit-equal too (the ejection test)."""
    ends: dict[str, int] = {}
    for prec in ("fp32", "bf16"):
        solo_config = config(data_dir, 1, prec, no_save=False)
        train_group([member(tmp_path / f"a1-{prec}", solo_config, ends),
                     member(tmp_path / f"b-{prec}", config(data_dir, 1, prec, learning_rate=1e-3), ends)])
        train_group([member(tmp_path / f"a2-{prec}", solo_config, ends),
                     member(tmp_path / f"c-{prec}", config(data_dir, 2, prec, **WIDE), ends)])  # fmt: skip
    assert set(ends.values()) == {0}
    with_b, with_c = progress(tmp_path / "a1-fp32", val_loss=False), progress(tmp_path / "a2-fp32", val_loss=False)
    assert [(step, loss, scores) for step, loss, _, scores in with_b] == \
        [(step, loss, scores) for step, loss, _, scores in with_c]
    assert [norm for *_, norm, _ in with_b] == pytest.approx([norm for *_, norm, _ in with_c], rel=1e-6)
    # the validation loss, a sum over every answer's log-probability, shows the padding's rounding
    # (a later step's weights differ in their last bits): measured 1.6e-7 relative
    assert val_losses(tmp_path / "a1-fp32") == pytest.approx(val_losses(tmp_path / "a2-fp32"), rel=1e-6)
    assert same_weights(weights(tmp_path / "a1-fp32"), weights(tmp_path / "a2-fp32"))
    assert progress(tmp_path / "a1-fp32") != progress(tmp_path / "b-fp32")  # the test can fail
    one, other = progress(tmp_path / "a1-bf16"), progress(tmp_path / "a2-bf16")
    assert [p[1] for p in one] == pytest.approx([p[1] for p in other], rel=1e-4)
    result = json.loads((tmp_path / "a2-fp32" / "result.json").read_text())
    assert result["share_base"] == "fused" and result["fused_members_max"] == 2
    assert result["lora"]["r"] == 8 and result["trainable_params"] > 0


def test_a_diverging_member_is_ejected_and_the_others_train_as_without_it(tmp_path: Path, data_dir: Path) -> None:
    """bf16; the diverging member has A's seed (so its prompts pad the batch no further)."""
    ends: dict[str, int] = {}
    a, b = config(data_dir, 1, "bf16", no_save=False), config(data_dir, 2, "bf16", no_save=False)
    train_group([member(tmp_path / "a", a, ends), member(tmp_path / "b", b, ends),
                 member(tmp_path / "nan", config(data_dir, 1, "bf16", learning_rate=1e30), ends)])
    train_group([member(tmp_path / "a0", a, ends), member(tmp_path / "b0", b, ends)])  # fmt: skip
    assert ends == {"a": 0, "b": 0, "nan": 1, "a0": 0, "b0": 0}
    failed = json.loads((tmp_path / "nan" / "result.json").read_text())
    assert failed["status"] == "failed" and failed["error"].startswith("NonFiniteLoss: loss is nan at optimizer step")
    for name in ("a", "b"):
        assert progress(tmp_path / name) == progress(tmp_path / f"{name}0")
        assert same_weights(weights(tmp_path / name), weights(tmp_path / f"{name}0"))


def test_fused_numbers_are_close_to_the_job_alone_not_bit_equal(tmp_path: Path, data_dir: Path) -> None:
    from workers.lora.__main__ import run_attempt

    ends: dict[str, int] = {}
    raw = config(data_dir, 1, "bf16")
    train_group([member(tmp_path / "fused", raw, ends), member(tmp_path / "mate", config(data_dir, 2, "bf16"), ends)])
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "config.yaml").write_text(yaml.safe_dump(raw))
    assert run_attempt(alone, alone / "config.yaml").exit_code == 0
    fused, solo = progress(tmp_path / "fused"), progress(alone)
    assert [p[1] for p in fused] == pytest.approx([p[1] for p in solo], rel=1e-3)
    assert "share_base" not in json.loads((alone / "result.json").read_text())


class StopAt(Heartbeat):
    """A heartbeat that stops its job after its step `at` (as a stop message would)."""

    def __init__(self, run_dir: Path, stop: threading.Event, at: int) -> None:
        super().__init__(run_dir)
        self.stop, self.at = stop, at

    def beat(self, step: int, *args: Any, **kwargs: Any) -> None:
        super().beat(step, *args, **kwargs)
        if step >= self.at:
            self.stop.set()


def test_a_stopped_member_leaves_and_the_others_finish(tmp_path: Path, data_dir: Path) -> None:
    ends: dict[str, int] = {}
    stopped = member(tmp_path / "stopped", config(data_dir, 1, checkpoint_every_steps=1), ends,
                     heartbeat=lambda run_dir, stop: StopAt(run_dir, stop, 2))  # fmt: skip
    train_group([stopped, member(tmp_path / "other", config(data_dir, 2), ends)])
    assert ends == {"stopped": 143, "other": 0}
    assert not (tmp_path / "stopped" / "result.json").exists()
    assert max(p[0] for p in progress(tmp_path / "stopped")) == 2
    # it left at the next tick, saving nothing more (the checkpoint of step 2 was taken before)
    assert sorted(p.name for p in (tmp_path / "stopped").glob("checkpoint-*")) == ["checkpoint-2"]
    assert json.loads((tmp_path / "other" / "result.json").read_text())["steps"] == 6


def test_dora_trains_alone_after_the_group_and_says_so(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ends: dict[str, int] = {}
    dora = config(data_dir, 1, peft={"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "use_dora": True})
    apart = config(data_dir, 3, gradient_checkpointing=True)  # another group key, handed over anyway
    train_group([member(tmp_path / "plain", config(data_dir, 2), ends), member(tmp_path / "dora", dora, ends),
                 member(tmp_path / "apart", apart, ends)])  # fmt: skip
    assert ends == {"dora": 0, "plain": 0, "apart": 0}
    result = json.loads((tmp_path / "dora" / "result.json").read_text())
    assert result["share_base"] == "sequential" and "DoRA" in result["fused_fallback"]
    assert "share_base: fused: DoRA (use_dora) trains alone in the process (sequential)" in capsys.readouterr().err
    assert "gradient_checkpointing" in json.loads((tmp_path / "apart" / "result.json").read_text())["fused_fallback"]
    assert json.loads((tmp_path / "plain" / "result.json").read_text())["share_base"] == "fused"


def test_a_group_oom_ends_every_member_with_75_and_a_lone_oom_is_ordinary(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from workers.lora import fused

    def oom(*args: Any, **kwargs: Any) -> list[float]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(fused, "forward_backward", oom)
    ends: dict[str, int] = {}
    train_group([member(tmp_path / "x", config(data_dir, 1), ends), member(tmp_path / "y", config(data_dir, 2), ends)])
    assert ends == {"x": 75, "y": 75}
    assert capsys.readouterr().err.count("orch: fused group of 2 members ran out of memory") == 2
    train_group([member(tmp_path / "z", config(data_dir, 3), ends)])
    assert ends["z"] == 3 and json.loads((tmp_path / "z" / "result.json").read_text())["status"] == "oom"


def test_members_join_a_running_group_and_leave_when_done(tmp_path: Path, data_dir: Path) -> None:
    ends: dict[str, int] = {}
    late = member(tmp_path / "late", config(data_dir, 2, max_steps=3), ends)
    train_group([member(tmp_path / "first", config(data_dir, 1), ends)], later={4: [late]})
    assert ends == {"first": 0, "late": 0}
    assert json.loads((tmp_path / "late" / "result.json").read_text())["fused_members_max"] == 2


def test_three_clients_joining_at_different_times_train_in_one_fused_process(tmp_path: Path, data_dir: Path) -> None:
    """Real processes: a fused warm process and three `python -m workers.lora` clients, the
    second and third started while the first trains; each gets its own output only."""
    from workers.lora.share import base_key, server_command, share_dir

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "TMUX"))}
    env |= {"PYTHONPATH": str(REPO), "ORCH_WORKER_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
            "ORCH_SHARE_DIR": str(tmp_path / "warm"), "ORCH_SHARE_IDLE_S": "900", "ORCH_SHARE_BASE": "fused",
            "ORCH_FUSE_MAX": "3"}  # fmt: skip  (never idle out mid-test under load: killed at its end)
    raws = [config(data_dir, seed, max_steps=steps, eval_every_steps=4) for seed, steps in ((1, 96), (2, 8), (3, 8))]
    from workers.lora.client import fused_key
    from workers.lora.config import load_config

    (tmp_path / "probe.yaml").write_text(yaml.safe_dump(raws[0]))
    max_seq_len = load_config(tmp_path / "probe.yaml").max_seq_len
    key = fused_key(base_key("tiny-llama", json.dumps({"builtin": "tiny-llama"}, sort_keys=True), "fp32", env),
                    max_seq_len, False)  # fmt: skip
    folder = share_dir(env)
    server = subprocess.Popen(server_command(folder, key, 0, fused=True), env=env, cwd=REPO,
                              stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_listening(server, folder, key, tmp_path / "server.log", 120)
        clients = []
        for n, raw in enumerate(raws):
            run_dir = tmp_path / f"job-{n}"
            run_dir.mkdir()
            (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
            log = (run_dir / "stdout.log").open("wb")
            clients.append(subprocess.Popen([sys.executable, "-m", "workers.lora", "--run-dir", str(run_dir)],
                                            env={**env, "PYTHONHASHSEED": str(raw["seed"])}, cwd=REPO,
                                            stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
            if n == 0:  # the others join while the first trains
                deadline = time.monotonic() + 120
                while not ((run_dir / "progress.jsonl").exists() and (run_dir / "progress.jsonl").read_text()):
                    assert clients[0].poll() is None and time.monotonic() < deadline, log.name
                    time.sleep(0.1)
        for n, client in enumerate(clients):
            assert client.wait(180) == 0, (tmp_path / f"job-{n}" / "stdout.log").read_text()[-3000:]
        assert server.poll() is None  # one process trained them all
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    pids = set()
    for n in range(3):
        run_dir = tmp_path / f"job-{n}"
        share = json.loads((run_dir / "share.json").read_text())
        assert share["mode"] == "fused" and share["process"] == f"{key}-0"
        pids.add(share["pid"])
        text = (run_dir / "stdout.log").read_text()
        assert "share_base: fused: training in warm LoRA worker process" in text and "done: test" in text
        assert text.count("optimizer steps, effective batch") == 1  # its own output only
        assert json.loads((run_dir / "result.json").read_text())["share_base"] == "fused"
    assert pids == {server.pid}
    assert json.loads((tmp_path / "job-0" / "result.json").read_text())["fused_members_max"] >= 2


def test_a_checkpointing_group_trains_as_one_without(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Activation checkpointing computes each layer's forward again in the backward: the routes
    and each member's dropout keys must hold there too."""
    from workers.lora import fused
    from workers.lora.model import is_checkpointing

    seen: list[bool] = []
    real = fused.forward_backward

    def spy(model: Any, *args: Any) -> list[float]:
        seen.append(is_checkpointing(model))
        return real(model, *args)

    monkeypatch.setattr(fused, "forward_backward", spy)
    ends: dict[str, int] = {}
    for ckpt in (False, True):
        train_group([member(tmp_path / f"a-{ckpt}", config(data_dir, 1, gradient_checkpointing=ckpt), ends),
                     member(tmp_path / f"c-{ckpt}", config(data_dir, 2, gradient_checkpointing=ckpt, **WIDE), ends)])
    assert set(ends.values()) == {0} and False in seen and True in seen
    for name in ("a", "c"):
        plain, checkpointed = progress(tmp_path / f"{name}-False"), progress(tmp_path / f"{name}-True")
        assert [p[1] for p in plain] == pytest.approx([p[1] for p in checkpointed], rel=1e-6)


def test_a_sequential_warm_process_tells_a_client_that_asks_which_process_took_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """share.json (sequential too): the client writes it from the process's answer."""
    import socket

    import workers.lora.__main__ as worker
    from workers.lora import server
    from workers.lora.client import write_share_json
    from workers.lora.share import messages, send, slot_paths

    monkeypatch.setattr(worker, "run_attempt", lambda *args: worker.AttemptEnd(worker.EXIT_OK, True))
    thread = threading.Thread(target=lambda: server.serve(tmp_path, "k", 0, 1.0), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not slot_paths(tmp_path, "k", 0)[0].exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(slot_paths(tmp_path, "k", 0)[0]))
    send(conn, {"job": {"run_dir": str(tmp_path / "run"), "config": "c.yaml", "env": {}}, "share_json": True})
    heard = list(messages(conn))
    conn.close()
    assert heard == [{"accepted": {"pid": os.getpid(), "base_mem_mib": None}}, {"exit": 0}]
    write_share_json(tmp_path, "sequential", "k-0", heard[0]["accepted"] | {"base_mem_mib": "much"})
    share = json.loads((tmp_path / "share.json").read_text())
    assert share == {"mode": "sequential", "process": "k-0", "pid": os.getpid(), "base_mem_mib": None}
    thread.join(30)


def test_a_warm_process_socket_appears_only_once_it_listens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sees the socket's path connects (a path bound but not yet listening refused
    one, a race a client waiting on the path lost under load)."""
    import socket

    from workers.lora import server
    from workers.lora.share import slot_paths

    sock_path = slot_paths(tmp_path, "k", 0)[0]
    tmp_path.joinpath("k-0.bind").write_text("left by a process that died")
    seen_at_listen: list[bool] = []
    real_listen = socket.socket.listen

    def listen(self: socket.socket, *args: Any) -> None:
        seen_at_listen.append(sock_path.exists())
        real_listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", listen)
    listener = server._listen(sock_path)
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock_path))
        conn.close()
        assert seen_at_listen == [False]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["k-0.sock"]
        assert sock_path.stat().st_mode & 0o777 == 0o600
    finally:
        listener.close()


def test_a_fused_members_checkpoint_resumes_alone(tmp_path: Path, data_dir: Path) -> None:
    """Its checkpoint names its weights as the job alone does: orch's resume (alone, or in
    another group) goes on from it."""
    from workers.lora.__main__ import run_attempt

    ends: dict[str, int] = {}
    raw = config(data_dir, 1, checkpoint_every_steps=2)
    stopped = member(tmp_path / "stopped", raw, ends, heartbeat=lambda run_dir, stop: StopAt(run_dir, stop, 4))
    train_group([stopped, member(tmp_path / "whole", raw, ends), member(tmp_path / "mate", config(data_dir, 2), ends)])
    assert ends == {"stopped": 143, "whole": 0, "mate": 0}
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    checkpoint = tmp_path / "stopped" / "checkpoint-4"
    (resumed / "config.yaml").write_text(yaml.safe_dump(raw | {"resume_from_checkpoint": str(checkpoint)}))
    assert run_attempt(resumed, resumed / "config.yaml").exit_code == 0, (resumed / "result.json").read_text()
    whole = [p[1] for p in progress(tmp_path / "whole") if p[1] is not None]
    after = [p[1] for p in progress(resumed) if p[1] is not None]
    assert len(after) == 2 and after == pytest.approx(whole[4:], rel=1e-4)
