"""Early stopping and search on simulated learning curves, through orch's own decision cores
(`orchestrator.scheduling.early_stop.judge`, `orchestrator.plans.trial_sampling`): no GPU, no
daemon. `python -m benchmarks.early_stop_sim [--seeds 10] [--json]`

The curves are a parametric family: a setting (learning rate × LoRA rank) ends at
    final = 0.88 - 0.05 * log10(lr / 2e-4)^2 + 0.004 * log2(r / 4) - 0.001 * log2(r / 4)^2
and climbs there from 0.5 as 0.5 + (final - 0.5) * (1 - exp(-(t / tau)^0.7)), tau = 300 steps *
(2e-4 / lr)^0.3 (a larger rate is ahead early and ends lower: the curves cross). Each seed's final
moves by N(0, 0.004), each evaluation (every 50 steps) by N(0, 0.003). A run is 2000 steps, one
GPU-hour; the grid is 11 learning rates (1e-5 to 1e-3) × 4 ranks × 3 seeds on 8 GPUs, queued
setting by setting in a shuffled order, as orch queues an early_stop suite (`--order grid`: in
the grid's order).

Early stopping: every 50 simulated steps the sweep's histories go to `judge` (what the daemon
does every 2 s) and its prunes stop running jobs and drop queued ones. Reported per benchmark
seed: GPU-hours until every surviving setting has finished (the best is known), against the
full grid's 132, and whether the setting kept (best final mean among those that finished) is the
one the full grid would pick (the same noise), and by how much the kept setting's true final
(without noise) is below the grid best's. The grid's best is itself a noisy pick: the family's
six best settings lie within 0.001 of one another, below one standard error of a setting's
measured final (about 0.003), and the full grid picks the true best in 1 or 2 of 10 seeds; so a
second count says how often the kept setting is tied with the grid's best (true finals within one
such standard error), and `--explain` prints, per seed, the grid best's true rank, its seeds'
noise, its rank at each rung and where it was stopped. `--smooth-evals N` judges on the mean of
each seed's last N evaluations (early_stop.smooth_evals), `--eval-sd` sets the evaluation noise.
Search: random vs TPE at equal trials over the same
family with a continuous learning rate, warm-up ratio and a rank choice (one measurement per
trial, noise N(0, 0.004)); reported: the true final of the trial each search picks, mean over the
benchmark seeds."""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.plans.early_stop import EarlyStop, Mode, PruneRule
from orchestrator.plans.search import parse_search
from orchestrator.plans.trial_sampling import FinishedTrial, TrialEnd, next_trial, random_trials
from orchestrator.scheduling.early_stop import Prune, SeedRun, SettingRuns, judge
from orchestrator.store.early_stop import RungValue

STEPS = 2000
EVAL_EVERY = 50
GPUS = 8
SEEDS_PER_SETTING = 3
LEARNING_RATES = [1e-5 * (100 ** (i / 10)) for i in range(11)]
RANKS = [4, 8, 16, 32]
BEST_LR = 2e-4
SEED_SD = 0.004  # a seed's final moves by N(0, SEED_SD)
EVAL_SD = 0.003  # each evaluation by N(0, EVAL_SD)
NOISE = [EVAL_SD]  # each evaluation's noise as run (--eval-sd)


def mean_se() -> float:
    """One standard error of a setting's measured final (the mean of its seeds' last
    evaluations): two settings whose true finals are closer than this, the full grid itself
    orders by chance nearly as often as not (it picks the truly better one with probability at
    most 0.76, Phi(1/sqrt 2))."""
    return math.sqrt(SEED_SD**2 + NOISE[0] ** 2) / math.sqrt(SEEDS_PER_SETTING)


def final_of(lr: float, rank: int, warmup: float = 0.05) -> float:
    r = math.log2(rank / 4)
    return (
        0.88
        - 0.05 * math.log10(lr / BEST_LR) ** 2
        + 0.004 * r
        - 0.001 * r * r
        - 0.2 * (warmup - 0.05) ** 2
    )


CROSSING = [
    0.3
]  # tau's exponent: 0, curves never cross; larger, a large rate leads longer (--crossing)


def value_at(final: float, lr: float, step: int) -> float:
    tau = 300 * (BEST_LR / lr) ** CROSSING[0]
    return 0.5 + (final - 0.5) * (1 - math.exp(-((step / tau) ** 0.7)))


