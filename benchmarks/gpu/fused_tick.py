"""Where a fused group's time goes (`share_base: fused`), in one worker process on one GPU: the
sweep's jobs (benchmarks/gpu/share_base_sweep.py: its Llama, RTE-sized data and 4 LoRA configs)
trained as fused groups of k members, no daemon.

    python benchmarks/gpu/fused_tick.py --work /tmp/tick --out OUT [--size 1b3] [--steps 60]
    python benchmarks/gpu/fused_tick.py --dry --work /tmp/tick-dry --out /tmp/o    # CPU, tiny
    python benchmarks/gpu/fused_tick.py ... --routing loop,stacked --trace 4 --no-profile
    python benchmarks/gpu/fused_tick.py ... --config all_r4   # every member of one config
    python benchmarks/gpu/fused_tick.py ... --config qv_r8,qv_r8_lr1e3   # members take these in turn
    python benchmarks/gpu/fused_tick.py --cpu --size 1b3-narrow --count-ops ...   # launches, on CPU

For each group size k of `--members` and each LoRA dropout of `--dropouts`: k jobs (the 4 configs
in turn, or all of the config `--config` names; seeds 1..k) train `--steps` steps each as one group
(FusedTrainer, base loaded once); reported per run: the wall seconds and seconds per tick (one
micro-batch of every member), and, timed with a CUDA synchronisation around each, the share of a
tick in the group's one forward and backward against the members' own steps (optimizer, scheduler,
progress line). Then one more run of the largest k, at the first of `--dropouts`, under cProfile:
the functions with the most own time and the most time in all (Python overhead in one thread is
what a fused group cannot spread over processes). Writes OUT/fused-tick.json and
OUT/fused-profile.txt; prints a line per run.

`--routing` times each named routing of the LoRA layers: `stacked` (workers/lora/routing.py, as
shipped: members of one shape stacked, two batched matmuls a layer) and `loop`
(benchmarks/routing_loop.py, the first version, one addition a member).
`--trace K` runs a group of K members under torch.profiler for `--trace-ticks` ticks (after
5 untimed) with each routing: the GPU's busy time per tick (the union of its kernels' and
copies' intervals) against the tick's wall time, the kernels launched per tick and the kernels
with the most GPU time (OUT/fused-trace.json), and the operators the host dispatched per tick.

`--cpu` trains on the CPU. `--size 1b3-narrow` is the 1.3B shape's depth and modules (24 layers,
the same projections) at a width of 64: on a CPU its arithmetic takes microseconds, so a tick's
time is what the host spends dispatching its operators, as on a GPU where the host sets the pace
(but for dropout: a CPU draws a mask some 30 times slower than an H200). `--count-ops` counts the
operators the host dispatches in one forward and backward of each group (torch.profiler, nested
ones included): a figure of the code alone, the same on any CPU in fp32 (on a GPU, bf16 autocast
adds its casts). `--cpu` trains in fp32 (bf16 on a CPU without bf16 arithmetic is emulated, many
times slower); `--dry` keeps bf16.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.gpu.share_base_sweep import CONFIGS, LLAMA_1B3, SIZES, make_model  # noqa: E402

PREC_ENV = "FUSED_TICK_PREC"  # the members' `prec`, set by --cpu
# the 1.3B shape's layers and modules at a width whose arithmetic is negligible (module docstring)
TICK_SIZES = SIZES | {"1b3-narrow": LLAMA_1B3 | dict(hidden_size=64, intermediate_size=176, num_attention_heads=4,
                                                     num_key_value_heads=4)}


def member_config(
    name: str, seed: int, model: str, data: Path, steps: int, dropout: float
) -> dict[str, Any]:
    prec = os.environ.get(PREC_ENV, "bf16")  # fp32 under --cpu (module docstring)
    return {
        "model": model, "data": "glue-tvt_rte", "data_dir": str(data), "batch_size": 16, "prec": prec,
        "max_seq_len": 256, "no_save": True, "checkpoint_every_steps": 0, **CONFIGS[name],
        "peft": {**CONFIGS[name]["peft"], "dropout": dropout}, "max_steps": steps, "seed": seed,
    }  # fmt: skip


class TickClock:
    """Seconds in the group's forward and backward, synchronised, summed over ticks; with
    `count_ops`, the operators the host dispatched in one of them (the sixth, after warm-up),
    counted by torch.profiler (nested ones included; the profiled one's time is not summed)."""

    COUNTED_TICK = 5

    def __init__(self, count_ops: bool = False) -> None:
        self.forward_backward_s = 0.0
        self.ticks = 0
        self.count_ops = count_ops
        self.host_operators: int | None = None

    def wrap(self, function: Any) -> Any:
        import torch

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.count_ops and self.ticks == self.COUNTED_TICK and self.host_operators is None:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as profiled:
                    result = function(*args, **kwargs)
                self.host_operators = sum(event.count for event in profiled.key_averages())
                return result
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.forward_backward_s += time.perf_counter() - started
                self.ticks += 1

        return timed


class TickTrace:
    """torch.profiler over `active` ticks of a group, after `skip`: GPU busy time and kernels."""

    def __init__(self, path: Path, skip: int = 5, active: int = 10) -> None:
        self.path, self.skip, self.active = path, skip, active
        self.ticks = 0
        self.profiler: Any = None
        self.wall_s = 0.0
        self.started = 0.0

    def wrap(self, tick: Any) -> Any:
        import torch

        def traced(trainer: Any) -> None:
            if self.ticks == self.skip:
                from torch.profiler import ProfilerActivity, profile

                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self.profiler.__enter__()
                self.started = time.perf_counter()
            tick(trainer)
            self.ticks += 1
            if self.ticks == self.skip + self.active:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.wall_s = time.perf_counter() - self.started
                self.profiler.__exit__(None, None, None)
                self.profiler.export_chrome_trace(str(self.path))

        return traced

    def summary(self) -> dict[str, Any]:
        """Per tick: wall ms, GPU busy ms (union of kernel and copy intervals), kernels; the top kernels."""
        events = json.loads(self.path.read_text()).get("traceEvents", [])
        gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
        spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu)
        busy_us, end = 0.0, -1.0
        for start, stop in spans:
            if stop > end:
                busy_us += stop - max(start, end)
                end = stop
        by_name: dict[str, list[float]] = {}
        for e in gpu:
            entry = by_name.setdefault(str(e.get("name", "?"))[:90], [0.0, 0])
            entry[0] += float(e["dur"])
            entry[1] += 1
        top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:12]
        ticks = self.active
        return {
            "ticks": ticks, "tick_wall_ms": round(1000 * self.wall_s / ticks, 1),
            "gpu_busy_ms_per_tick": round(busy_us / 1000 / ticks, 1),
            "kernels_per_tick": round(sum(1 for e in gpu if e.get("cat") == "kernel") / ticks),
            "host_operators_per_tick": round(sum(1 for e in events if e.get("cat") == "cpu_op") / ticks),
            "top_kernels": [{"name": n, "ms_per_tick": round(v[0] / 1000 / ticks, 2),
                             "per_tick": round(v[1] / ticks)} for n, v in top],
        }  # fmt: skip


