"""`orch trials --suite S`: a search's trials, best first by its metric, the best one named."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import db_option, echo_json, open_store
from orchestrator.errors import UsageError
from orchestrator.lifecycle import JobState
from orchestrator.plans.inputs import SUITE_NAME_RE, shown_value
from orchestrator.results.trials import TrialRow, trial_rows
from orchestrator.store.early_stop import reported_keys
from orchestrator.store.search import final_values, suite_search_jobs
from orchestrator.wording import fmt_value, one_line


@click.command("trials")
@click.option("--suite", required=True, help="The suite whose search: to list.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: every trial with its values, mean and seeds.",
)
@db_option
def trials_cmd(suite: str, as_json: bool, db_path: Path) -> None:
    """List a search's trials best first by the search metric (the mean over each trial's seeds
    of the metric's last reported value; seeds that did not succeed are named, never counted)."""
    if not SUITE_NAME_RE.fullmatch(suite):
        raise UsageError(f"--suite {shown_value(suite)} is not a suite name")
    with open_store(db_path) as store:
        jobs = suite_search_jobs(store, suite)
        if not jobs:
            raise UsageError(
                f"suite {suite} has no search trials (its suite file has no search:, or nothing was submitted)"
            )
        spec = jobs[-1].search.get("spec", {})
        metric, mode = str(spec.get("metric") or ""), str(spec.get("mode") or "max")
        if not metric:
            raise UsageError(
                f"the search of suite {suite} names no metric: its trials have no order "
                f"(`orch results --suite {suite}` shows each trial as a row)"
            )
        rows = trial_rows(jobs, final_values(store, [j.id for j in jobs], metric), mode)
        succeeded = [j.id for j in jobs if j.state is JobState.SUCCEEDED]
        unreported = (
            f"no trial that succeeded reported {metric!r}, so none is ranked "
            f"(reported: {', '.join(reported_keys(store, succeeded)) or 'nothing'})"
            if succeeded and all(r.value is None for r in rows)
            else None
        )
    if as_json:
        echo_json(
            {
                "suite": suite,
                "metric": metric,
                "mode": mode,
                "method": spec.get("method"),
                "note": unreported,  # the metric no trial that succeeded reported; null: none
                "trials": [
                    {
                        "trial": r.trial,
                        "params": r.params,
                        "value": r.value,
                        "counted": r.counted,
                        "submitted": r.submitted,
                        "states": r.states,
                    }
                    for r in rows
                ],
            }
        )
        return
    for line in trial_lines(suite, str(spec.get("method")), metric, mode, rows, unreported):
        click.echo(line)


def trial_lines(suite: str, method: str, metric: str, mode: str, rows: list[TrialRow],
                unreported: str | None) -> list[str]:
    """What `orch trials` prints: a line per trial, best first, and the best named; each as
    wording.one_line shows it (the metric, the searched keys and their values are user text)."""
    lines = [f"{suite}: {len(rows)} trial(s) of a {method} search, best first by {metric} ({mode})"]
    for row in rows:
        params = ", ".join(f"{k}={fmt_value(v)}" for k, v in row.params.items())
        value = f"{row.value:.4f}" if row.value is not None else "—"
        lines.append(f"  trial {row.trial:>3}  {value:>8}  n {row.n_text():<24} {params}")
    if unreported is not None:
        lines.append(f"note: {unreported}")
    best = rows[0]
    if best.value is not None:
        params = ", ".join(f"{k}={fmt_value(v)}" for k, v in best.params.items())
        lines.append(f"best: trial {best.trial} ({params}): {metric} {best.value:.4f}, mean of {best.counted} seed(s)")
    return [one_line(line) for line in lines]


def register(group: click.Group) -> None:
    group.add_command(trials_cmd)
