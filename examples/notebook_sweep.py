"""orch from a notebook: queue a grid, wait for it, and take its results and curves as DataFrames.

Each `# %%` block is a notebook cell (Jupyter, VS Code and PyCharm run them as such); as a script:

    python examples/notebook_sweep.py --db state.db --suite E1 --pairs 87:glue-tvt_qnli \
        --grid learning_rate=1e-4,3e-4

A daemon must be running on the database (`orch daemon start`). DataFrames need pandas
(`pip install 'orch[notebook]'`); every call also takes `as_frame=False` for plain rows.
"""

# %%
from __future__ import annotations

import argparse

from orchestrator.api import Sweep

parser = argparse.ArgumentParser()
parser.add_argument("--db", default="state.db")
parser.add_argument("--plans", default=None)
parser.add_argument("--suite", default="E1")
parser.add_argument("--pairs", default="87:glue-tvt_qnli")
parser.add_argument("--grid", default="learning_rate=1e-4,3e-4", help="KEY=V1,V2")
args = parser.parse_args()
key, _, values = args.grid.partition("=")

# %% Queue suite × grid × pairs (idempotent: running the cell again queues nothing new).
s = Sweep(args.db, plans=args.plans)
queued = s.submit(args.suite, pairs=args.pairs.split(), grid={key: [float(v) for v in values.split(",")]})
print(queued)

# %% Wait for them, with a progress bar.
print(s.wait())

# %% The jobs, with their headline metric and run time.
jobs = s.jobs(args.suite)
print(jobs[["job", "config", key, "seed", "task", "state", "metric", "value", "run_s", "ended_at"]])

# %% The table `orch results --json` prints: a row per setting × task, every seed accounted for.
summary = s.summary(args.suite)
print(summary[["config", key, "task", "metric", "mean", "std", "val_mean", "n_text", "marks", "notes"]])

# %% The same table per run: the counted rows (one per seed) give exactly the summary's means.
results = s.results(args.suite)
counted = results[results["counted"] & (results["split"] == "test")]
# dropna=False: a job without the override has no value in its column, and would be left out
print(counted.groupby(["config", key, "task", "metric"], dropna=False)["value"].agg(["mean", "std", "count"]))
print(results[~results["counted"]][["job", "seed", "state", "why"]])  # what the table left out, and why

# %% Every loss point of every run, one curve per job (a resumed job reads whole), with its setting.
curves = s.curves(suite=args.suite, keys=["loss"], stitched=True)
print(curves.pivot_table(index="step", columns=[key, "seed"], values="value").tail())