def run_group(root: Path, tag: str, configs: list[dict[str, Any]], cache: Any, clock: TickClock | None,
              profile: cProfile.Profile | None, trace: TickTrace | None = None) -> float:  # fmt: skip
    from workers.lora import fused
    from workers.lora.fused import FusedTrainer
    from workers.lora.member import MemberSpec

    specs = []
    ends: list[int] = []
    for n, config in enumerate(configs):
        run_dir = root / tag / str(n)
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        specs.append(MemberSpec(run_dir, run_dir / "config.yaml", done=ends.append))
    original, tick = fused.forward_backward, fused.FusedTrainer.tick
    if clock is not None:
        fused.forward_backward = clock.wrap(original)
    if trace is not None:
        fused.FusedTrainer.tick = trace.wrap(tick)  # type: ignore[method-assign]
    waves = [specs]
    started = time.perf_counter()
    try:
        if profile is not None:
            profile.enable()
        FusedTrainer(cache).run(lambda idle: waves.pop() if waves else None)
    finally:
        if profile is not None:
            profile.disable()
        fused.forward_backward, fused.FusedTrainer.tick = original, tick  # type: ignore[method-assign]
    seconds = time.perf_counter() - started
    if ends != [0] * len(configs):
        raise SystemExit(f"{tag}: members ended {ends}")
    return seconds


