"""`share_base: fused` through the real daemon, tmux, SQLite and simulated GPUs, with a stand-in
for the LoRA worker (the fused training itself is the worker's, tested there): its first
attempts end as a fused group's OOM (exit 75 and the exact line), are requeued uncounted (at
`max_attempts: 1`), the suite's cap is halved for the next attempts' `ORCH_FUSE_MAX` and kept in
state.db, each attempt's share.json is stored, and `orch results` marks the fused runs ⊕."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml

from orchestrator.store.attempts import read_all_shapes
from orchestrator.store.sharing import fused_caps
from tests.e2e_helpers import Orch, requires_tmux, wait_until

pytestmark = requires_tmux

# `python -m workers.lora` from the daemon's folder (the attempts' cwd) finds this package first.
STAND_IN = textwrap.dedent(
    """\
    import json, os, sys, time

    run_dir = os.environ["ORCH_RUN_DIR"]
    attempt = int(os.environ["ORCH_ATTEMPT"])
    seen = {name: os.environ.get(name) for name in ("ORCH_SHARE_BASE", "ORCH_FUSE_MAX", "ORCH_SHARE_DIR")}
    with open(os.path.join(run_dir, "seen.json"), "w") as f:
        json.dump(seen, f)
    share = {"mode": "fused", "process": "0123456789abcdef-0", "pid": 4242 + attempt, "base_mem_mib": 1000}
    if os.environ.get("STAND_IN") != "no-share":
        with open(os.path.join(run_dir, "share.json"), "w") as f:
            json.dump(share, f)
    if os.environ.get("STAND_IN") in ("process-dies", "no-share"):  # its warm process died
        print("the warm LoRA worker process ended while it trained this job", file=sys.stderr, flush=True)
        sys.exit(1)
    with open(os.path.join(run_dir, "progress.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "step": 1, "total": 2, "loss": 0.5}) + "\\n")
    time.sleep(1.5)
    if attempt == 1:
        for _ in range(600):  # until the test has seen the group in `orch status` (at most 60 s)
            if os.path.exists("go"):
                break
            time.sleep(0.1)
        print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
        print("orch: fused group of 4 members ran out of memory", file=sys.stderr, flush=True)
        sys.exit(75)
    result = {"status": "succeeded", "metrics": {"test": {"accuracy": 0.75}}, "share_base": "fused",
              "fused_members_max": 2, "token": os.environ.get("ORCH_ATTEMPT_TOKEN")}
    with open(os.path.join(run_dir, "result.json"), "w") as f:
        json.dump(result, f)
    """
)


def stand_in(orch: Orch, suite: str, **settings: object) -> None:
    """The stand-in worker package in the daemon's folder, and a fused suite `suite` of one config."""
    package = orch.root / "workers" / "lora"
    if not package.is_dir():
        package.mkdir(parents=True)
        (orch.root / "workers" / "__init__.py").write_text("")
        (package / "__init__.py").write_text("")
        (package / "__main__.py").write_text(STAND_IN)
    config_dir = orch.plans / "configs" / suite
    config_dir.mkdir(parents=True)
    (config_dir / "c1.yaml").write_text(yaml.safe_dump({"model": "tiny-llama", "batch_size": 2}))
    (orch.plans / "suites" / f"{suite}.yaml").write_text(yaml.safe_dump({
        "worker": "lora", "mem_gib": 1, "max_attempts": 1, "hang_timeout_s": 60, "configs": ["c1"],
        "share_base": "fused", "fused_members": 4, **settings}))


def test_a_fused_groups_oom_is_requeued_uncounted_and_halves_the_cap(orch: Orch) -> None:
    stand_in(orch, "fz")
    orch.submit("fz", "1:glue-tvt_rte 2:glue-tvt_rte 3:glue-tvt_rte")
    orch.start_daemon()

    def sharing() -> tuple[set[str], list[Any]] | None:  # every running job shows the one process it shares
        status = orch.json("status", "--once")
        labels = {r["shares"] for r in status["running"]}
        return (labels, status["gpus"]) if len(status["running"]) == 3 and None not in labels else None

    ids = ",".join(str(j.id) for j in sorted(orch.jobs(), key=lambda j: j.id))
    labels, cards = wait_until(sharing, 60, "the running jobs to show their process")
    assert labels == {f"fused 0123-0 · jobs {ids}"}
    # the process takes one plan slot for its three members
    (card,) = [g for g in cards if g["running"]]
    assert (card["running"], card["slots_taken"]) == (3, 1)
    assert f"1/{card['slots']} (3 jobs)" in orch.run("status", "--once").stdout
    # each names the process the daemon placed it in: the first job's attempt opened it
    placed = {json.loads(orch.run("show", str(j), "--json").stdout)["attempts"][0]["fuse_process"]
              for j in ids.split(",")}
    first_attempt = json.loads(orch.run("show", ids.split(",")[0], "--json").stdout)["attempts"][0]["id"]
    assert placed == {first_attempt}
    assert f"placed in fused process {first_attempt}, trained in fused warm process" in orch.run(
        "show", ids.split(",")[1]).stdout
    (orch.root / "go").write_text("")
    states = orch.wait_all_done(180)
    assert set(states.values()) == {"succeeded"}, states
    attempts = orch.attempt_rows()
    first = [a for a in attempts if a.n == 1]
    second = [a for a in attempts if a.n == 2]
    assert len(first) == len(second) == 3, [(a.job_id, a.n, a.outcome, a.reason) for a in attempts]
    assert {a.outcome.value for a in first if a.outcome} == {"group_oom"}
    assert all(a.reason == "its fused group of 4 members ran out of memory" for a in first)
    seen = [json.loads((Path(a.run_dir) / "seen.json").read_text()) for a in first + second]
    # halved for every attempt after the first group OOM (a first attempt started after it sees 2 too)
    assert seen[0]["ORCH_FUSE_MAX"] in ("4", "2") and [s["ORCH_FUSE_MAX"] for s in seen[3:]] == ["2"] * 3
    assert "4" in {s["ORCH_FUSE_MAX"] for s in seen[:3]}
    assert all(s["ORCH_SHARE_BASE"] == "fused" and s["ORCH_SHARE_DIR"] for s in seen)
    assert {(a.share_mode, a.share_process, a.share_base_mib) for a in attempts} == {
        ("fused", "0123456789abcdef-0", 1000)}
    (lowered,) = orch.events("fused")  # the other members' OOMs lower it no further
    assert lowered.message.startswith("suite fz: fused groups now have at most 2 members (a fused group of 4 "
                                      "members ran out of memory (job ")
    assert orch.read(fused_caps) == {"fz": 2}  # in state.db: a daemon started again keeps it
    shown = orch.json("show", str(first[0].job_id))["attempts"]
    assert [a["share"] for a in shown] == [{"mode": "fused", "process": "0123456789abcdef-0", "pid": 4242 + n,
                                            "base_mib": 1000} for n in (1, 2)]
    said = orch.run("show", str(first[0].job_id)).stdout
    assert "trained in fused warm process 0123456789abcdef-0 (pid 4243)" in said
    # their peaks are a group's (of 2, as result.json says): learned at that group size only
    shapes = orch.read(read_all_shapes)
    assert shapes and all(key.endswith("|fused2") for key in shapes), list(shapes)
    (row,) = orch.json("results")
    assert row["marks"] == ["⊕"] and row["fused_runs"] == 3 and row["n"] == 3
    table = orch.run("results").stdout
    assert "⊕ some runs trained in a fused group (share_base: fused; groups of up to 2 members)" in table


def test_the_failures_of_one_warm_process_count_once_against_the_crash_loop_guard(orch: Orch) -> None:
    guard = {"crash_loop": {"failures": 2, "within_s": 60, "window_s": 600}}
    stand_in(orch, "shared", env={"STAND_IN": "process-dies"}, **guard)  # share.json: one process
    stand_in(orch, "apart", env={"STAND_IN": "no-share"}, **guard)  # the same failures, no share.json
    orch.submit("shared", "1:glue-tvt_rte 2:glue-tvt_rte 3:glue-tvt_rte")
    orch.submit("apart", "1:glue-tvt_rte 2:glue-tvt_rte 3:glue-tvt_rte")
    orch.start_daemon()
    orch.wait_all_done(180)
    paused = {p["suite"] for p in orch.json("status", "--once")["paused_configs"]} | {
        p["suite"] for p in orch.json("status", "--once")["paused_suites"]}
    assert paused == {"apart"}  # 3 fast failures naming one process and pid count once: below 2
    shared = [a for a in orch.attempt_rows() if a.share_pid is not None]
    assert len(shared) == 3 and {a.share_pid for a in shared} == {4243}
