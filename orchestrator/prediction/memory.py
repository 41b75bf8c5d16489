"""Peak GPU memory of an attempt: measured per job shape, else estimated, else declared. Pure.

The estimate is the formula of the OOM research note (section 3.4), per process:

    W         = P · bytes_w                                  bf16 base weights, frozen
    M_lora    = 16 · P_lora                                  fp32 adapter weight, grad, AdamW m and v
    m_tok     = α·h·L + Σ_{layer,target} d_in·(c_cast + c_drop)           without checkpointing
              = 2·h·L + α·h + max_layer Σ_target d_in·(c_cast + c_drop)   with checkpointing
    A         = b · s · m_tok                                s = the config's max sequence length
    Logits    = 10 · b · k · V                               k = logits_to_keep, else s
    footprint = f · (W + M_lora + A + Logits + ε) + C_ctx          textbook
              = W + M_lora + f · (A + Logits + ε) + C_ctx          calibrated: weights and
                                                             adapter states are allocated once, exactly

with α = 34 (Korthikanti et al., flash/linear attention, no s² term), c_cast = 4 (PEFT keeps
adapters in fp32 and casts each target's input to fp32), c_drop = 4 when lora_dropout > 0,
ε = 256 MiB (cuBLAS workspaces, buffers), f = 1.10 (allocator gap with expandable_segments,
which orch injects), C_ctx = 768 MiB (CUDA context, outside the allocator).

Calibration against the figures users reported for E1 (GLA-1.3B, bf16, batch 4, 23.52 GiB
cards, 2 jobs per card): weights ~2.6 GiB (formula: 2.54 GiB); activations 1.5–3 GiB per step
(formula at s = 256, LoRA on q,k,v,o with dropout: 3.1 GiB — GLUE batches are padded to their
longest item, so the real figure is lower: the estimate takes the worst case on purpose);
per-process peaks 4–12 GiB (formula: 7.6 GiB, 4.4 GiB with checkpointing); savings from
checkpointing 3–5 GiB (formula: 3.2 GiB) and from batch 4→2 2–3 GiB (formula: 1.7 GiB).
Those are the textbook constants (DEFAULT_CONSTANTS); the ones used (CALIBRATED) are fitted to
peaks measured on an H200 by benchmarks/memory_fit.py, which prints the error of every row.
Eval/generation peaks (+1–2 GiB reported) are not modelled: measured peaks take over after the
first completed attempt of a shape, and an OOM raises the floor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lifecycle import AttemptOutcome
from orchestrator.prediction.families import BATCH_KEYS
from orchestrator.prediction.shapes import RunningPeak, Transfer, measured_margin, running_margin
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import ShapeMemory

MIB = 1024 * 1024
ALPHA = 34  # activation bytes per token per layer per hidden unit, without checkpointing
CAST_BYTES = 4  # fp32 copy of each LoRA target's input (PEFT's default adapter dtype)
DROPOUT_BYTES = 4  # dropout output + mask per LoRA target input, when lora_dropout > 0
LOGIT_BYTES = 10  # bf16 logits + fp32 copy + fp32 grad per kept position per vocab entry
MISC_MIB = 256
ALLOCATOR_FACTOR = 1.10
CONTEXT_MIB = 768
DEFAULT_SEQ_LEN = 256  # when the config names no maximum sequence length
DEFAULT_LORA: dict[str, Any] = {
    "r": 8,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}

_SEQ_KEYS = ("max_seq_len", "max_length", "max_seq_length", "seq_len", "block_size")
_LAYER_TARGET = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ModelInfo:
    """Sizes the estimate needs. `module_dims` maps a module's short name (`q_proj`,
    `gk_proj.0`) to (d_in, d_out) where it differs from the defaults (h×h attention,
    h×intermediate MLP)."""

    n_params: int
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    module_dims: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def _gla_info(
    hidden: int,
    layers: int,
    vocab: int,
    expand_k: float,
    expand_v: float,
    hidden_ratio: int,
    gate_low_rank: int,
    tied: bool,
) -> ModelInfo:
    """fla's GLA: q,k project to h·expand_k, v,g to h·expand_v, a low-rank forget gate."""
    key_dim, value_dim = int(hidden * expand_k), int(hidden * expand_v)
    intermediate = 256 * math.ceil(int(hidden * hidden_ratio * 2 / 3) / 256)
    dims = {
        "q_proj": (hidden, key_dim), "k_proj": (hidden, key_dim), "v_proj": (hidden, value_dim),
        "g_proj": (hidden, value_dim), "o_proj": (value_dim, hidden),
        "gk_proj.0": (hidden, gate_low_rank), "gk_proj.1": (gate_low_rank, key_dim),
    }  # fmt: skip
    per_layer = sum(d_in * d_out for d_in, d_out in dims.values()) + key_dim  # gk bias
    per_layer += 3 * hidden * intermediate + 2 * hidden  # SwiGLU MLP, two norms
    embeddings = vocab * hidden * (1 if tied else 2)
    n_params = layers * per_layer + embeddings + hidden  # + the final norm
    return ModelInfo(n_params, hidden, layers, vocab, intermediate, dims)