@dataclass
class Run:
    job_id: int
    setting: str
    lr: float
    final: float  # with its seed's noise
    noise: list[float]  # each evaluation's
    state: JobState = JobState.QUEUED
    step: int = 0
    values: dict[float, float] = field(default_factory=dict)

    def advance(self) -> None:
        self.step += EVAL_EVERY
        self.values[float(self.step)] = (
            value_at(self.final, self.lr, self.step) + self.noise[self.step // EVAL_EVERY - 1]
        )
        if self.step >= STEPS:
            self.state = JobState.SUCCEEDED


def make_runs(rng: random.Random, shuffled: bool = False) -> list[Run]:
    """Every run, queued setting by setting: in the grid's order, or the settings shuffled."""
    runs: list[Run] = []
    settings = [(lr, rank) for lr in LEARNING_RATES for rank in RANKS]
    if shuffled:
        random.Random(rng.random()).shuffle(settings)
    for lr, rank in settings:
        if True:
            for _ in range(SEEDS_PER_SETTING):
                final = final_of(lr, rank) + rng.gauss(0, SEED_SD)
                noise = [rng.gauss(0, NOISE[0]) for _ in range(STEPS // EVAL_EVERY)]
                runs.append(Run(len(runs) + 1, f"lr={lr:.3g} r={rank}", lr, final, noise))
    return runs


NONE_KEPT = "none"


def true_final(setting: str) -> float:
    """A setting's final without noise, from its name (`lr=0.000251 r=16`); 0 for none kept."""
    if setting == NONE_KEPT:
        return 0.0
    lr, rank = (part.split("=")[1] for part in setting.split())
    return final_of(float(lr), int(rank))


def measured_finals(runs: list[Run]) -> dict[str, float]:
    """Each setting's final as the full grid measures it: the mean of its seeds' last evaluations."""
    by_setting: dict[str, list[float]] = {}
    for run in runs:
        last = value_at(run.final, run.lr, STEPS) + run.noise[-1]
        by_setting.setdefault(run.setting, []).append(last)
    return {setting: mean(values) for setting, values in by_setting.items()}


def grid_best(runs: list[Run]) -> str:
    """The setting the full grid picks: the best mean of its seeds' last evaluations."""
    finals = measured_finals(runs)
    return max(finals, key=lambda s: finals[s])


def true_best() -> str:
    settings = [f"lr={lr:.3g} r={rank}" for lr in LEARNING_RATES for rank in RANKS]
    return max(settings, key=true_final)


def explain(runs: list[Run], best: str, sweep: Sweep) -> str:
    """Why the grid's best was kept or lost: its true rank, its seeds' noise, its rank at each
    rung it was told, and where it was stopped."""
    truth = sorted({r.setting for r in runs}, key=true_final, reverse=True)
    noise = [r.final - true_final(best) for r in runs if r.setting == best]
    measured = measured_finals(runs)
    rungs = []
    for rung in sorted({t.rung for t in sweep.told}):
        at = {t.setting: t.value for t in sweep.told if t.rung == rung}
        if best in at:
            rank = 1 + sum(v > at[best] for v in at.values())
            rungs.append(f"rung {rung}: {rank} of {len(at)}")
    stop = sweep.prunes.get(best)
    return (
        f"  grid best {best}: true rank {truth.index(best) + 1} (true final {true_final(best):.5f}, "
        f"best {true_final(truth[0]):.5f}), measured {measured[best]:.4f}, seed noise "
        f"{', '.join(f'{n:+.4f}' for n in noise)}; {'; '.join(rungs) or 'never told'}; "
        + (f"stopped at step {stop.step} (rank {stop.rank} of {stop.of})" if stop else "kept")
        + (f"; kept {sweep.kept} (true rank {truth.index(sweep.kept) + 1})" if sweep.kept in truth else "; none kept")
    )


@dataclass
class Sweep:
    gpu_hours: float
    kept: str
    told: list[RungValue]
    prunes: dict[str, Prune]  # setting -> its stop


def sweep_with_early_stop(runs: list[Run], spec: EarlyStop) -> Sweep:
    """GPU-hours until every surviving setting ended, the setting kept, and what was told."""
    told: list[RungValue] = []
    prunes: dict[str, Prune] = {}
    decided: set[str] = set()
    while True:
        running = [r for r in runs if r.state is JobState.RUNNING]
        for run in [r for r in runs if r.state is JobState.QUEUED][: GPUS - len(running)]:
            run.state = JobState.RUNNING
        running = [r for r in runs if r.state is JobState.RUNNING]
        if not running:
            break
        for run in running:
            run.advance()
        if any(r.step in spec.rung_steps(STEPS) for r in running):
            settings: dict[str, list[Run]] = {}
            for run in runs:
                settings.setdefault(run.setting, []).append(run)
            judged = judge(
                spec,
                [
                    SettingRuns(
                        key,
                        tuple(
                            SeedRun(r.job_id, r.state, dict(r.values), float(r.step))
                            for r in members
                        ),
                        decided=key in decided,
                    )
                    for key, members in settings.items()
                ],
                told,
            )
            told += judged.told
            for prune in judged.prunes:
                decided.add(prune.setting)
                prunes[prune.setting] = prune
                for run in settings[prune.setting]:
                    if run.state in (JobState.QUEUED, JobState.RUNNING):
                        run.state = JobState.PRUNED
    gpu_hours = sum(r.step for r in runs) / STEPS
    finished: dict[str, list[float]] = {}
    for run in runs:
        if run.state is JobState.SUCCEEDED and run.setting not in decided:
            finished.setdefault(run.setting, []).append(run.values[float(STEPS)])
    # every setting stopped (a re-judgement can stop a rung's leader at an earlier rung): none kept
    kept = max(finished, key=lambda s: mean(finished[s])) if finished else NONE_KEPT
    return Sweep(gpu_hours, kept, told, prunes)


SPACE = {
    "learning_rate": {"log_uniform": [1.0e-5, 1.0e-3]},
    "lora_r": RANKS,
    "warmup_ratio": {"uniform": [0.0, 0.1]},
}


def search_best(method: str, trials: int, seed: int) -> float:
    """The true final metric (without noise) of the trial a search of `trials` picks: the one
    whose measured value (one seed, its noise included) was best."""
    search = parse_search(
        "benchmark",
        {
            "method": method,
            "trials": trials,
            "seed": seed,
            "metric": "val_accuracy",
            "mode": "max",
            "space": SPACE,
        },
        set(SPACE),
        (),
    )
    rng = random.Random(seed * 7919 + 1)
    finished: list[FinishedTrial] = []
    asked = random_trials(search) if method == "random" else []
    for number in range(trials):
        params = asked[number] if asked else next_trial(search, finished, number)
        value = final_of(
            _number(params["learning_rate"]),
            int(_number(params["lora_r"])),
            _number(params["warmup_ratio"]),
        )
        finished.append(
            FinishedTrial(number, params, TrialEnd.COMPLETE, value + rng.gauss(0, 0.004))
        )
    chosen = max(finished, key=lambda t: t.value if t.value is not None else -math.inf)
    return final_of(
        _number(chosen.params["learning_rate"]),
        int(_number(chosen.params["lora_r"])),
        _number(chosen.params["warmup_ratio"]),
    )


def _number(value: object) -> float:
    assert isinstance(value, (int, float)), value  # the space holds numbers only
    return float(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.early_stop_sim", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seeds", type=int, default=10, help="benchmark seeds (default 10)")
    parser.add_argument("--rule", default="asha", choices=[r.value for r in PruneRule])
    parser.add_argument("--min-steps", type=int, default=200)
    parser.add_argument("--reduction-factor", type=int, default=3)
    parser.add_argument("--smooth-evals", type=int, default=1, help="early_stop.smooth_evals (default 1)")
    parser.add_argument(
        "--eval-sd", type=float, default=EVAL_SD, help=f"each evaluation's noise (default {EVAL_SD})"
    )
    parser.add_argument("--trials", type=int, default=32, help="trials of each search (default 32)")
    parser.add_argument(
        "--order",
        default="shuffled",
        choices=["grid", "shuffled"],
        help="the queue: its settings shuffled, as orch queues an early_stop suite (default), "
        "or the grid's order (learning rate ascending)",
    )
    parser.add_argument(
        "--crossing",
        type=float,
        default=0.3,
        help="tau = 300 steps x (2e-4 / lr)^CROSSING (default 0.3; 0: curves never cross)",
    )
    parser.add_argument("--explain", action="store_true", help="per seed: why the grid's best was kept or lost")
    parser.add_argument("--no-search", action="store_true", help="early stopping only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    CROSSING[0] = args.crossing
    NOISE[0] = args.eval_sd
    spec = EarlyStop(
        "val_accuracy",
        Mode.MAX,
        PruneRule(args.rule),
        args.min_steps,
        args.reduction_factor,
        STEPS if args.rule == "hyperband" else None,
        args.smooth_evals,
    )
    full_hours = len(LEARNING_RATES) * len(RANKS) * SEEDS_PER_SETTING * 1.0
    rows: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        runs = make_runs(random.Random(seed), shuffled=args.order == "shuffled")
        best = grid_best(runs)
        sweep = sweep_with_early_stop(runs, spec)
        regret = true_final(best) - true_final(sweep.kept)
        rows.append(
            {
                "seed": seed,
                "gpu_hours": sweep.gpu_hours,
                "kept": sweep.kept,
                "grid_best": best,
                "same": sweep.kept == best,
                "tied": abs(regret) <= mean_se(),
                "grid_picks_true_best": best == true_best(),
                "regret": regret,
                "explained": explain(runs, best, sweep),
            }
        )
    searched = range(0 if args.no_search else args.seeds)
    random_best = [search_best("random", args.trials, seed) for seed in searched] or [math.nan]
    tpe_best = [search_best("tpe", args.trials, seed) for seed in searched] or [math.nan]
    summary = {
        "rule": args.rule,
        "order": args.order,
        "crossing": args.crossing,
        "min_steps": args.min_steps,
        "reduction_factor": args.reduction_factor,
        "smooth_evals": args.smooth_evals,
        "eval_sd": args.eval_sd,
        "full_grid_gpu_hours": full_hours,
        "early_stop_gpu_hours_mean": mean(r["gpu_hours"] for r in rows),
        "early_stop_gpu_hours_max": max(r["gpu_hours"] for r in rows),
        "grid_best_kept": sum(r["same"] for r in rows),
        "tied_with_grid_best_kept": sum(r["tied"] for r in rows),
        "grid_picks_true_best": sum(r["grid_picks_true_best"] for r in rows),
        "mean_standard_error": mean_se(),
        "benchmark_seeds": args.seeds,
        "regret_mean": mean(r["regret"] for r in rows),
        "regret_max": max(r["regret"] for r in rows),
        "trials": args.trials,
        "random_best_mean": mean(random_best),
        "tpe_best_mean": mean(tpe_best),
        "optimum": final_of(BEST_LR, 16, 0.05),
        "runs": rows,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    for row in rows:
        print(
            f"seed {row['seed']}: {row['gpu_hours']:.1f} GPU-h, kept {row['kept']}"
            + ("" if row["same"] else f" (grid best {row['grid_best']})")
        )
        if args.explain:
            print(row["explained"])
    print(
        f"early stopping ({args.rule}, min_steps {args.min_steps}, factor {args.reduction_factor}, "
        f"smooth_evals {args.smooth_evals}, evaluation noise {args.eval_sd}): "
        f"{summary['early_stop_gpu_hours_mean']:.1f} GPU-h mean (max {summary['early_stop_gpu_hours_max']:.1f}) "
        f"vs {full_hours:.0f} for the full grid ({summary['early_stop_gpu_hours_mean'] / full_hours:.2f}); "
        f"grid best kept in {summary['grid_best_kept']} of {args.seeds}; the kept setting's true final below "
        f"the grid best's by {summary['regret_mean']:.4f} on average (at most {summary['regret_max']:.4f}); "
        f"a setting tied with the grid best (true finals within one standard error of a setting's mean, "
        f"{mean_se():.4f}) kept in {summary['tied_with_grid_best_kept']} of {args.seeds}; the full grid picked "
        f"the true best in {summary['grid_picks_true_best']} of {args.seeds}"
    )
    if args.no_search:
        return 0
    print(
        f"search, {args.trials} trials: true final of the trial picked, mean over {args.seeds} seeds: random "
        f"{summary['random_best_mean']:.4f}, tpe {summary['tpe_best_mean']:.4f} (optimum {summary['optimum']:.4f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
