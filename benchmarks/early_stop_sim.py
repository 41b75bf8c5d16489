"""Early stopping and search on learning curves, through orch's own decision cores
(`orchestrator.scheduling.early_stop.judge`, `orchestrator.plans.trial_sampling`): no GPU, no
daemon. `python -m benchmarks.early_stop_sim [--curves recorded|parametric] [--seeds 10] [--json]`

The curves (`--curves`): `recorded` (the default) replays the LoRA worker's validation histories
over 11 learning rates × 4 ranks × 6 seeds (benchmarks/recorded_curves.py, recorded by
benchmarks/lr_grid_record.py; a run 480 steps, an evaluation every 16), each setting's 3 seeds
drawn from its recorded ones per benchmark seed; `parametric` is an invented family whose curves
cross (benchmarks/curve_family.py; a run 2000 steps, an evaluation every 50, `--crossing` and
`--eval-sd` set it). Either way the grid is 44 settings × 3 seeds on 8 GPUs, one GPU-hour a run,
queued setting by setting in a shuffled order, as orch queues an early_stop suite (`--order
grid`: in the grid's order). `--min-steps` is in the curves' steps; its default is a tenth of a
run (200 of the family's 2000, 48 of the recording's 480), so the rungs fall at the same shares of
a run on both.

Early stopping: after every evaluation at which a running seed reached a rung step, the sweep's
histories go to `judge` (what the daemon does every 2 s) and its prunes stop running jobs and
drop queued ones. Reported per benchmark seed: GPU-hours until every surviving setting has
finished (the best is known), against the full grid's 132, and whether the setting kept (best
final mean among those that finished) is the one the full grid would pick (the best mean of its 3
seeds' last evaluations, the same draw), and by how much the kept setting's true final is below
the grid best's. The true final: the family's without noise; on recordings, the mean of every
recorded seed's last evaluation. The grid's best is itself a noisy pick among near-equal
settings, so a second count says how often the kept setting is tied with the grid's best (true
finals within one standard error of a 3-seed mean), and `--explain` prints, per seed, the grid
best's true rank, its seeds' deviations from its true final, its rank at each rung and where it
was stopped. `--smooth-evals N` judges on the mean of each seed's last N evaluations
(early_stop.smooth_evals); `--margin-se Z` spares a setting within Z standard errors of a
rung's cutoff (early_stop.margin_se); `--value best` on each seed's best evaluation so far
(early_stop.value). `--metric loss` judges the recordings' validation losses instead of
their accuracies (`early_stop.metric: val_loss`, `mode: min`; the grid's best is then the lowest
final loss).

Search: random vs TPE at equal trials, one measurement per trial. On the family: a continuous
learning rate, warm-up ratio and a rank choice, noise N(0, 0.004). On the recordings: the 11
recorded learning rates and 4 ranks as choices, a trial measured as one recorded seed's final
drawn at random. Reported: the true final of the trial each search picks, mean over the
benchmark seeds."""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks import curve_family
from benchmarks.curve_family import NONE_KEPT, Curves, Drawn, Parametric, final_of, sign
from benchmarks.recorded_curves import RECORDED, Recorded, load
from orchestrator.lifecycle import JobState
from orchestrator.plans.early_stop import EarlyStop, Mode, PruneRule, SeedValue
from orchestrator.plans.search import parse_search
from orchestrator.plans.trial_sampling import FinishedTrial, TrialEnd, next_trial, random_trials
from orchestrator.scheduling.early_stop import Prune, SeedRun, SettingRuns, judge
from orchestrator.store.early_stop import RungValue

GPUS = 8


@dataclass
class Run:
    job_id: int
    drawn: Drawn
    eval_every: int
    state: JobState = JobState.QUEUED
    step: int = 0
    values: dict[float, float] = field(default_factory=dict)

    @property
    def setting(self) -> str:
        return self.drawn.setting

    def advance(self) -> None:
        self.step += self.eval_every
        self.values[float(self.step)] = self.drawn.curve[self.step // self.eval_every - 1]
        if self.step >= self.eval_every * len(self.drawn.curve):
            self.state = JobState.SUCCEEDED


def make_runs(curves: Curves, rng: random.Random, shuffled: bool = False) -> list[Run]:
    """Every run, queued setting by setting: in the grid's order, or the settings shuffled."""
    return [
        Run(i + 1, drawn, curves.eval_every) for i, drawn in enumerate(curves.draw(rng, shuffled))
    ]


def measured_finals(runs: list[Run]) -> dict[str, float]:
    """Each setting's final as the full grid measures it: the mean of its seeds' last evaluations."""
    by_setting: dict[str, list[float]] = {}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run.drawn.curve[-1])
    return {setting: mean(values) for setting, values in by_setting.items()}


