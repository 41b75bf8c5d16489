"""Models, tokenizers and LoRA: local directories (nothing is downloaded) or tiny built-ins."""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workers.lora.config import ConfigError, RunConfig
from workers.lora.data import DIGIT_WORDS, TASKS
from workers.lora.peft_spec import lora_kwargs
from workers.lora.sample_data import VOCABULARY

# Waits before the second and third try of reading a model whose read failed for a reason
# other than a missing file.
LOAD_RETRY_WAITS_S = (5.0, 30.0)
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
TINY_HIDDEN = 32
TINY_LAYERS = 2
TINY_HEADS = 2


class ModelLoadError(RuntimeError):
    """Reading the model failed for a reason other than a missing file or a bad config."""


def model_kind(model: str) -> str:
    """ "gla" for GLA models (need fla), else "llama" (any HF causal LM)."""
    if model == "tiny-gla":
        return "gla"
    if model == "tiny-llama":
        return "llama"
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {model}/config.json: {exc}") from None
    return "gla" if config.get("model_type") == "gla" else "llama"


def require_fla() -> None:
    try:
        import fla  # noqa: F401  (registers GLA with AutoModelForCausalLM)
    except ImportError:
        raise ConfigError(
            "GLA models need flash-linear-attention (`pip install fla-core flash-linear-attention`)"
        ) from None


def tiny_vocabulary() -> list[str]:
    """Every word the prompts, label words and sample data use, lower-cased."""
    words: list[str] = list(SPECIAL_TOKENS)
    texts = [spec.template + spec.tail + " ".join(spec.label_words) for spec in TASKS.values()]
    texts += [" ".join(VOCABULARY), " ".join(DIGIT_WORDS)]
    for text in texts:
        for token in re.findall(r"\w+|[^\w\s]+", text.lower()):
            if token not in words:
                words.append(token)
    return words


def build_tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(tiny_vocabulary())}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )


def build_tiny_llama(seed: int = 0) -> tuple[Any, Any]:
    """A random-initialised 2-layer Llama (hidden 32) and its word-level tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=TINY_HIDDEN, intermediate_size=2 * TINY_HIDDEN,
        num_hidden_layers=TINY_LAYERS, num_attention_heads=TINY_HEADS, num_key_value_heads=TINY_HEADS,
        max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config), tokenizer


def build_tiny_gla(seed: int = 0) -> tuple[Any, Any]:
    require_fla()
    if not torch.cuda.is_available():
        raise ConfigError("tiny-gla needs a CUDA GPU (fla kernels are Triton)")
    from fla.models import GLAConfig, GLAForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = GLAConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=TINY_LAYERS, num_heads=TINY_HEADS,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    return GLAForCausalLM(config), tokenizer


def save_tiny_llama(directory: Path, seed: int = 0) -> Path:
    """Write the tiny Llama as a local model directory (for tests and demos)."""
    model, tokenizer = build_tiny_llama(seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)


def load_model(
    config: RunConfig, dtype: torch.dtype, log: Callable[[str], None] | None = None
) -> tuple[Any, Any, str]:
    """(model on CPU in `dtype`, tokenizer with left padding, model kind)."""
    kind = model_kind(config.model)
    if config.model == "tiny-llama":
        model, tokenizer = build_tiny_llama()  # fixed base weights: seeds vary LoRA and data order
    elif config.model == "tiny-gla":
        model, tokenizer = build_tiny_gla()
    else:
        if kind == "gla":
            require_fla()
            import fla  # noqa: F401
        model, tokenizer = load_pretrained(config.model, dtype, log or (lambda _: None))
    model = model.to(dtype)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.use_cache = False
    return model, tokenizer, kind


def load_pretrained(directory: str, dtype: torch.dtype, log: Callable[[str], None]) -> tuple[Any, Any]:
    """(model, tokenizer) from a local directory. A missing file or a config transformers
    refuses is a config error (retrying cannot help); any other OSError (an NFS hiccup, EIO,
    too many open files) is tried again after a wait, then fails the attempt, which orch may
    retry: a flaky disk must not mark a good config as wrong for good."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for attempt, wait_s in enumerate((*LOAD_RETRY_WAITS_S, None), start=1):
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
            return model, tokenizer
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"cannot load model from {directory}: {_first_line(exc)}") from None
        except OSError as exc:
            if _is_missing(exc, directory):
                raise ConfigError(f"cannot load model from {directory}: {_first_line(exc)}") from None
            if wait_s is None:
                raise ModelLoadError(
                    f"cannot read model from {directory} (tried {attempt} times): {_first_line(exc)}"
                ) from exc
            log(f"warning: reading the model failed ({_first_line(exc)}); trying again in {wait_s:g} s")
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def _is_missing(exc: OSError, directory: str) -> bool:
    """A path that is not there: ENOENT/ENOTDIR, the directory gone, or transformers' own
    errno-less OSError for a file the directory lacks (weights, tokenizer files)."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return True
    if not (Path(directory) / "config.json").is_file():
        return True
    return exc.errno is None and not isinstance(exc, TimeoutError | ConnectionError)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def apply_lora(model: Any, spec: dict[str, Any], kind: str) -> tuple[Any, list[str]]:
    from peft import get_peft_model

    lora_config, warnings = build_lora_config(spec, kind)
    try:
        return get_peft_model(model, lora_config), warnings
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid LoRA spec: {str(exc).splitlines()[0]}") from None


def build_lora_config(spec: dict[str, Any], kind: str) -> tuple[Any, list[str]]:
    """(peft LoraConfig of a spec for this model kind, warnings); ConfigError when invalid."""
    from peft import LoraConfig

    kwargs, warnings = lora_kwargs(spec, kind, os.environ)
    try:
        return LoraConfig(**kwargs), warnings
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid LoRA spec: {str(exc).splitlines()[0]}") from None


LORA_SETTINGS = ("r", "lora_alpha", "lora_dropout", "target_modules", "layers_to_transform",
                 "use_dora", "use_rslora", "bias", "modules_to_save", "exclude_modules")  # fmt: skip


def lora_settings(
    model: Any, adapter: str = "default", params: dict[str, torch.Tensor] | None = None
) -> dict[str, Any]:
    """For result.json: the LoRA settings peft applied (after the spec's translation for this
    model) as `lora`, and the trainable and total parameter counts (of `adapter` alone: a fused
    group's model holds several; `params`, its own trainable parameters)."""
    applied = model.peft_config[adapter]
    lora: dict[str, Any] = {}
    for name in LORA_SETTINGS:
        value = getattr(applied, name, None)
        lora[name] = sorted(value) if isinstance(value, set | frozenset) else value
    total = sum(p.numel() for p in model.parameters())
    if params is None:
        trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    else:
        trainable_count = sum(p.numel() for p in params.values())
    return {
        "lora": lora,
        # top level too, for orch: dropout > 0 makes a halved batch draw other masks
        "lora_dropout": float(lora["lora_dropout"] or 0.0),
        "trainable_params": trainable_count,
        "total_params": total - sum(p.numel() for p in model.parameters() if p.requires_grad) + trainable_count,
    }


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing (works with frozen embeddings, no input grads needed)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def is_checkpointing(model: Any) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for attribute in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(base), attribute) or hasattr(base, attribute):
            return bool(getattr(base, attribute))
    return False
