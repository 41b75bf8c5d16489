"""Fit the memory estimate's constants to measured peaks and print the error of every row.

`python -m benchmarks.memory_fit [--json]`

Rows: `benchmarks/results/lora_memory_h200.json` (Llama of 1.3B shape and GLA-1.3B, LoRA r=8 on
q/k/v/o, 256 tokens, batch 4/8/16, with and without checkpointing and logits_to_keep=1; peak =
the allocator's reserved peak, so the CUDA context is left out of the estimate there) and the
succeeded attempts of the GPU sweeps in `benchmarks/gpu/results/jobs_*.json` (peak = NVML
memory of the process tree, context included), estimated at their real prompt length, 34
tokens (the toy GLUE data's longest prompt, see benchmarks/gpu/README.md). The fit is a
coordinate search over the constants minimising the largest relative error; the table shows
the shipped constants (`orchestrator.prediction.memory.CALIBRATED`) and the textbook ones side by side.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.prediction.memory import (
    CALIBRATED,
    DEFAULT_CONSTANTS,
    GLA_1_3B,
    EstimateConstants,
    ModelInfo,
    estimate_peak_mib,
    model_info_from_hf_config,
)

ROOT = Path(__file__).resolve().parent
LLAMA_1_3B = model_info_from_hf_config(dict(
    hidden_size=2048, num_hidden_layers=24, intermediate_size=5632, num_attention_heads=16,
    num_key_value_heads=16, vocab_size=32000))  # fmt: skip
SWEEP_PROMPT_TOKENS = 34
PEFT_LLAMA = {"r": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
PEFT_GLA = {"r": 8, "lora_dropout": 0.0, "target_modules": ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"]}


@dataclass(frozen=True)
class Row:
    source: str
    model: str
    config: dict[str, Any]
    measured_mib: int
    with_context: bool  # NVML readings hold the CUDA context; allocator peaks do not


def _info(model: str) -> ModelInfo:
    return GLA_1_3B if "gla" in model.lower() else LLAMA_1_3B


def load_rows() -> list[Row]:
    rows: list[Row] = []
    bench = json.loads((ROOT / "results" / "lora_memory_h200.json").read_text())
    for r in bench["rows"]:
        if r.get("status") != "ok":
            continue
        config = {"batch_size": r["batch"], "max_seq_len": r["seq_len"], "prec": "bf16",
                  "gradient_checkpointing": bool(r["gradient_checkpointing"])}
        if r.get("logits_to_keep"):
            config["logits_to_keep"] = r["logits_to_keep"]
        rows.append(Row("lora_memory_h200", r["model"], config, int(r["peak_reserved_mib"]), False))
    seen: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "gpu" / "results").glob("jobs_*.json")):
        data = json.loads(path.read_text())
        for job in data["jobs"] if isinstance(data, dict) else data:
            for attempt in job["attempts"]:
                if attempt["outcome"] != "succeeded" or not attempt["peak_mib"]:
                    continue
                config = {**job["config_content"], **attempt["overrides"]}
                config["max_seq_len"] = min(int(config.get("max_seq_len", 256)), SWEEP_PROMPT_TOKENS)
                model = "gla" if "gla" in str(config.get("model", "")).lower() else "llama"
                key = json.dumps(
                    {
                        k: config.get(k)
                        for k in ("batch_size", "gradient_checkpointing", "logits_to_keep", "peft")
                    },
                    sort_keys=True,
                    default=str,
                )
                name = f"{path.stem} {job['config']} L{attempt['level']}"
                if (name, key) in seen:
                    continue
                seen.add((name, key))
                rows.append(Row(name, model, config, int(attempt["peak_mib"]), True))
    return rows


def estimate(row: Row, k: EstimateConstants) -> int:
    constants = k if row.with_context else replace(k, context_mib=0)
    peft = (
        row.config.get("peft")
        if isinstance(row.config.get("peft"), dict)
        else (PEFT_GLA if row.model == "gla" else PEFT_LLAMA)
    )
    value = estimate_peak_mib(row.config, _info(row.model), peft, constants)
    assert value is not None
    return value


def errors(rows: list[Row], k: EstimateConstants) -> list[float]:
    return [estimate(r, k) / r.measured_mib - 1 for r in rows]


def fit(rows: list[Row]) -> EstimateConstants:
    """Coordinate search: each constant over a grid, keeping the others, a few rounds."""
    grids: dict[str, list[float]] = {
        "alpha": [6, 8, 10, 12, 14, 16, 18, 20, 24, 28, 34],
        "checkpoint_per_layer": [0.5, 1, 2, 3, 4, 6, 8],
        "logit_bytes": [2, 4, 6, 8, 10],
        "misc_mib": [0, 64, 128, 256, 384, 512],
        "allocator_factor": [1.0, 1.02, 1.05, 1.08, 1.10, 1.15, 1.2, 1.3],
        "context_mib": [256, 384, 512, 640, 768, 1024],
    }
    best = replace(CALIBRATED, gap_on_weights=False)

    def score(k: EstimateConstants) -> float:
        errs = errors(rows, k)
        return max(abs(e) for e in errs) + 0.1 * sum(abs(e) for e in errs) / len(errs)

    for _ in range(4):
        for name, grid in grids.items():
            best = min((replace(best, **{name: v}) for v in grid), key=score)  # type: ignore[arg-type]
    for a, c in itertools.product(
        [best.alpha - 1, best.alpha, best.alpha + 1],
        [best.context_mib - 64, best.context_mib, best.context_mib + 64],
    ):
        candidate = replace(best, alpha=a, context_mib=c)
        if score(candidate) < score(best):
            best = candidate
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = load_rows()
    fitted = fit(rows)
    table: list[dict[str, Any]] = [
        {"row": r.source, "model": r.model, "batch": r.config.get("batch_size"), "tokens": r.config.get("max_seq_len"),
         "ckpt": bool(r.config.get("gradient_checkpointing")), "keep": r.config.get("logits_to_keep"),
         "measured_mib": r.measured_mib, "textbook_mib": estimate(r, DEFAULT_CONSTANTS),
         "shipped_mib": estimate(r, CALIBRATED), "fitted_mib": estimate(r, fitted)}
        for r in rows
    ]  # fmt: skip
    summary = {
        name: {"max_abs_err_pct": round(100 * max(abs(e) for e in errors(rows, k)), 1),
               "mean_abs_err_pct": round(100 * sum(abs(e) for e in errors(rows, k)) / len(rows), 1)}
        for name, k in (("textbook", DEFAULT_CONSTANTS), ("shipped", CALIBRATED), ("fitted", fitted))
    }  # fmt: skip
    if args.json:
        print(json.dumps({"fitted": vars(fitted), "summary": summary, "rows": table}, indent=2))
        return 0
    print(f"{'row':<34}{'model':<6}{'batch':>6}{'tok':>5}{'ckpt':>6}{'keep':>5}{'measured':>9}"
          f"{'textbook':>15}{'shipped':>15}{'fitted':>15}")
    for t in table:
        cells = "".join(
            f"{t[c]:>8} {100 * (t[c] / t['measured_mib'] - 1):>+5.0f}%"
            for c in ("textbook_mib", "shipped_mib", "fitted_mib")
        )
        print(f"{t['row'][:33]:<34}{t['model']:<6}{t['batch']:>6}{t['tokens']:>5}{t['ckpt']!s:>6}{t['keep'] or '-':>5}"
              f"{t['measured_mib']:>9}{cells}")
    print(f"fitted constants: {vars(fitted)}")
    for name, s in summary.items():
        print(f"{name:<9} max |error| {s['max_abs_err_pct']:.1f} %, mean |error| {s['mean_abs_err_pct']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
