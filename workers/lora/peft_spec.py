"""LoRA spec (JSON or inline) -> keyword arguments for peft's LoraConfig. Pure: no torch, no peft.

Specs written for GLA (`attn.q_proj`, `layers.3.attn.q_proj`, `attn.g_proj`) are translated
for Llama-style models: peft matches target names by suffix, and a Llama's projections live
under `self_attn.*` / `mlp.*`, so we keep the final name, turn `layers.N.` into
`layers_to_transform`, and drop the modules only GLA has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.plans.lora_keys import LORA_SPEC_KEYS, LORA_SPEC_RECORD_KEYS, LORA_SPEC_SHORT_KEYS
from workers.lora.config import ConfigError

LLAMA_TARGETS = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
)
# Once read from the environment over the spec; no more: a setting that changes the science
# belongs in the config, where the job's identity and result.json see it.
RETIRED_ENV = ("ORCH_LORA_R", "ORCH_LORA_ALPHA", "ORCH_LORA_DROPOUT")


def lora_kwargs(
    spec: Mapping[str, Any], model_kind: str, env: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """LoraConfig keyword arguments and warnings; `model_kind` is "gla" or "llama"."""
    warnings: list[str] = []
    kwargs: dict[str, Any] = {"task_type": "CAUSAL_LM"}
    for key, value in spec.items():
        name = LORA_SPEC_SHORT_KEYS.get(key, key)
        if name in LORA_SPEC_KEYS:
            kwargs[name] = value
        elif key not in LORA_SPEC_RECORD_KEYS:
            warnings.append(f"ignoring unknown LoRA spec key {key!r}")
    for variable in RETIRED_ENV:
        if env.get(variable):
            warnings.append(f"{variable} is not read: set the LoRA setting in the peft spec")
    if not isinstance(kwargs.get("r", 8), int) or kwargs.get("r", 8) < 1:
        raise ConfigError(f"LoRA rank r must be a positive integer, got {kwargs.get('r')!r}")
    if not 0 <= float(kwargs.get("lora_dropout", 0.0)) < 1:
        raise ConfigError(f"lora_dropout must be in [0, 1), got {kwargs.get('lora_dropout')!r}")
    targets = kwargs.get("target_modules")
    if model_kind != "gla" and isinstance(targets, list):
        names, layers, notes = translate_targets([str(t) for t in targets])
        warnings.extend(notes)
        kwargs["target_modules"] = names
        if layers is not None and "layers_to_transform" not in kwargs:
            kwargs["layers_to_transform"] = layers
    return kwargs, warnings


def translate_targets(targets: list[str]) -> tuple[list[str], list[int] | None, list[str]]:
    """GLA-style target names -> (Llama names, layer restriction or None, warnings)."""
    names: list[str] = []
    layer_sets: list[set[int] | None] = []
    dropped: list[str] = []
    for target in targets:
        parts = target.split(".")
        base = next((p for p in reversed(parts) if not p.isdigit()), target)
        if base not in LLAMA_TARGETS:
            dropped.append(target)
            continue
        if base not in names:
            names.append(base)
        layers = {
            int(parts[i + 1])
            for i, p in enumerate(parts[:-1])
            if p == "layers" and parts[i + 1].isdigit()
        }
        layer_sets.append(layers or None)
    warnings = []
    if dropped:
        warnings.append(f"dropping LoRA targets this model does not have: {', '.join(dropped)}")
    if not names:
        raise ConfigError(f"no LoRA target of {targets} exists in this model")
    restricted = [s for s in layer_sets if s is not None]
    if not restricted:
        return names, None, warnings
    if len(restricted) < len(layer_sets):
        warnings.append("some LoRA targets name layers and some do not: applying to all layers")
        return names, None, warnings
    return names, sorted(set().union(*restricted)), warnings