# fla-hub/gla-1.3B-100B = fla's GLAConfig defaults (research note section 5.1): 1.3655 B params.
GLA_1_3B = _gla_info(2048, 24, 32000, 0.5, 1.0, 4, 16, tied=False)
KNOWN_MODELS: dict[str, ModelInfo] = {"gla-1.3b": GLA_1_3B}


def lookup_model_info(model: str) -> ModelInfo | None:
    """A known shape whose key appears in the model name or local path (case-insensitive)."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for key, info in KNOWN_MODELS.items():
        if key in name:
            return info
    return None


def model_info_from_hf_config(config: Mapping[str, Any]) -> ModelInfo:
    """ModelInfo from a Hugging Face config.json already read into a dict."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    vocab = int(config["vocab_size"])
    tied = bool(config.get("tie_word_embeddings", False))
    if config.get("model_type") == "gla":
        return _gla_info(
            hidden,
            layers,
            vocab,
            expand_k=float(config.get("expand_k", 0.5)),
            expand_v=float(config.get("expand_v", 1.0)),
            hidden_ratio=int(config.get("hidden_ratio") or 4),
            gate_low_rank=int(config.get("gate_low_rank_dim", 16)),
            tied=tied,
        )
    intermediate = int(config.get("intermediate_size") or 4 * hidden)
    heads = int(config.get("num_attention_heads", 1))
    kv_dim = hidden * int(config.get("num_key_value_heads") or heads) // heads
    dims = {"k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim)}
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * intermediate
    n_params = layers * per_layer + vocab * hidden * (1 if tied else 2)
    return ModelInfo(n_params, hidden, layers, vocab, intermediate, dims)


def _module_dims(info: ModelInfo, name: str) -> tuple[int, int]:
    parts = name.split(".")  # "attn.q_proj" -> "q_proj", "attn.gk_proj.0" -> "gk_proj.0"
    short = ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]
    if short in info.module_dims:
        return info.module_dims[short]
    h, inter = info.hidden, info.intermediate
    if short in ("gate_proj", "up_proj", "fc1", "w1", "w3"):
        return h, inter
    if short in ("down_proj", "fc2", "w2"):
        return inter, h
    if short == "lm_head":
        return h, info.vocab
    return h, h


def lora_footprint(info: ModelInfo, peft_spec: Mapping[str, Any]) -> tuple[int, dict[int, int]]:
    """(adapter parameter count, Σ d_in of adapted inputs per layer; lm_head under layer -1)."""
    rank = int(peft_spec.get("r", 8))
    targets = peft_spec.get("target_modules") or DEFAULT_LORA["target_modules"]
    if isinstance(targets, str):  # a regex or "all-linear": assume the common attention set
        targets = DEFAULT_LORA["target_modules"]
    params = 0
    d_in_by_layer: dict[int, int] = {}
    for target in targets:
        found = _LAYER_TARGET.search(str(target))
        module = found.group(2) if found else str(target)
        d_in, d_out = _module_dims(info, module)
        layers = (
            [-1]
            if module.endswith("lm_head")
            else ([int(found.group(1))] if found else list(range(info.layers)))
        )
        for layer in layers:
            params += rank * (d_in + d_out)
            d_in_by_layer[layer] = d_in_by_layer.get(layer, 0) + d_in
    return params, d_in_by_layer