def grid_best(runs: list[Run]) -> str:
    """The setting the full grid picks: the best mean of its seeds' last evaluations."""
    finals = measured_finals(runs)
    return max(finals, key=lambda s: finals[s])


def explain(curves: Curves, runs: list[Run], best: str, sweep: Sweep) -> str:
    """Why the grid's best was kept or lost: its true rank, its seeds' noise, its rank at each
    rung it was told, and where it was stopped."""
    true_final, better = curves.true_final, sign(curves.mode)
    truth = sorted({r.setting for r in runs}, key=true_final, reverse=True)
    noise = [r.drawn.final - true_final(best) for r in runs if r.setting == best]
    measured = measured_finals(runs)
    rungs = []
    for rung in sorted({t.rung for t in sweep.told}):
        at = {t.setting: t.value for t in sweep.told if t.rung == rung}
        if best in at:
            rank = 1 + sum(better * v > better * at[best] for v in at.values())
            rungs.append(f"rung {rung}: {rank} of {len(at)}")
    stop = sweep.prunes.get(best)
    return (
        f"  grid best {best}: true rank {truth.index(best) + 1} (true final {better * true_final(best):.5f}, "
        f"best {better * true_final(truth[0]):.5f}), measured {better * measured[best]:.4f}, seed noise "
        f"{', '.join(f'{better * n:+.4f}' for n in noise)}; {'; '.join(rungs) or 'never told'}; "
        + (f"stopped at step {stop.step} (rank {stop.rank} of {stop.of})" if stop else "kept")
        + (
            f"; kept {sweep.kept} (true rank {truth.index(sweep.kept) + 1})"
            if sweep.kept in truth
            else "; none kept"
        )
    )


@dataclass
class Sweep:
    gpu_hours: float
    kept: str
    told: list[RungValue]
    prunes: dict[str, Prune]  # setting -> its stop