def train_seconds(root: Path, tag: str, members: int, steps: int) -> tuple[float, int]:
    """The longest training loop of the members (steps x batch 16 / their result.json's
    samples_per_s: the loop, without load or evaluations), and the longest prompt in tokens."""
    values, longest = [], 0
    for n in range(members):
        result = json.loads((root / tag / str(n) / "result.json").read_text())
        values.append(steps * 16 / float(result["samples_per_s"]))
        longest = max(longest, int(result.get("longest_tokens") or 0))
    return max(values), longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", choices=sorted(TICK_SIZES), default="1b3")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--members", default="1,2,4,8")
    parser.add_argument("--dropouts", default="0.05,0")
    parser.add_argument("--dry", action="store_true", help="the tiny Llama on CPU, 4 steps")
    parser.add_argument("--routing", default="stacked", help="comma-separated: stacked (shipped), loop (the first)")
    parser.add_argument("--config", default="all",
                        help="all: the 4 configs in turn; names, comma-separated: the members take them in turn")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    parser.add_argument("--count-ops", action="store_true",
                        help="count the operators the host dispatches in one forward and backward of each group")
    parser.add_argument("--trace", type=int, default=0, help="members of a group traced by torch.profiler")
    parser.add_argument("--trace-ticks", type=int, default=10)
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    unknown_configs = set(config_names(args)) - set(CONFIGS)
    if unknown_configs:
        raise SystemExit(f"--config: unknown {', '.join(sorted(unknown_configs))} (known: all, {', '.join(CONFIGS)})")
    if args.dry or args.cpu:
        os.environ["ORCH_WORKER_DEVICE"] = "cpu"
    if args.cpu:
        os.environ[PREC_ENV] = "fp32"
    if args.dry:
        model, steps = "tiny-llama", 4
    else:
        model, steps = str(args.work / f"llama-{args.size}"), args.steps
        if not Path(model).exists():
            make_model(Path(model), TICK_SIZES[args.size])
    data = args.work / "data"
    subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(data), "--tasks", "rte",
                    "--n-train", "40" if args.dry else "2490", "--n-dev", "16" if args.dry else "277"],
                   check=True, cwd=REPO, capture_output=True)  # fmt: skip
    from benchmarks.routing_loop import loop_forward
    from workers.lora import routing
    from workers.lora.base_cache import BaseCache

    routings = {"stacked": routing.routed_forward, "loop": loop_forward}
    unknown = set(args.routing.split(",")) - set(routings)
    if unknown:
        raise SystemExit(f"--routing: unknown {', '.join(sorted(unknown))} (known: stacked, loop)")
    cache = BaseCache()
    names = config_names(args)
    sizes = [int(k) for k in args.members.split(",")]
    runs: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    for way in args.routing.split(","):
        routing.routed_forward = routings[way]  # FusedModel patches each new group's layers with it
        for dropout in [float(d) for d in args.dropouts.split(",")]:
            for k in sizes:
                runs.append(timed_group(args, model, data, steps, dropout, k, way, cache))
                print(json.dumps(runs[-1]), flush=True)
        if args.trace:
            trace = TickTrace(args.work / f"trace-{way}.json", active=args.trace_ticks)
            configs = [member_config(names[n % len(names)], n + 1, model, data, 5 + args.trace_ticks + 2, 0.0)
                       for n in range(args.trace)]  # fmt: skip
            run_group(args.work / "runs", f"trace-{way}", configs, cache, None, None, trace)
            traces.append({"routing": way, "config": args.config, "members": args.trace, "dropout": 0.0,
                           **trace.summary()})
            print(json.dumps(traces[-1]), flush=True)
            (args.out / "fused-trace.json").write_text(json.dumps(traces, indent=1))
    routing.routed_forward = routings["stacked"]
    (args.out / "fused-tick.json").write_text(json.dumps({"size": args.size, "runs": runs}, indent=1))
    if args.no_profile:
        return 0
    profile = cProfile.Profile()
    k = max(sizes)
    configs = [
        member_config(names[n % len(names)], n + 1, model, data, steps, float(args.dropouts.split(",")[0]))
        for n in range(k)
    ]
    run_group(args.work / "runs", f"profile-k{k}", configs, cache, None, profile)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
    (args.out / "fused-profile.txt").write_text(text.getvalue())
    print("\n".join(text.getvalue().splitlines()[:45]))
    return 0


def config_names(args: argparse.Namespace) -> list[str]:
    """The configs the members take in turn: all 4, or those `--config` names."""
    return list(CONFIGS) if args.config == "all" else args.config.split(",")


def timed_group(args: argparse.Namespace, model: str, data: Path, steps: int, dropout: float, k: int, way: str,
                cache: Any) -> dict[str, Any]:  # fmt: skip
    names = config_names(args)
    configs = [
        member_config(names[n % len(names)], n + 1, model, data, steps, dropout)
        for n in range(k)
    ]
    tag = f"{way}-k{k}-p{dropout}"
    clock = TickClock(args.count_ops)
    seconds = run_group(args.work / "runs", tag, configs, cache, clock, None)
    loop_s, longest = train_seconds(args.work / "runs", tag, k, steps)
    return {
        "routing": way, "config": args.config, "members": k, "dropout": dropout, "steps": steps,
        "wall_s": round(seconds, 2),
        "loop_s": round(loop_s, 2), "tick_ms": round(1000 * loop_s / steps, 1),
        "forward_backward_ms": round(1000 * clock.forward_backward_s / max(1, clock.ticks), 1),
        "job_steps_per_s": round(k * steps / loop_s, 1) if loop_s else None, "longest_tokens": longest,
        "host_operators_forward_backward": clock.host_operators,
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