def weight_bytes(config: Mapping[str, Any]) -> int:
    """Bytes per base weight at the config's precision (`prec`: fp32, else bf16 or fp16)."""
    return 4 if str(config.get("prec", "bf16")).lower() in ("fp32", "float32", "32") else 2


def first_int(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of `keys` the config sets to a positive integer (not a bool)."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class EstimateConstants:
    """The estimate's free constants (module docstring); benchmarks/memory_fit.py fits them."""

    alpha: float = ALPHA
    checkpoint_per_layer: float = 2.0  # bytes per token per layer per hidden unit kept at boundaries
    logit_bytes: float = LOGIT_BYTES
    misc_mib: float = MISC_MIB
    allocator_factor: float = ALLOCATOR_FACTOR
    context_mib: float = CONTEXT_MIB
    # False: the allocator's gap applies to what is allocated and freed each step, not to the weights and
    # adapter states allocated once in exact blocks
    gap_on_weights: bool = True


def estimate_peak_mib(
    config: Mapping[str, Any],
    model_info: ModelInfo | None,
    peft_spec: Mapping[str, Any] | None = None,
    constants: EstimateConstants | None = None,
) -> int | None:
    """Estimated per-process peak (MiB) of a LoRA run of `config` (level overrides merged).

    The LoRA spec is `peft_spec`, else a mapping under the config's `peft` key, else r=8 on
    q,k,v,o. None when the model's shape or the batch size is unknown.
    """
    batch = first_int(config, BATCH_KEYS)
    if model_info is None or batch is None:
        return None
    if peft_spec is None:
        peft_spec = config["peft"] if isinstance(config.get("peft"), Mapping) else DEFAULT_LORA
    seq = max_seq_len_of(config)
    h, n_layers = model_info.hidden, model_info.layers
    bytes_w = weight_bytes(config)
    lora_params, d_in_by_layer = lora_footprint(model_info, peft_spec)
    dropout = float(peft_spec.get("lora_dropout", 0.0) or 0.0)
    per_input = CAST_BYTES + (DROPOUT_BYTES if dropout > 0 else 0)
    k = constants or CALIBRATED
    alpha = k.alpha
    if config.get("gradient_checkpointing") is True:
        per_token = (
            k.checkpoint_per_layer * h * n_layers + alpha * h
            + max(d_in_by_layer.values(), default=0) * per_input
        )
    else:
        per_token = alpha * h * n_layers + sum(d_in_by_layer.values()) * per_input
    kept = config.get("logits_to_keep")
    kept_positions = (
        kept if isinstance(kept, int) and not isinstance(kept, bool) and kept > 0 else seq
    )
    fixed = model_info.n_params * bytes_w + 16 * lora_params
    transient = (
        batch * seq * per_token
        + k.logit_bytes * batch * min(kept_positions, seq) * model_info.vocab
        + k.misc_mib * MIB
    )
    if k.gap_on_weights:
        return math.ceil(k.allocator_factor * (fixed + transient) / MIB + k.context_mib)
    return math.ceil((fixed + k.allocator_factor * transient) / MIB + k.context_mib)


def estimated_base_mib(config: Mapping[str, Any], model_info: ModelInfo | None,
                       constants: EstimateConstants | None = None) -> int | None:
    """What a process of this model holds before any job's own needs, as the estimate counts it:
    the base's weights at the config's precision and the CUDA context. A job that joins a warm
    process of the base (`share_base: fused`) needs its estimate less this. None: the model's
    shape is unknown."""
    if model_info is None:
        return None
    bytes_w = weight_bytes(config)
    k = constants or CALIBRATED
    return math.floor(model_info.n_params * bytes_w / MIB + k.context_mib)


DEFAULT_CONSTANTS = EstimateConstants()
# Fitted by `python -m benchmarks.memory_fit` to 42 measured peaks (Llama and GLA of 1.3B shape
# on an H200, batch 4-128, 34-256 tokens, with and without checkpointing): max |error| 9.5 %,
# mean 4.2 %, against 54.8 % / 24.6 % for the textbook constants above, which overstate. The
# allocator's gap on the weights too (the earlier form) left checkpointed runs, mostly weights,
# up to 18 % high and long uncheckpointed ones up to 17 % low: no constants fitted both.
CALIBRATED = EstimateConstants(
    alpha=20, checkpoint_per_layer=1, logit_bytes=2, misc_mib=384, allocator_factor=1.05, context_mib=576,
    gap_on_weights=False,
)


def max_seq_len_of(config: Mapping[str, Any]) -> int:
    return first_int(config, _SEQ_KEYS) or DEFAULT_SEQ_LEN


def prompt_length_key(config: Mapping[str, Any], data: str) -> str:
    """Runs of one model on one data set at one maximum length see the same prompts, whatever
    their LoRA spec, batch or level: what one of them reports holds for all of them."""
    return f"{config.get('model', '')}|{data}|{max_seq_len_of(config)}"


def at_learned_length(config: Mapping[str, Any], longest_tokens: int | None) -> Mapping[str, Any]:
    """`config` estimated at the longest prompt a finished run of the same model and data
    reported, when that is below max_seq_len: batches are padded to their longest item, so
    max_seq_len alone overstates short GLUE prompts many times over."""
    if longest_tokens is None or not 0 < longest_tokens < max_seq_len_of(config):
        return config
    return {**config, "max_seq_len": longest_tokens}


def shape_key(config_content_hash: str, model: str, task: str) -> str:
    """Attempts with equal keys should peak alike: same memory-relevant content of the config the
    script receives (`orchestrator.prediction.shapes.memory_hash`, after `--set` and the ladder's changes),
    model and task. The ladder level is not part of it: two attempts passing the same settings
    have one shape, whichever level or config name they came from."""
    return f"{config_content_hash}|{model}|{task}"


@dataclass(frozen=True)
class Prediction:
    mib: int
    source: PredictionSource  # OOM_FLOOR: an earlier OOM of the shape raised the figure above the others


def _max(*values: int | None) -> int | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


OOM_FLOOR_GROWTH = 1.25  # each further OOM of a shape raises its floor by at least this factor


def update_shape(
    old: ShapeMemory | None,
    observed_peak_mib: int | None,
    outcome: AttemptOutcome,
    held_at_oom_mib: int | None,
    placed_mib: int | None = None,
) -> ShapeMemory:
    """Fold one finished attempt into its shape's record. A completed attempt's peak is a
    measurement; any other attempt's peak so far (and what an OOM'd one held) is a floor.
    `placed_mib`: the size the attempt was placed at (None: unknown, taken as at the floor)."""
    old = old or ShapeMemory(peak_mib=None, oom_floor_mib=None, samples=0)
    if outcome is AttemptOutcome.SUCCEEDED:
        if observed_peak_mib is None:
            return old
        peak_mib = max(old.peak_mib or 0, observed_peak_mib)
        # A floor set before this measurement was a guess at an unknown need (and grows
        # geometrically on repeated OOMs); the measurement supersedes it. An OOM after it
        # raises the floor above the measurement again.
        floor = None if old.oom_floor_mib is None else min(old.oom_floor_mib, peak_mib)
        return ShapeMemory(peak_mib, floor, old.samples + 1, old.disproved_mib)
    held = held_at_oom_mib if outcome is AttemptOutcome.OOM else None
    floor = _max(old.oom_floor_mib, observed_peak_mib, held)
    if (
        outcome is AttemptOutcome.OOM and old.oom_floor_mib is not None and floor is not None
        and (placed_mib is None or placed_mib >= old.oom_floor_mib)
    ):
        # It died again although placed at or above the floor: what an OOM'd job held is what
        # it got on a full card, not what it needs, so raise the floor geometrically. One
        # placed below it (started beside the first OOM, before the floor existed) says nothing new.
        floor = max(floor, math.ceil(old.oom_floor_mib * OOM_FLOOR_GROWTH))
    disproved = old.disproved_mib
    if outcome is AttemptOutcome.OOM and placed_mib:
        disproved = max(disproved or 0, placed_mib)  # that figure was not enough: never again
    return ShapeMemory(old.peak_mib, floor, old.samples, disproved)


def predict_peak_mib(
    measured: ShapeMemory | None,
    estimated_mib: int | None,
    declared_mib: int | None,
    margin_fraction: float | None = None,
    running: RunningPeak | None = None,
    transfer: Transfer | None = None,
    held: RunningPeak | None = None,
    family: Prediction | None = None,
    disproven_mib: int | None = None,
) -> Prediction:
    """The first that is known, plus a margin: the shape's measured peak (completed attempts;
    margin shrinking with their number, or `margin_fraction`), else the peak so far of its
    running attempts past step K (a wider margin, shrinking as they run on), else a peak
    predicted by the shape's memory family (`family`: its fit over other batch sizes), else a peak
    borrowed from a neighbouring shape (`transfer`: a lower ladder level, another task), else
    the estimate, else the declared figure. Once an OOM has struck a family that has measured
    nothing (`disproven_mib`: the most its members held), the estimate and the declared figure
    are proven too low: the figure is raised above both by OOM_FLOOR_GROWTH. Never below what a
    running attempt of the shape already holds before step K (`held`, with the running margin), nor
    the OOM floor × (1 + margin)."""
    if measured is not None and measured.peak_mib is not None:
        margin = measured_margin(measured.samples) if margin_fraction is None else margin_fraction
        # running attempts count at this margin: a shape measured to completion is known
        peak_mib = max([measured.peak_mib, *(r.peak_mib for r in (running, held) if r is not None)])
        figure_mib = math.ceil(peak_mib * (1 + margin))
        # the margin over a peak measured to completion is slack the card's headroom covers; over a live
        # attempt's peak beyond it, growth that may go on (no margin given to the headroom)
        given_mib = figure_mib - peak_mib if peak_mib == measured.peak_mib else 0
        prediction = Prediction(figure_mib, PredictionSource(SourceKind.MEASURED, margin_mib=given_mib))
    elif running is not None:
        prediction = Prediction(
            math.ceil(running.peak_mib * (1 + running_margin(running.step))),
            PredictionSource(SourceKind.RUNNING, step=running.step),
        )
    elif family is not None:
        prediction = family
    elif transfer is not None:
        margin = measured_margin(1) if margin_fraction is None else margin_fraction
        prediction = Prediction(math.ceil(transfer.mib * (1 + margin)), transfer.source)
    elif estimated_mib is not None:
        prediction = Prediction(estimated_mib, PredictionSource(SourceKind.ESTIMATE))
    elif declared_mib is not None:
        prediction = Prediction(declared_mib, PredictionSource(SourceKind.DECLARED))
    else:
        prediction = Prediction(0, PredictionSource(SourceKind.NONE))
    if disproven_mib is not None and prediction.source.kind in (
        SourceKind.ESTIMATE,
        SourceKind.DECLARED,
        SourceKind.NONE,
    ):
        prediction = Prediction(math.ceil(max(prediction.mib, disproven_mib) * OOM_FLOOR_GROWTH),
                                PredictionSource(SourceKind.OOM_FLOOR))
    if held is not None and prediction.source.kind is not SourceKind.MEASURED:
        held_mib = math.ceil(held.peak_mib * (1 + running_margin(held.step)))
        if held_mib > prediction.mib:
            prediction = Prediction(held_mib, PredictionSource(SourceKind.RUNNING, step=held.step))
    if measured is not None and measured.oom_floor_mib is not None:
        # the margin the measured peak gets: a floor equal to that peak must not outbid it
        margin = measured_margin(measured.samples) if margin_fraction is None else margin_fraction
        floor_mib = math.ceil(measured.oom_floor_mib * (1 + margin))
        if floor_mib > prediction.mib:
            # Say so: "declared" beside 6.6 GiB when the suite declared 4 GiB misleads.
            return Prediction(floor_mib, PredictionSource(SourceKind.OOM_FLOOR))
    return prediction