def sweep_with_early_stop(runs: list[Run], spec: EarlyStop, steps: int) -> Sweep:
    """GPU-hours until every surviving setting ended (a run of `steps` is one), the setting
    kept, and what was told. Judged after every evaluation step at which a running seed reached
    or passed a rung step (the daemon judges every 2 s). The runs hold values times sign(spec.mode);
    the core is told the values themselves."""
    rungs = spec.rung_steps(steps)
    better = sign(spec.mode)
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
        if any(r.step - r.eval_every < rung <= r.step for r in running for rung in rungs):
            settings: dict[str, list[Run]] = {}
            for run in runs:
                settings.setdefault(run.setting, []).append(run)
            judged = judge(
                spec,
                [
                    SettingRuns(
                        key,
                        tuple(
                            SeedRun(r.job_id, r.state, {k: better * v for k, v in r.values.items()},
                                    float(r.step))
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
    gpu_hours = sum(r.step for r in runs) / steps
    finished: dict[str, list[float]] = {}
    for run in runs:
        if run.state is JobState.SUCCEEDED and run.setting not in decided:
            finished.setdefault(run.setting, []).append(run.values[float(steps)])
    # every setting stopped (a re-judgement can stop a rung's leader at an earlier rung): none kept
    kept = max(finished, key=lambda s: mean(finished[s])) if finished else NONE_KEPT
    return Sweep(gpu_hours, kept, told, prunes)


SPACE = {
    "learning_rate": {"log_uniform": [1.0e-5, 1.0e-3]},
    "lora_r": curve_family.RANKS,
    "warmup_ratio": {"uniform": [0.0, 0.1]},
}
Params = dict[str, Any]


def search_best(method: str, trials: int, seed: int, curves: Curves) -> float:
    """The true final metric of the trial a search of `trials` picks: the one whose measured
    value (one seed) was best. On the family: a continuous learning rate, warm-up ratio and a
    rank choice, measured with noise N(0, 0.004). On the recordings: the recorded learning
    rates and ranks as choices, measured as one recorded seed's final drawn at random."""
    space: dict[str, Any] = SPACE
    if isinstance(curves, Recorded):
        space = {"learning_rate": curves.learning_rates, "lora_r": curves.ranks}
    raw = {
        "method": method,
        "trials": trials,
        "seed": seed,
        "metric": curves.metric,
        "mode": curves.mode.value,
        "space": space,
    }
    search = parse_search("benchmark", raw, set(space), ())
    better = sign(curves.mode)
    rng = random.Random(seed * 7919 + 1)
    finished: list[FinishedTrial] = []
    asked = random_trials(search) if method == "random" else []
    for number in range(trials):
        params = asked[number] if asked else next_trial(search, finished, number)
        if isinstance(curves, Recorded):
            value = better * rng.choice(curves.curves[_setting(params)])[-1]  # as the worker reports it
        else:
            value = _family_final(params) + rng.gauss(0, 0.004)
        finished.append(FinishedTrial(number, params, TrialEnd.COMPLETE, value))
    chosen = max(finished, key=lambda t: better * t.value if t.value is not None else -math.inf).params
    return (
        curves.true_final(_setting(chosen))
        if isinstance(curves, Recorded)
        else _family_final(chosen)
    )


def _setting(params: Params) -> str:
    return curve_family.setting_name(
        _number(params["learning_rate"]), int(_number(params["lora_r"]))
    )


def _family_final(params: Params) -> float:
    lr, rank = _number(params["learning_rate"]), int(_number(params["lora_r"]))
    return final_of(lr, rank, _number(params["warmup_ratio"]))


def _number(value: object) -> float:
    assert isinstance(value, (int, float)), value  # the space holds numbers only
    return float(value)


def curves_of(args: argparse.Namespace) -> Curves:
    if args.curves == "recorded":
        return load(args.recording, args.metric)
    curve_family.CROSSING[0] = args.crossing
    curve_family.NOISE[0] = args.eval_sd
    return Parametric()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks.early_stop_sim", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--curves",
        default="recorded",
        choices=["recorded", "parametric"],
        help="the LoRA worker's recorded histories (default) or the invented family",
    )
    parser.add_argument(
        "--recording", type=Path, default=RECORDED, help="the recorded curves' JSON"
    )
    parser.add_argument(
        "--metric", default="accuracy", choices=["accuracy", "loss"],
        help="what early stopping and search judge, and what picks the grid's best: the recorded "
        "val_accuracy (mode max, default) or val_loss (mode min)",
    )
    parser.add_argument("--seeds", type=int, default=10, help="benchmark seeds (default 10)")
    parser.add_argument("--rule", default="asha", choices=[r.value for r in PruneRule])
    parser.add_argument(
        "--min-steps",
        type=int,
        help="in the curves' steps (default: a tenth of a run, "
        "200 of the family's 2000, 48 of the recording's 480)",
    )
    parser.add_argument("--reduction-factor", type=int, default=3)
    parser.add_argument(
        "--smooth-evals", type=int, default=1, help="early_stop.smooth_evals (default 1)"
    )
    parser.add_argument(
        "--value", default="last", choices=[v.value for v in SeedValue],
        help="early_stop.value: each seed's last evaluation at a rung (default) or its best so far",
    )
    parser.add_argument(
        "--margin-se", type=float, default=None, metavar="Z",
        help="early_stop.margin_se (asha): spare a setting the pruner stops while within Z standard "
        "errors of the rung's cutoff (default: none)",
    )
    parser.add_argument(
        "--eval-sd",
        type=float,
        default=curve_family.EVAL_SD,
        help=f"the family's evaluation noise (default {curve_family.EVAL_SD})",
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
        help="the family's tau = 300 steps x (2e-4 / lr)^CROSSING (default 0.3; 0: never cross)",
    )
    parser.add_argument(
        "--explain", action="store_true", help="per seed: why the grid's best was kept or lost"
    )
    parser.add_argument("--no-search", action="store_true", help="early stopping only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.curves == "parametric" and args.metric != "accuracy":
        parser.error("--metric loss: the recorded curves only (the family is accuracy)")
    if args.value == "best" and args.smooth_evals > 1:
        parser.error("--value best takes each seed's best so far, --smooth-evals a mean: choose one")
    if args.margin_se is not None and args.rule != "asha":
        parser.error("--margin-se spares settings near asha's cutoff: --rule asha only")
    if args.margin_se is not None and not 0 <= args.margin_se <= 10:
        parser.error("--margin-se: a number of standard errors from 0 to 10")
    return args  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    curves = curves_of(args)
    min_steps = args.min_steps or curves.steps // 10
    hyperband = args.rule == "hyperband"
    spec = EarlyStop(curves.metric, curves.mode, PruneRule(args.rule), min_steps, args.reduction_factor,
                     curves.steps if hyperband else None, args.smooth_evals, SeedValue(args.value),
                     args.margin_se)  # fmt: skip
    rows: list[dict[str, Any]] = []
    settings: list[str] = []
    for seed in range(args.seeds):
        runs = make_runs(curves, random.Random(seed), shuffled=args.order == "shuffled")
        settings = sorted({r.setting for r in runs})
        best = grid_best(runs)
        sweep = sweep_with_early_stop(runs, spec, curves.steps)
        regret = curves.true_final(best) - curves.true_final(sweep.kept)
        rows.append({
            "seed": seed, "gpu_hours": sweep.gpu_hours, "kept": sweep.kept, "grid_best": best,
            "same": sweep.kept == best, "tied": abs(regret) <= curves.mean_se(),
            "grid_picks_true_best": best == max(settings, key=curves.true_final), "regret": regret,
            "explained": explain(curves, runs, best, sweep),
        })  # fmt: skip
    full_hours = len(runs) * 1.0
    searched = range(0 if args.no_search else args.seeds)
    random_best = [search_best("random", args.trials, seed, curves) for seed in searched] or [
        math.nan
    ]
    tpe_best = [search_best("tpe", args.trials, seed, curves) for seed in searched] or [math.nan]
    optimum = max(settings, key=curves.true_final) if isinstance(curves, Recorded) else None
    better = sign(curves.mode)
    summary = {
        "curves": curves.name, "metric": curves.metric, "mode": curves.mode.value,
        "rule": args.rule, "order": args.order,
        "crossing": args.crossing if curves.name == "parametric" else None,
        "min_steps": min_steps, "steps": curves.steps, "eval_every_steps": curves.eval_every,
        "reduction_factor": args.reduction_factor, "smooth_evals": args.smooth_evals, "value": args.value,
        "margin_se": args.margin_se,
        "eval_sd": args.eval_sd if curves.name == "parametric" else None,
        "full_grid_gpu_hours": full_hours,
        "early_stop_gpu_hours_mean": mean(r["gpu_hours"] for r in rows),
        "early_stop_gpu_hours_max": max(r["gpu_hours"] for r in rows),
        "grid_best_kept": sum(r["same"] for r in rows),
        "tied_with_grid_best_kept": sum(r["tied"] for r in rows),
        "grid_picks_true_best": sum(r["grid_picks_true_best"] for r in rows),
        "mean_standard_error": curves.mean_se(), "benchmark_seeds": args.seeds,
        "regret_mean": mean(r["regret"] for r in rows), "regret_max": max(r["regret"] for r in rows),
        # the search's figures as the worker reports them (a loss as itself); regrets: how much worse
        "trials": args.trials, "random_best_mean": better * mean(random_best),
        "tpe_best_mean": better * mean(tpe_best),
        "optimum": better * curves.true_final(optimum) if optimum else final_of(curve_family.BEST_LR, 16, 0.05),
        "runs": rows,
    }  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(report(args, summary, curves))
    return 0


def report(args: argparse.Namespace, summary: dict[str, Any], curves: Curves) -> str:
    lines = []
    for row in summary["runs"]:
        lines.append(f"seed {row['seed']}: {row['gpu_hours']:.1f} GPU-h, kept {row['kept']}"
                     + ("" if row["same"] else f" (grid best {row['grid_best']})"))  # fmt: skip
        if args.explain:
            lines.append(row["explained"])
    n, full_hours = args.seeds, summary["full_grid_gpu_hours"]
    truth = "true final" if curves.name == "parametric" else "final over every recorded seed"
    noise = f"evaluation noise {args.eval_sd}, crossing {args.crossing}" if curves.name == "parametric" else (
        f"{curves.steps} steps, an evaluation every {curves.eval_every}")  # fmt: skip
    lines.append(
        f"early stopping on {curves.name} curves, {curves.metric} ({args.rule}, "
        f"min_steps {summary['min_steps']}, factor "
        f"{args.reduction_factor}, smooth_evals {args.smooth_evals}, value {args.value}"
        f"{'' if args.margin_se is None else f', margin_se {args.margin_se:g}'}, {noise}): "
        f"{summary['early_stop_gpu_hours_mean']:.1f} GPU-h mean (max {summary['early_stop_gpu_hours_max']:.1f}) "
        f"vs {full_hours:.0f} for the full grid ({summary['early_stop_gpu_hours_mean'] / full_hours:.2f}); "
        f"grid best kept in {summary['grid_best_kept']} of {n}; the kept setting's {truth} "
        f"{'above' if curves.mode is Mode.MIN else 'below'} the grid best's by {summary['regret_mean']:.4f} on average "
        f"(at most {summary['regret_max']:.4f}); "
        f"a setting tied with the grid best (within one standard error of a setting's mean, "
        f"{summary['mean_standard_error']:.4f}) kept in {summary['tied_with_grid_best_kept']} of {n}; the full grid "
        f"picked the true best in {summary['grid_picks_true_best']} of {n}"
    )
    if not args.no_search:
        lines.append(
            f"search, {args.trials} trials: {truth} of the trial picked, mean over {n} seeds: random "
            f"{summary['random_best_mean']:.4f}, tpe {summary['tpe_best_mean']:.4f} (optimum {summary['optimum']:.4f})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
