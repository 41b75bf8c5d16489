"""The training loop: AdamW on the LoRA parameters, loss on the one answer token, best-on-val."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import random
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from orchestrator.attempts.divergence import summarise_losses
from workers.harness import Heartbeat
from workers.lora.base_cache import BaseCache
from workers.lora.batching import Encoded, LeftPadCollator, answer_token_ids
from workers.lora.checkpoint import LoopState, load_checkpoint, remove_checkpoints, save_checkpoint
from workers.lora.config import RunConfig
from workers.lora.data import MISMATCHED_SPLIT, parse_data_name
from workers.lora.dropout import KEYED_DROPOUT, install_keyed_dropout
from workers.lora.metrics import PRIMARY_METRIC, task_metrics
from workers.lora.model import apply_lora, enable_checkpointing, lora_settings
from workers.lora.optimizer import apply_update, build_optimizer, describe_optimizer
from workers.lora.order import EpochOrder

MIB = 1024 * 1024
TRUNCATION_WARN_SHARE = 0.01  # more truncated examples than this share of a split: a warning
Log = Callable[[str], None]


@dataclass
class TrainOutcome:
    metrics: dict[
        str, dict[str, float]
    ]  # {"val": best val scores, "test": scores with best weights}
    steps: int  # optimizer steps
    samples_seen: int
    train_seconds: float
    samples_per_s: float
    best_step: int
    losses: list[float] = field(default_factory=list)  # mean loss per optimizer step
    memory: dict[str, Any] = field(default_factory=dict)
    # the longest prompt after truncation, over all splits: batches are padded to their longest
    # item, so this (not max_seq_len) bounds the activations; orch learns it per model and data
    longest_tokens: int = 0
    # what ran, for result.json: the applied LoRA settings, parameter counts, the optimizer
    settings: dict[str, Any] = field(default_factory=dict)
    # per split: examples, and how many of them lost text to max_seq_len
    examples: dict[str, int] = field(default_factory=dict)
    truncated: dict[str, int] = field(default_factory=dict)
    loss_summary: dict[str, Any] = field(default_factory=dict)  # divergence.LossSummary.to_record()


def select_device() -> torch.device:
    wanted = os.environ.get("ORCH_WORKER_DEVICE")
    if wanted:
        return torch.device(wanted)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory: CUDA allocator reservation on a GPU, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return {
            "peak_mem_mib": math.ceil(torch.cuda.max_memory_reserved(device) / MIB),
            "peak_mem_allocated_mib": math.ceil(torch.cuda.max_memory_allocated(device) / MIB),
            "peak_mem_kind": "cuda_max_memory_reserved",
        }
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_mem_mib": math.ceil(rss_kib / 1024), "peak_mem_kind": "cpu_peak_rss"}


def build_loader(
    encoded: list[Encoded], batch_size: int, collator: LeftPadCollator, num_workers: int,
    order: EpochOrder | None, seed: int,
) -> DataLoader[Encoded]:  # fmt: skip
    """Batches in `order` (the epoch's permutation; None: as listed). The loader's own
    generator only seeds its worker processes, and is private: a loader iterator would
    otherwise draw that seed from torch's global RNG, which LoRA dropout uses."""
    return DataLoader(
        encoded,  # type: ignore[arg-type]  # a list is a map-style dataset
        batch_size=batch_size,
        sampler=order,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=collator,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


def answer_logits(
    model: Any, batch: dict[str, torch.Tensor], logits_to_keep: int, kind: str
) -> torch.Tensor:
    """Logits predicting the answer token (the last position), shape [batch, vocab], fp32."""
    inputs: dict[str, Any] = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
    }
    if kind != "gla":  # GLA has no position embeddings; Llama needs them to skip left padding
        inputs["position_ids"] = batch["position_ids"]
    argument = logits_to_keep_argument(model) if logits_to_keep > 0 else None
    if argument is not None:
        inputs[argument] = logits_to_keep
    return model(**inputs).logits[:, -1, :].float()


def logits_to_keep_argument(model: Any) -> str | None:
    """The name the model's forward gives the logits-to-keep count: `logits_to_keep`
    (transformers >= 4.50), `num_logits_to_keep` (4.45-4.49), or None when it takes neither."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = inspect.signature(base.forward).parameters
    return next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in parameters), None)


def train_step(
    model: Any, batch: dict[str, torch.Tensor], config: RunConfig, kind: str, loss_scale: float
) -> float:
    """Forward and backward of one micro-batch; returns the batch's mean loss."""
    logits = answer_logits(model, batch, config.logits_to_keep, kind)
    loss_sum = torch.nn.functional.cross_entropy(logits, batch["target_ids"], reduction="sum")
    (loss_sum * loss_scale).backward()
    return float(loss_sum.detach()) / len(batch["target_ids"])


@torch.no_grad()
def evaluate(model: Any, loader: DataLoader[Encoded], answer_ids: list[int], task: str, kind: str,
             device: torch.device, autocast: Callable[[], Any],
             beat: Callable[[int, int], None] = lambda done, total: None) -> dict[str, float]:  # fmt: skip
    """Scores of the model on a loader; `beat(batches done, batches)` after each batch."""
    model.eval()
    predictions: list[int] = []
    labels: list[int] = []
    for done, batch in enumerate(loader, start=1):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast():
            logits = answer_logits(model, batch, 1, kind)
        predictions += logits[:, answer_ids].argmax(-1).tolist()
        labels += batch["labels"].tolist()
        beat(done, len(loader))
    model.train()
    return task_metrics(task, predictions, labels)


def run(
    config: RunConfig, run_dir: Path, heartbeat: Heartbeat, log: Log,
    cache: BaseCache | None = None, digests: tuple[str, str] = ("", ""), *,
    keep_checkpoints: bool = False,
) -> TrainOutcome:  # fmt: skip
    """Train, evaluate on val, keep the best LoRA weights, score test; save the adapter.
    `cache`: the base and tokenised data a warm process kept (None: a fresh one); `digests`:
    the model's and the data's content, which key what it keeps. Its checkpoints are removed at
    the end unless `keep_checkpoints` (the caller removes them once the result is written: a kill
    during the clean-up then loses nothing)."""
    cache = cache or BaseCache()
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    device = select_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    task = parse_data_name(config.data).task
    dtype = torch.bfloat16 if config.prec == "bf16" else torch.float32
    model, tokenizer, kind = cache.base(config, dtype, device, log, digests[0])
    encoded, truncated = cache.splits(config, tokenizer, digests[1])
    torch.manual_seed(config.seed)  # LoRA init depends on the seed, not on how the base was built
    model, warnings = apply_lora(model, config.peft, kind)
    cache.adapted(model)
    for warning in warnings:
        log(f"warning: {warning}")
    draw_key = install_keyed_dropout(model, config.seed)
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    if config.logits_to_keep > 0 and logits_to_keep_argument(model) is None:
        log(f"warning: logits_to_keep: {config.logits_to_keep} has no effect: this model's forward "
            "takes neither logits_to_keep nor num_logits_to_keep, so it computes every position's logits")  # fmt: skip
    model.to(device)
    model.train()
    answer_ids = answer_token_ids(tokenizer, task)
    collator = LeftPadCollator(tokenizer.pad_token_id, answer_ids)
    for name, count in truncated.items():
        if count > TRUNCATION_WARN_SHARE * len(encoded[name]):
            log(f"warning: {count} of {len(encoded[name])} {name} examples ({100 * count / len(encoded[name]):.1f} %) "
                f"are longer than max_seq_len {config.max_seq_len} and lost text from their longest field")  # fmt: skip
    order = EpochOrder(len(encoded["train"]), config.seed)
    train_loader = build_loader(
        encoded["train"], config.batch_size, collator, config.num_data_workers, order, config.seed
    )
    # Evaluation keeps no activations for backward: a larger batch, longest prompts first (an
    # OOM shows at once; similar lengths share a batch, so little padding). Scores do not depend
    # on the order or the batch beyond float rounding.
    eval_loaders = {
        name: build_loader(sorted(encoded[name], key=lambda e: -len(e.input_ids)),
                           config.eval_batch_size or 2 * config.batch_size, collator, 0, None, 0)
        for name in ("val", "test", MISMATCHED_SPLIT) if name in encoded
    }  # fmt: skip

    def autocast() -> Any:
        if config.prec == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    params = [p for p in model.parameters() if p.requires_grad]
    accum = config.gradient_accumulation_steps
    n_train = len(encoded["train"])
    updates_per_epoch = math.ceil(n_train / config.effective_batch_size)
    total_steps = config.max_steps or (config.num_epochs or 1) * updates_per_epoch
    optimizer, scheduler = build_optimizer(params, config, total_steps)
    settings = lora_settings(model) | {
        "optimizer": describe_optimizer(config, total_steps),
        # what a ladder rung may change, as this attempt ran it
        "prec": config.prec,
        "batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "effective_batch_size": config.effective_batch_size,
        "gradient_checkpointing": config.gradient_checkpointing,
        "logits_to_keep": config.logits_to_keep,
        "num_data_workers": config.num_data_workers,
    }
    if draw_key is not None:
        settings["dropout_masks"] = KEYED_DROPOUT
    primary = PRIMARY_METRIC[task]
    log(f"{config.data}: {n_train} train / {len(encoded['val'])} val / {len(encoded['test'])} test, "
        f"{total_steps} optimizer steps, effective batch {config.effective_batch_size}, device {device}")  # fmt: skip

    step, samples_seen, train_seconds, last_beat_s = 0, 0, 0.0, 0.0
    best_score, best_step, best_val = -math.inf, 0, {}
    best_state: dict[str, torch.Tensor] = {}
    losses: list[float] = []
    beat_interval_s = float(os.environ.get("ORCH_HEARTBEAT_S", "5"))

    def eval_beat(split: str) -> Callable[[int, int], None]:
        def beat(done: int, batches: int) -> None:  # liveness while a long evaluation runs
            nonlocal last_beat_s
            if time.monotonic() - last_beat_s >= beat_interval_s:
                last_beat_s = time.monotonic()
                heartbeat.beat(step, total_steps, None, None, peak_memory(device)["peak_mem_mib"],
                               eval_split=split, eval_batches_done=done, eval_batches=batches)  # fmt: skip

        return beat

    def evaluate_val() -> None:
        nonlocal best_score, best_step, best_val, best_state
        scores = evaluate(model, eval_loaders["val"], answer_ids, task, kind, device, autocast,
                          eval_beat("val"))  # fmt: skip
        if scores[primary] > best_score:
            best_score, best_step, best_val = scores[primary], step, scores
            best_state = {
                k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad
            }
        heartbeat.beat(
            step, total_steps, None, None, peak_memory(device)["peak_mem_mib"], val=scores
        )

    epoch, consumed = 0, 0  # consumed: examples of the epoch's permutation trained on so far
    if config.resume_from_checkpoint is not None:
        loop, best_state = load_checkpoint(
            config.resume_from_checkpoint, model, optimizer, scheduler, config
        )
        step, epoch, consumed = loop.step, loop.epoch, loop.consumed_in_epoch
        samples_seen, train_seconds, losses = loop.samples_seen, loop.train_seconds, loop.losses
        best_score, best_step, best_val = loop.best_score, loop.best_step, loop.best_val
        log(f"resumed from {config.resume_from_checkpoint}: step {step} of {total_steps}, "
            f"epoch {epoch + 1} with {consumed} of its {n_train} examples done")  # fmt: skip

    start_step = step
    epoch_start_step = step
    while step < total_steps:
        epoch_start_step = step - math.ceil(consumed / config.effective_batch_size)
        order.set_epoch(epoch, skip=consumed)  # a resumed epoch goes on where its checkpoint was
        for group in _groups(iter(train_loader), accum):
            started_s = time.perf_counter()
            group_samples = sum(len(b["labels"]) for b in group)
            loss_total = 0.0
            for micro_batch, batch in enumerate(group):
                batch = {k: v.to(device) for k, v in batch.items()}
                if draw_key is not None:
                    draw_key.at(step, micro_batch, batch["input_ids"].shape[1])
                with autocast():
                    loss_total += train_step(model, batch, config, kind, 1.0 / group_samples) * len(
                        batch["labels"]
                    )
            update = apply_update(optimizer, scheduler, params, config.max_grad_norm,
                                  loss_total / group_samples, step + 1, total_steps)  # fmt: skip
            step += 1
            samples_seen += group_samples
            consumed += group_samples
            losses.append(loss_total / group_samples)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            train_seconds += time.perf_counter() - started_s
            # every optimizer step is a line (orch keeps each in the attempt's history); the
            # timer only paces the liveness lines of a long evaluation
            last_beat_s = time.monotonic()
            heartbeat.beat(step, total_steps, losses[-1], samples_seen / train_seconds,
                           peak_memory(device)["peak_mem_mib"], grad_norm=update.grad_norm,
                           lr=update.learning_rate)  # fmt: skip
            if config.eval_every_steps and step % config.eval_every_steps == 0:
                evaluate_val()
            every = config.checkpoint_every_steps
            if every and step % every == 0 and step < total_steps:
                loop = LoopState(step, epoch, consumed, samples_seen, train_seconds, losses,
                                 best_score, best_step, best_val)  # fmt: skip
                # a save also removes the older checkpoints: never after orch stopped the job
                # (a warm process's job outlives its client by up to an evaluation)
                heartbeat.check_stopped()
                saved = save_checkpoint(run_dir, loop, model, optimizer, scheduler, best_state, config,
                                        heartbeat.check_stopped)
                log(f"saved {saved}")
            if step >= total_steps:
                break
        if not config.eval_every_steps:
            evaluate_val()  # end of each epoch (or of max_steps mid-epoch)
        elif step >= total_steps and step % config.eval_every_steps != 0:
            evaluate_val()  # the last steps since the previous evaluation
        epoch, consumed = epoch + 1, 0

    if config.checkpoint_every_steps and step > start_step:
        # before test is scored: an evaluation that runs out of memory resumes here, not up to
        # checkpoint_every_steps - 1 steps back
        loop = LoopState(step, epoch, 0, samples_seen, train_seconds, losses, best_score, best_step, best_val)
        heartbeat.check_stopped()
        saved = save_checkpoint(run_dir, loop, model, optimizer, scheduler, best_state, config, heartbeat.check_stopped)
        log(f"saved {saved}")
    with torch.no_grad():
        named = dict(model.named_parameters())
        for name, value in best_state.items():
            named[name].copy_(value)
    test_scores = evaluate(model, eval_loaders["test"], answer_ids, task, kind, device, autocast,
                           eval_beat("test"))  # fmt: skip
    if MISMATCHED_SPLIT in eval_loaders:  # MNLI: matched is `test`, mismatched beside it
        mismatched = evaluate(model, eval_loaders[MISMATCHED_SPLIT], answer_ids, task, kind, device, autocast,
                              eval_beat(MISMATCHED_SPLIT))  # fmt: skip
        test_scores |= {f"{name}_mismatched": value for name, value in mismatched.items()}
    if not config.no_save:
        model.save_pretrained(run_dir / "adapter")
    if not keep_checkpoints:
        remove_checkpoints(run_dir)  # finished: nothing left to resume
    return TrainOutcome(
        metrics={"val": best_val, "test": test_scores},
        steps=step,
        samples_seen=samples_seen,
        train_seconds=train_seconds,
        samples_per_s=samples_seen / train_seconds if train_seconds else 0.0,
        best_step=best_step,
        losses=losses,
        memory=peak_memory(device),
        longest_tokens=max((len(e.input_ids) for split in encoded.values() for e in split), default=0),
        settings=settings,
        examples={name: len(items) for name, items in encoded.items()},
        truncated=truncated,
        loss_summary=summarise_losses(losses, step - epoch_start_step).to_record(),
    )


def _groups(
    batches: Iterator[dict[str, torch.Tensor]], size: int
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Micro-batches in groups of `size` (the last group of an epoch may be shorter)."""
    group: list[dict[str, torch.Tensor]] = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group
