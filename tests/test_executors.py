"""The executor seam's pure parts (Slurm settings, batch script, squeue/sacct/scontrol output,
what a Slurm state means), the wrapper's own GPU peak, the CLI's checks, and tmux cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from e2e_helpers import orch_env, requires_tmux, wait_until
from rows_helpers import attempt_of

from orchestrator.attempts.rundir_reads import read_gpu_peak_card, read_gpu_peak_mib
from orchestrator.errors import UsageError
from orchestrator.executors.base import RemoteStatus
from orchestrator.executors.launch_age import LaunchAge
from orchestrator.executors.observation import Observation
from orchestrator.executors.remote_verdict import (
    AWAIT,
    ClusterEnd,
    TimeLimit,
    remote_end,
    remote_observation,
)
from orchestrator.executors.slurm.parse import (
    Request,
    SlurmSettings,
    SlurmState,
    classify_state,
    job_name,
    never_clears,
    parse_node_shards,
    parse_sacct,
    parse_scontrol_jobs,
    parse_squeue,
    sbatch_argv,
    sbatch_script,
    settings_from_json,
    shards_for,
    warning_s,
)
from orchestrator.executors.wrapper.run import wrapper_argv
from orchestrator.lifecycle import AttemptOutcome, KillRequest
from orchestrator.plans.keymap import KeyMap
from orchestrator.plans.resume import worker_can_resume
from orchestrator.plans.slurm_settings import parse_settings
from orchestrator.rundir_files import RunDir

# -- suite `slurm:` settings -----------------------------------------------------------------


def test_settings_parse_sizes_and_defaults() -> None:
    settings = parse_settings({"time": "1-02:00:00", "cpus": 4, "mem": "6G", "extra": ["--qos=short"]}, "s")
    assert (settings.time, settings.cpus, settings.mem_mib, settings.extra) == ("1-02:00:00", 4, 6144, ("--qos=short",))
    assert parse_settings({"mem": "512M"}, "s").mem_mib == 512
    assert parse_settings(None, "s").mem_mib is None  # no --mem: the cluster's own default holds


def test_settings_take_typed_gpus_per_gpu_resources_and_slurm_syntax_in_extra() -> None:
    settings = parse_settings({
        "partition": "gpu", "account": "lab-1", "gpu_type": "a100", "cpus_per_gpu": 8, "mem_per_gpu": "40G",
        "max_timeouts": 2, "extra": ["--constraint=a100|h100", "--exclude=n[1-3]", "--dependency=afterok:1&x"],
    }, "s")
    assert (settings.partition, settings.account, settings.gpu_type) == ("gpu", "lab-1", "a100")
    assert (settings.cpus, settings.cpus_per_gpu, settings.mem_mib, settings.mem_per_gpu_mib) == (None, 8, None, 40960)
    assert settings.max_timeouts == 2
    assert settings_from_json(settings.to_json()) == settings
    old_row = {"time": "5", "cpus": 2, "mem_mib": 2048, "extra": []}  # written before these keys existed
    assert settings_from_json(old_row) == SlurmSettings(time="5", cpus=2, mem_mib=2048)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"time": "soon"}, "time"),
        ({"cpus": 0}, "cpus"),
        ({"cpus": True}, "cpus"),
        ({"mem": "lots"}, "mem"),
        ({"extra": ["--gres=gpu:8"]}, "set by orch"),
        ({"extra": ["--qos=a; rm -rf ~"]}, "extra option"),
        ({"extra": "--qos=a"}, "extra"),
        ({"partitions": "x"}, "unknown key"),
        (["time"], "mapping"),
        ({"extra": ["--qos=a\nb"]}, "extra option"),
        ({"partition": "a b"}, "partition"),
        ({"mem": "1G", "mem_per_gpu": "1G"}, "exclude each other"),
        ({"cpus": 1, "cpus_per_gpu": 2}, "exclude each other"),
        ({"extra": ["--signal=USR1@60"]}, "set by orch"),
        ({"max_timeouts": -1}, "max_timeouts"),
    ],
)
def test_settings_refuse_bad_values(raw: object, named: str) -> None:
    with pytest.raises(UsageError, match=named):
        parse_settings(raw, "suite s.yaml")


# -- requests and the batch script -----------------------------------------------------------


def test_shards_are_sized_from_the_prediction_and_capped_at_one_gpu() -> None:
    assert shards_for(8192, 6144, 4) == 2
    assert shards_for(6144, 6144, 4) == 1
    assert shards_for(0, 6144, 4) == 1
    assert shards_for(100_000, 6144, 4) == 4  # 22.05 cannot spread a shard request over GPUs


def test_batch_script_execs_the_wrapper_with_the_attempt_env_and_leaves_the_gpu_to_slurm(tmp_path: Path) -> None:
    request = Request(name=job_name("E 1", 7, 2), gres="shard:3", cpus=2, mem_mib=4096, partition="gpu", time="30")
    argv = wrapper_argv(tmp_path, ["python", "train.py", "--name", "a b"])
    script = sbatch_script(request, str(tmp_path), "/home/u", argv, {"CUDA_VISIBLE_DEVICES": "GPU-x", "SEED": "it's"})
    assert "#SBATCH --job-name=orch-E_1-7-a2" in script
    for line in ("--gres=shard:3", "--cpus-per-task=2", "--mem=4096M", "--no-requeue", "--partition=gpu", "--time=30"):
        assert f"#SBATCH {line}\n" in script
    assert "export CUDA_VISIBLE_DEVICES" not in script  # Slurm sets it for the allocation
    assert "export SEED='it'\"'\"'s'" in script
    assert script.rstrip().splitlines()[-1].startswith("exec ") and "'a b'" in script
    done = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr


def test_extra_options_reach_sbatch_as_arguments_and_a_resumable_worker_is_warned(tmp_path: Path) -> None:
    request = Request(name="orch-s-1-a1", gres="gpu:a100:2", cpus=None, mem_mib=None, cpus_per_gpu=8,
                      mem_per_gpu_mib=40960, extra=("--constraint=a100|h100", "--exclude=n[1-3]"), signal_s=60)
    assert sbatch_argv(request, "/r/sbatch.sh") == [
        "sbatch", "--parsable", "--constraint=a100|h100", "--exclude=n[1-3]", "/r/sbatch.sh"]
    script = sbatch_script(request, str(tmp_path), "/home/u", ["true"], {})
    for line in ("--gres=gpu:a100:2", "--cpus-per-gpu=8", "--mem-per-gpu=40960M", "--signal=B:USR2@60"):
        assert f"#SBATCH {line}\n" in script
    assert "--mem=" not in script and "--cpus-per-task" not in script  # the cluster's defaults hold
    assert "#SBATCH --constraint" not in script  # arguments, not script lines a shell-like parser splits
    assert warning_s("1") == 30 and warning_s("4:00:00") == 120 and warning_s(None) == 120 and warning_s("0:15") == 10


# -- Slurm's output --------------------------------------------------------------------------


def test_squeue_sacct_and_scontrol_output_are_parsed() -> None:
    queue = parse_squeue("12|orch-demo-1-a1|PENDING|Resources|4G\n13|orch-demo-2-a1|RUNNING|None\ngarbage\n")
    assert queue["12"].mem_mib == 4096 and queue["13"].mem_mib is None
    assert queue["12"].reason == "Resources" and queue["13"].state == "RUNNING" and len(queue) == 2
    sacct = parse_sacct("14|orch-demo-3-a1|NODE_FAIL|None\n15|orch-demo-4-a1|CANCELLED by 0|None\n")
    assert sacct["14"].state == "NODE_FAIL" and sacct["15"].state == "CANCELLED"
    scontrol = parse_scontrol_jobs(
        "JobId=16 JobName=orch-demo-5-a1 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Comment=JobState=X\n"
    )
    assert scontrol["16"].state == "TIMEOUT" and scontrol["16"].name == "orch-demo-5-a1"
    assert parse_scontrol_jobs("JobId=17 JobState=OUT_OF_MEMORY MinMemoryNode=256M\n")["17"].mem_mib == 256
    assert parse_sacct("18|orch-x|OUT_OF_MEMORY|None|2000Mn\n")["18"].mem_mib == 2000
    assert parse_node_shards("NodeName=vm Arch=x86_64 Gres=gpu:2,shard:8 State=IDLE") == (2, 8)
    assert parse_node_shards("NodeName=vm Gres=gpu:a100:4(S:0-1) State=IDLE") is None


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("PENDING", SlurmState.QUEUED), ("RUNNING", SlurmState.RUNNING), ("COMPLETING", SlurmState.RUNNING),
        ("NODE_FAIL", SlurmState.LOST), ("PREEMPTED", SlurmState.PREEMPTED), ("BOOT_FAIL", SlurmState.LOST),
        ("TIMEOUT", SlurmState.TIMEOUT), ("OUT_OF_MEMORY", SlurmState.HOST_OOM), ("DEADLINE", SlurmState.FAILED),
        ("COMPLETED", SlurmState.ENDED), ("CANCELLED+", SlurmState.ENDED), ("FAILED", SlurmState.ENDED),
    ],
)
def test_slurm_states_map_to_what_they_mean_for_an_attempt(state: str, kind: SlurmState) -> None:
    assert classify_state(state) is kind


def test_pending_reasons_that_never_clear_are_told_from_those_that_do() -> None:
    for reason in ("PartitionTimeLimit", "InvalidAccount", "QOSMaxWallDurationPerJobLimit", "QOSMaxGRESPerJob"):
        assert never_clears(reason), reason
    for reason in ("Resources", "Priority", "QOSMaxJobsPerUserLimit", "AssocGrpGRES", "ReqNodeNotAvail", "None"):
        assert not never_clears(reason), reason


# -- a cluster-owned attempt's end -----------------------------------------------------------

ATTEMPT = attempt_of(id=1, executor_id="42", executor="slurm", started_at=100.0, kill_requested=None)


def _obs(exit_record: dict | None = None, pid_record: dict | None = None) -> Observation:
    return Observation(pid_record=pid_record, exit_record=exit_record, process_alive=False, last_progress=None,
                       last_progress_at=None, now_s=200.0)


def _status(state: str, reason: str = "") -> RemoteStatus:
    return RemoteStatus(state, classify_state(state).value, reason, "42")


def test_the_run_dir_wins_over_slurm() -> None:
    assert remote_end(ATTEMPT, _obs(exit_record={"exit_code": 0}), _status("NODE_FAIL"), True, None) == "finished"


def test_slurm_ends_without_an_exit_record_carry_the_state_in_the_reason() -> None:
    assert remote_end(ATTEMPT, _obs(), _status("NODE_FAIL"), True, None) == ClusterEnd(
        AttemptOutcome.LOST, "Slurm job 42 ended NODE_FAIL"
    )
    preempted = remote_end(ATTEMPT, _obs(), _status("PREEMPTED"), True, None)
    assert isinstance(preempted, ClusterEnd) and preempted.outcome is AttemptOutcome.LOST and not preempted.counted
    timeout = remote_end(ATTEMPT, _obs(), _status("TIMEOUT"), True, None, TimeLimit(limit="1"))
    assert isinstance(timeout, ClusterEnd) and timeout.outcome is AttemptOutcome.FAILED and not timeout.retryable
    assert "reached its time limit (--time=1)" in timeout.reason
    oom = remote_end(ATTEMPT, _obs(), _status("OUT_OF_MEMORY"), True, None)
    assert isinstance(oom, ClusterEnd) and oom.outcome is AttemptOutcome.HOST_OOM and oom.next_mem_mib is None
    granted = remote_end(ATTEMPT, _obs(), replace(_status("OUT_OF_MEMORY"), mem_mib=256), True, None)
    assert isinstance(granted, ClusterEnd) and granted.next_mem_mib == 512 and "--mem=512M" in granted.reason
    cancelled = replace(ATTEMPT, kill_requested=KillRequest.CANCEL)
    assert (
        remote_end(cancelled, _obs(), _status("CANCELLED"), True, None)[0]  # type: ignore[index]
        is AttemptOutcome.CANCELLED
    )


STOPPED = {"exit_code": 143, "signal": None, "received": ["SIGTERM"], "forwarded": ["SIGTERM"]}


def test_slurms_final_word_wins_over_an_exit_record_written_under_its_signal() -> None:
    # the wrapper wrote exit.json on Slurm's SIGTERM: Slurm's final state decides, once known
    assert remote_end(ATTEMPT, _obs(STOPPED), _status("RUNNING"), True, None) == AWAIT
    assert remote_end(ATTEMPT, _obs(STOPPED), None, False, 50.0) == AWAIT
    failed = remote_end(ATTEMPT, _obs(STOPPED), _status("TIMEOUT"), True, None, TimeLimit(limit="10:00"))
    assert (
        isinstance(failed, ClusterEnd)
        and failed.outcome is AttemptOutcome.FAILED
        and "--time=10:00" in failed.reason
    )
    preempted = remote_end(ATTEMPT, _obs(STOPPED), _status("PREEMPTED"), True, None)
    assert isinstance(preempted, ClusterEnd) and not preempted.counted
    # a stray SIGTERM that Slurm did not send: the run dir decides (stopped from outside: lost)
    assert remote_end(ATTEMPT, _obs(STOPPED), _status("CANCELLED"), True, None) == "finished"
    # a worker SIGKILLed (a cgroup's OOM kill): Slurm's OUT_OF_MEMORY decides, else the run dir
    killed = {"exit_code": 137, "signal": 9, "received": []}
    assert remote_end(ATTEMPT, _obs(killed), _status("RUNNING"), True, None) == AWAIT
    oom = remote_end(ATTEMPT, _obs(killed), replace(_status("OUT_OF_MEMORY"), mem_mib=1024), True, None)
    assert isinstance(oom, ClusterEnd) and oom.outcome is AttemptOutcome.HOST_OOM and oom.next_mem_mib == 2048
    assert remote_end(ATTEMPT, _obs(killed), _status("FAILED"), True, None) == "finished"
    # a worker ended by Slurm's SIGTERM before its wrapper noted the signal: still Slurm's word
    unnoted = {"exit_code": 143, "signal": None, "received": [], "forwarded": []}
    assert remote_end(ATTEMPT, _obs(unnoted), _status("RUNNING"), True, None) == AWAIT
    preempted_early = remote_end(ATTEMPT, _obs(unnoted), _status("PREEMPTED"), True, None)
    assert isinstance(preempted_early, ClusterEnd) and not preempted_early.counted
    assert remote_end(ATTEMPT, _obs(unnoted), _status("FAILED"), True, None) == "finished"
    # orch's own cancel: the run dir decides at once
    cancelled = replace(ATTEMPT, kill_requested=KillRequest.CANCEL)
    assert remote_end(cancelled, _obs(STOPPED), _status("RUNNING"), True, None) == "finished"


def test_a_time_limit_resumes_a_resumable_worker_up_to_its_cap() -> None:
    resumable = TimeLimit(can_resume=True, timeouts_before=0, max_timeouts=2, limit="1")
    first = remote_end(ATTEMPT, _obs(), _status("TIMEOUT"), True, None, resumable)
    assert isinstance(first, ClusterEnd) and first.outcome is AttemptOutcome.LOST and not first.counted
    assert "resumes from its checkpoint" in first.reason
    capped = remote_end(ATTEMPT, _obs(), _status("TIMEOUT"), True, None, replace(resumable, timeouts_before=2))
    assert isinstance(capped, ClusterEnd) and capped.outcome is AttemptOutcome.FAILED and "3 times" in capped.reason
    # the worker died of the warning (SIGUSR2) before the limit: the same time limit
    warned = {"exit_code": 140, "signal": 12, "received": ["SIGUSR2"]}
    assert remote_end(ATTEMPT, _obs(warned), _status("FAILED"), True, None, resumable) == first
    # it checkpointed on the warning and finished: the run dir decides
    assert (
        remote_end(
            ATTEMPT, _obs({**warned, "exit_code": 0}), _status("COMPLETED"), True, None, resumable
        )
        == "finished"
    )


def test_a_job_out_of_the_queue_waits_out_the_grace_for_its_exit_record() -> None:
    unsettled = RemoteStatus("COMPLETED", "ended", "", "42", settled=False)
    assert remote_end(ATTEMPT, _obs(), unsettled, True, None) is None
    assert remote_end(ATTEMPT, _obs({"exit_code": 0}), unsettled, True, None) == "finished"
    lost = remote_end(ATTEMPT, _obs(), replace(unsettled, settled=True), True, None)
    assert (
        isinstance(lost, ClusterEnd)
        and lost.outcome is AttemptOutcome.LOST
        and "no exit record appeared" in lost.reason
    )


def test_worker_can_resume_from_its_template_or_its_config() -> None:
    none = KeyMap({})
    assert worker_can_resume("python train.py --resume {resume}", none)
    assert not worker_can_resume("python train.py --x {{resume}}", none)
    assert worker_can_resume("lora", none) and not worker_can_resume("sim", none, {"resume_from_checkpoint": True})
    assert worker_can_resume("python t.py --cfg {config}", KeyMap({"resume_from_checkpoint": "ckpt"}), {})
    assert worker_can_resume("python t.py --cfg {config}", none, {"resume_from_checkpoint": None})
    assert not worker_can_resume("python t.py --cfg {config}", none, {"batch_size": 4})


def test_waiting_running_or_unanswered_concludes_nothing() -> None:
    assert remote_end(ATTEMPT, _obs(), _status("PENDING", "Priority"), True, None) is None
    assert remote_end(ATTEMPT, _obs(pid_record={"pid": 5}), _status("RUNNING"), True, None) is None
    adopted = LaunchAge(0.0, adopted=True)  # claimed before this daemon started
    assert remote_end(ATTEMPT, _obs(), None, False, adopted) is None  # the poll failed
    claimed = replace(ATTEMPT, executor_id=None, executor=None)
    assert remote_end(claimed, _obs(), None, False, adopted) is None
    assert remote_end(claimed, _obs(), None, True, adopted)[0] is AttemptOutcome.LOST  # type: ignore[index]
    # claimed by this daemon: sbatch may still return
    assert remote_end(claimed, _obs(), None, True, LaunchAge(0.0, adopted=False)) is None


def test_a_remote_process_is_alive_while_slurm_runs_it() -> None:
    assert remote_observation(_obs(pid_record={"pid": 5}), _status("RUNNING")).process_alive
    assert not remote_observation(_obs(pid_record={"pid": 5}), _status("COMPLETED")).process_alive
    assert not remote_observation(_obs(), _status("RUNNING")).process_alive


# -- the wrapper's own GPU peak --------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        '{"peak_mib": true}',
        '{"peak_mib": -1}',
        '{"peak_mib": 1e30}',
        "[1]",
        "{",
        '{"peak_mib": 99999999999}',
    ],
)
def test_an_unbelievable_gpu_peak_file_reads_as_zero(tmp_path: Path, content: str) -> None:
    (tmp_path / RunDir.GPU_PEAK).write_text(content)
    assert read_gpu_peak_mib(tmp_path) == 0


def test_a_gpu_peak_symlink_or_fifo_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"peak_mib": 5}')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RunDir.GPU_PEAK).symlink_to(target)
    assert read_gpu_peak_mib(run_dir) == 0
    (run_dir / RunDir.GPU_PEAK).unlink()
    os.mkfifo(run_dir / RunDir.GPU_PEAK)
    assert read_gpu_peak_mib(run_dir) == 0


def test_the_wrapper_measures_its_own_tree_on_simulated_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim_dir, run_dir = tmp_path / "sim", tmp_path / "run"
    holder = (
        "import time; from pathlib import Path; from workers.sim import SimAllocation, gpu_dir;"
        f"a = SimAllocation(gpu_dir(Path({str(sim_dir)!r}), 1), 24576); assert a.allocate(3000) is None;"
        "time.sleep(2.5); a.release()"
    )
    env = {**os.environ, "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "2x24GiB", "ORCH_SIM_DIR": str(sim_dir),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    from orchestrator.gpu import make_probe

    monkeypatch.setenv("ORCH_SIM_GPUS", "2x24GiB")
    make_probe("sim", sim_dir).close()  # creates the card directories
    done = subprocess.run(
        wrapper_argv(run_dir, [sys.executable, "-c", holder]),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert read_gpu_peak_mib(run_dir) == 3000
    assert json.loads((run_dir / RunDir.GPU_PEAK).read_text())["samples"] >= 1
    name, total_mib = read_gpu_peak_card(run_dir) or ("", 0)  # the card it peaked on: GPU 1, 24 GiB
    assert total_mib == 24576 and name, (name, total_mib)


@pytest.mark.parametrize("card", [{"gpu_name": 5, "gpu_total_mib": 1}, {"gpu_name": "A\n", "gpu_total_mib": 1},
                                  {"gpu_name": "A100", "gpu_total_mib": True}, {"gpu_name": "A100"}])
def test_an_unbelievable_gpu_card_reads_as_unknown(tmp_path: Path, card: dict) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RunDir.GPU_PEAK).write_text(json.dumps({"peak_mib": 5, **card}))
    assert read_gpu_peak_card(run_dir) is None and read_gpu_peak_mib(run_dir) == 5


# -- CLI -------------------------------------------------------------------------------------


def test_submit_refuses_bad_slurm_settings_and_writes_nothing(tmp_path: Path) -> None:
    with orch_env(tmp_path) as orch:
        orch.write_suite("bad", {"c": {"sim_mem_gib": 1}}, slurm={"time": "tomorrow"})
        done = orch.run("submit", "--suite", "bad", "--pairs", "1:a", check=False)
        assert done.returncode == 2 and "slurm time 'tomorrow'" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert orch.jobs() == []
        orch.write_suite("good", {"c": {"sim_mem_gib": 1}}, slurm={"time": "5", "mem": "1G", "extra": ["--qos=short"]})
        orch.submit("good", "1:a")
        stored = orch.jobs()[0].slurm
        assert stored == {"cpus": 1, "extra": ["--qos=short"], "mem_mib": 1024, "time": "5"}


def test_slurm_options_need_the_slurm_executor(tmp_path: Path) -> None:
    with orch_env(tmp_path) as orch:
        for args in (("--partition", "gpu"), ("--executor", "slurm", "--partition", "a b"), ("--exit-grace", "5"),
                     ("--slurm-poll", "10"), ("--executor", "slurm", "--slurm-poll", "0.1")):
            done = orch.run("daemon", "start", *args, check=False)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1


@requires_tmux
def test_finished_tmux_windows_are_closed_once_recorded(tmp_path: Path) -> None:
    with orch_env(tmp_path) as orch:
        orch.write_suite(
            "quick",
            {"a": {"sim_mem_gib": 1, "sim_seconds": 1}, "b": {"sim_mem_gib": 1, "sim_seconds": 1}},
        )
        orch.submit("quick", "1:x 2:x")
        orch.start_daemon()
        orch.wait_all_done(90)
        assert set(orch.job_states().values()) == {"succeeded"}

        def windows() -> list[str]:
            done = subprocess.run(["tmux", "-L", orch.socket, "list-windows", "-a", "-F", "#{window_name}"],
                                  capture_output=True, text=True, check=False)
            return done.stdout.split()

        assert wait_until(lambda: windows() == ["orch"], 15, "only the session's own window left")
        assert all((Path(a["run_dir"]) / "stdout.log").stat().st_size > 0 for a in orch.attempts())


def test_attach_is_a_tmux_argv_or_a_clear_not_attachable() -> None:
    from orchestrator.executors.base import NotAttachable, attach_argv

    assert attach_argv(attempt_of(job_id=3, executor="tmux", executor_id="@7"), "sock") == [
        "tmux", "-L", "sock", "attach-session", "-t", "@7"]
    with pytest.raises(NotAttachable, match="Slurm job 42: not attachable here"):
        attach_argv(attempt_of(job_id=3, executor="slurm", executor_id="42"), "sock")
    with pytest.raises(NotAttachable, match="no tmux window"):
        attach_argv(attempt_of(job_id=3, executor="subprocess"), "sock")


def test_status_shows_the_slurm_job_and_its_pending_reason() -> None:
    from orchestrator.cli.status.lines import _where

    assert _where({"gpu": -1, "executor": "slurm", "executor_id": "42", "executor_state": "PENDING (Resources)"}) == (
        "slurm 42 PENDING (Resources)")
    assert _where({"gpu": 1, "executor": "tmux", "executor_id": "@3", "executor_state": None}) == "1"


def test_slurm_requests_are_sized_from_the_prediction_or_take_a_whole_gpu_alone(tmp_path: Path) -> None:
    from orchestrator.executors.base import LaunchSpec
    from orchestrator.executors.slurm.executor import SlurmExecutor, SlurmOptions

    executor = SlurmExecutor.__new__(SlurmExecutor)  # no cluster needed for the request itself
    executor.options, executor.shard_mib, executor.shards_per_gpu = SlurmOptions(partition="gpu"), 6144, 4

    def request(**meta: object) -> str:
        spec = LaunchSpec(job_id=5, attempt_id=9, window_name="w", argv=["true"], run_dir=tmp_path,
                          meta={"suite": "demo", "n": 2, "slurm": {"cpus": 3, "mem_mib": 1024}, **meta})
        built = executor.request_for(spec)
        assert (built.name, built.cpus, built.partition) == ("orch-demo-5-a2", 3, meta.get("want_partition", "gpu"))
        return built.gres

    assert request(predicted_peak_mib=8192) == "shard:2"
    assert request(predicted_peak_mib=8192, run_alone=True) == "shard:4"
    assert request(predicted_peak_mib=8192, gpus=2) == "gpu:2"  # gpus: 2 is two whole GPUs, never one
    assert (
        request(
            slurm={"cpus": 3, "gpu_type": "a100", "partition": "big"}, gpus=2, want_partition="big"
        )
        == "gpu:a100:2"
    )
    executor.shard_mib = None  # a cluster without shards
    assert request(predicted_peak_mib=8192) == "gpu:1"


def test_an_sbatch_that_never_answered_is_lost_once_its_name_stays_absent() -> None:
    timed_out = replace(ATTEMPT, executor_id=None, executor="slurm", started_at=180.0)
    assert remote_end(timed_out, _obs(), None, True, LaunchAge(20.0, adopted=False)) is None  # within the launch grace
    late = LaunchAge(800.0, adopted=False)
    assert remote_end(timed_out, _obs(), None, True, late)[0] is AttemptOutcome.LOST  # type: ignore[index]
    assert remote_end(timed_out, _obs(), None, False, late) is None  # the poll failed: nothing concluded
