"""The training loop: AdamW on the LoRA parameters, loss on the one answer token, best-on-val."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import random
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from orchestrator.attempts.divergence import summarise_losses
from workers.harness import Heartbeat
from workers.lora.base_cache import BaseCache
from workers.lora.batching import Encoded, LeftPadCollator, answer_token_ids
from workers.lora.checkpoint import (
    LoopState,
    load_checkpoint,
    remove_checkpoints,
    save_checkpoint,
    trainable,
)
from workers.lora.config import RunConfig
from workers.lora.data import MISMATCHED_SPLIT, parse_data_name
from workers.lora.device import peak_memory, select_device
from workers.lora.dropout import KEYED_DROPOUT, install_keyed_dropout
from workers.lora.metrics import PRIMARY_METRIC, task_metrics
from workers.lora.model import apply_lora, enable_checkpointing, is_checkpointing, lora_settings
from workers.lora.optimizer import apply_update, build_optimizer, describe_optimizer
from workers.lora.order import EpochOrder

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
    """Scores of the model on a loader, and its `loss` (the training loss, cross-entropy of the
    answer token over the vocabulary, mean per example); `beat(batches done, batches)` after each
    batch. The loss moves while accuracy is still one class early in a run: early stopping can
    rank settings on it (`early_stop.metric: val_loss`)."""
    model.eval()
    predictions: list[int] = []
    labels: list[int] = []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for done, batch in enumerate(loader, start=1):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast():
            logits = answer_logits(model, batch, 1, kind)
        loss_sum += torch.nn.functional.cross_entropy(logits, batch["target_ids"], reduction="sum").double()
        predictions += logits[:, answer_ids].argmax(-1).tolist()
        labels += batch["labels"].tolist()
        beat(done, len(loader))
    model.train()
    return task_metrics(task, predictions, labels) | {"loss": float(loss_sum) / max(1, len(labels))}


@dataclass
class MicroBatch:
    """One micro-batch a job's loop asks its driver to compute (forward, and backward of its
    summed loss times `scale`); the driver sends back its mean loss."""

    batch: dict[str, torch.Tensor]  # on the device, as the collator made it
    scale: float  # 1 / examples of its optimizer step's accumulation group


@dataclass
class Placement:
    """Where a job's adapter lives. Alone (the defaults): peft's "default" adapter of a PEFT
    model of its own. In a fused group (workers.lora.fused): one named adapter of the group's
    PEFT model, attached by the group, and every forward of the job's own routed to it."""

    adapter: str = "default"
    attach: Callable[[Any, RunConfig, str], tuple[Any, list[str]]] | None = None
    route: Callable[[], Any] = contextlib.nullcontext  # around the job's own evaluations
    save: Callable[[Any, Path], None] | None = None  # the adapter, to a folder
    params: Callable[[Any], dict[str, torch.Tensor]] | None = None  # by the names alone


def run(
    config: RunConfig, run_dir: Path, heartbeat: Heartbeat, log: Log,
    cache: BaseCache | None = None, digests: tuple[str, str] = ("", ""), *,
    keep_checkpoints: bool = False,
) -> TrainOutcome:  # fmt: skip
    """Train, evaluate on val, keep the best LoRA weights, score test; save the adapter.
    `cache`: the base and tokenised data a warm process kept (None: a fresh one); `digests`:
    the model's and the data's content, which key what it keeps. Its checkpoints are removed at
    the end unless `keep_checkpoints` (the caller removes them once the result is written: a kill
    during the clean-up then loses nothing). The job alone drives its loop (a fused group drives
    several: workers.lora.fused)."""
    job = JobRun(config, run_dir, heartbeat, log, cache, digests, keep_checkpoints=keep_checkpoints)
    job.setup()
    steps = job.loop()
    try:
        micro = next(steps)
        while True:
            with job.autocast():
                loss = train_step(job.model, micro.batch, config, job.kind, micro.scale)
            micro = steps.send(loss)
    except StopIteration:
        pass
    return job.finish()


class JobRun:
    """One job's training: its model view, optimizer, scheduler, data order, dropout keys,
    evaluations, checkpoints and best state. `loop` yields each micro-batch to compute and
    takes its loss back; its driver is `run` (alone) or a fused group."""

    def __init__(
        self, config: RunConfig, run_dir: Path, heartbeat: Heartbeat, log: Log,
        cache: BaseCache | None = None, digests: tuple[str, str] = ("", ""), *,
        keep_checkpoints: bool = False, placement: Placement | None = None,
    ) -> None:  # fmt: skip
        self.config, self.run_dir, self.heartbeat, self.log = config, run_dir, heartbeat, log
        self.cache, self.digests = cache or BaseCache(), digests
        self.keep_checkpoints = keep_checkpoints
        self.placement = placement or Placement()
        self.step, self.samples_seen, self.train_seconds, self.last_beat_s = 0, 0, 0.0, 0.0
        self.best_score, self.best_step = -math.inf, 0
        self.best_val: dict[str, float] = {}
        self.best_state: dict[str, torch.Tensor] = {}
        self.losses: list[float] = []
        self.epoch, self.consumed = 0, 0  # consumed: examples of the epoch's permutation trained on
        self.start_step = self.epoch_start_step = 0
        self.beat_interval_s = float(os.environ.get("ORCH_HEARTBEAT_S", "5"))

    def autocast(self) -> Any:
        if self.config.prec == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def setup(self) -> None:
        """Base, data, adapter, optimizer; a resume restores the loop where its checkpoint was."""
        config, log, cache = self.config, self.log, self.cache
        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.device = device = select_device()
        if device.type == "cuda" and self.placement.attach is None:
            torch.cuda.reset_peak_memory_stats(device)
        self.task = task = parse_data_name(config.data).task
        dtype = torch.bfloat16 if config.prec == "bf16" else torch.float32
        model, tokenizer, self.kind = cache.base(config, dtype, device, log, self.digests[0])
        encoded, truncated = cache.splits(config, tokenizer, self.digests[1])
        self.encoded, self.truncated = encoded, truncated
        torch.manual_seed(config.seed)  # LoRA init depends on the seed, not on how the base was built
        if self.placement.attach is None:
            model, warnings = apply_lora(model, config.peft, self.kind)
            cache.adapted(model)
        else:
            model, warnings = self.placement.attach(model, config, self.kind)
        self.model = model
        for warning in warnings:
            log(f"warning: {warning}")
        adapter = self.placement.adapter
        self.draw_key = install_keyed_dropout(model, config.seed, adapter if self.placement.attach else None)
        if config.gradient_checkpointing and not (self.placement.attach and is_checkpointing(model)):
            enable_checkpointing(model)
        if config.logits_to_keep > 0 and logits_to_keep_argument(model) is None:
            log(f"warning: logits_to_keep: {config.logits_to_keep} has no effect: this model's forward takes "
                "neither logits_to_keep nor num_logits_to_keep, so it computes every position's logits")  # fmt: skip
        model.to(device)
        model.train()
        self.answer_ids = answer_token_ids(tokenizer, task)
        collator = LeftPadCollator(tokenizer.pad_token_id, self.answer_ids)
        self.pad_token_id = tokenizer.pad_token_id
        for name, count in truncated.items():
            if count > TRUNCATION_WARN_SHARE * len(encoded[name]):
                share = 100 * count / len(encoded[name])
                log(f"warning: {count} of {len(encoded[name])} {name} examples ({share:.1f} %) are longer than "
                    f"max_seq_len {config.max_seq_len} and lost text from their longest field")  # fmt: skip
        self.order = EpochOrder(len(encoded["train"]), config.seed)
        self.train_loader = build_loader(
            encoded["train"], config.batch_size, collator, config.num_data_workers, self.order, config.seed
        )
        # Evaluation keeps no activations for backward: a larger batch, longest prompts first (an
        # OOM shows at once; similar lengths share a batch, so little padding). Scores do not depend
        # on the order or the batch beyond float rounding.
        self.eval_loaders = {
            name: build_loader(sorted(encoded[name], key=lambda e: -len(e.input_ids)),
                               config.eval_batch_size or 2 * config.batch_size, collator, 0, None, 0)
            for name in ("val", "test", MISMATCHED_SPLIT) if name in encoded
        }  # fmt: skip
        self.params = params = (
            self.placement.params(model) if self.placement.params else trainable(model)
        )
        self.n_train = n_train = len(encoded["train"])
        updates_per_epoch = math.ceil(n_train / config.effective_batch_size)
        self.total_steps = total_steps = config.max_steps or (config.num_epochs or 1) * updates_per_epoch
        self.optimizer, self.scheduler = build_optimizer(self.param_list(), config, total_steps)
        self.settings = lora_settings(model, adapter, params) | {
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
        if self.draw_key is not None:
            self.settings["dropout_masks"] = KEYED_DROPOUT
        self.primary = PRIMARY_METRIC[task]
        log(f"{config.data}: {n_train} train / {len(encoded['val'])} val / {len(encoded['test'])} test, {total_steps} "
            f"optimizer steps, effective batch {config.effective_batch_size}, device {device}")  # fmt: skip
        if config.resume_from_checkpoint is not None:
            loop, self.best_state = load_checkpoint(
                config.resume_from_checkpoint, model, self.optimizer, self.scheduler, config, params
            )
            self.step, self.epoch, self.consumed = loop.step, loop.epoch, loop.consumed_in_epoch
            self.samples_seen, self.train_seconds, self.losses = loop.samples_seen, loop.train_seconds, loop.losses
            self.best_score, self.best_step, self.best_val = loop.best_score, loop.best_step, loop.best_val
            log(f"resumed from {config.resume_from_checkpoint}: step {self.step} of {total_steps}, "
                f"epoch {self.epoch + 1} with {self.consumed} of its {n_train} examples done")  # fmt: skip
        self.start_step = self.epoch_start_step = self.step

    def param_list(self) -> list[torch.nn.Parameter]:
        return [p for p in self.params.values() if isinstance(p, torch.nn.Parameter)]

    def _eval_beat(self, split: str) -> Callable[[int, int], None]:
        def beat(done: int, batches: int) -> None:  # liveness while a long evaluation runs
            if time.monotonic() - self.last_beat_s >= self.beat_interval_s:
                self.last_beat_s = time.monotonic()
                self.heartbeat.beat(self.step, self.total_steps, None, None, peak_memory(self.device)["peak_mem_mib"],
                                    eval_split=split, eval_batches_done=done, eval_batches=batches)  # fmt: skip

        return beat

    def _evaluate(self, split: str) -> dict[str, float]:
        with self.placement.route():
            return evaluate(self.model, self.eval_loaders[split], self.answer_ids, self.task, self.kind,
                            self.device, self.autocast, self._eval_beat(split))  # fmt: skip

    def _evaluate_val(self) -> None:
        scores = self._evaluate("val")
        if scores[self.primary] > self.best_score:
            self.best_score, self.best_step, self.best_val = scores[self.primary], self.step, scores
            self.best_state = {k: v.detach().clone() for k, v in self.params.items()}
        self.heartbeat.beat(
            self.step, self.total_steps, None, None, peak_memory(self.device)["peak_mem_mib"], val=scores
        )

    def _save_checkpoint(self, consumed: int) -> None:
        loop = LoopState(self.step, self.epoch, consumed, self.samples_seen, self.train_seconds, self.losses,
                         self.best_score, self.best_step, self.best_val)  # fmt: skip
        # a save also removes the older checkpoints: never after orch stopped the job
        # (a warm process's job outlives its client by up to an evaluation)
        self.heartbeat.check_stopped()
        saved = save_checkpoint(self.run_dir, loop, self.model, self.optimizer, self.scheduler,
                                self.best_state, self.config, self.params,
                                self.heartbeat.check_stopped)  # fmt: skip
        self.log(f"saved {saved}")

    def loop(self) -> Generator[MicroBatch, float, None]:
        """The training loop: yields each micro-batch, takes back its mean loss."""
        config, device, total_steps = self.config, self.device, self.total_steps
        accum = config.gradient_accumulation_steps
        while self.step < total_steps:
            self.epoch_start_step = self.step - math.ceil(self.consumed / config.effective_batch_size)
            self.order.set_epoch(self.epoch, skip=self.consumed)  # a resumed epoch goes on where its checkpoint was
            for group in _groups(iter(self.train_loader), accum):
                started_s = time.perf_counter()
                group_samples = sum(len(b["labels"]) for b in group)
                loss_total = 0.0
                for micro_batch, batch in enumerate(group):
                    batch = {k: v.to(device) for k, v in batch.items()}
                    if self.draw_key is not None:
                        self.draw_key.at(self.step, micro_batch, batch["input_ids"].shape[1])
                    loss_total += (yield MicroBatch(batch, 1.0 / group_samples)) * len(batch["labels"])
                update = apply_update(self.optimizer, self.scheduler, self.param_list(),
                                      config.max_grad_norm, loss_total / group_samples, self.step + 1,
                                      total_steps)  # fmt: skip
                self.step += 1
                self.samples_seen += group_samples
                self.consumed += group_samples
                self.losses.append(loss_total / group_samples)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                self.train_seconds += time.perf_counter() - started_s
                # every optimizer step is a line (orch keeps each in the attempt's history); the
                # timer only paces the liveness lines of a long evaluation
                self.last_beat_s = time.monotonic()
                self.heartbeat.beat(self.step, total_steps, self.losses[-1], self.samples_seen / self.train_seconds,
                                    peak_memory(device)["peak_mem_mib"], grad_norm=update.grad_norm,
                                    lr=update.learning_rate)  # fmt: skip
                if config.eval_every_steps and self.step % config.eval_every_steps == 0:
                    self._evaluate_val()
                every = config.checkpoint_every_steps
                if every and self.step % every == 0 and self.step < total_steps:
                    self._save_checkpoint(self.consumed)
                if self.step >= total_steps:
                    break
            if not config.eval_every_steps:
                self._evaluate_val()  # end of each epoch (or of max_steps mid-epoch)
            elif self.step >= total_steps and self.step % config.eval_every_steps != 0:
                self._evaluate_val()  # the last steps since the previous evaluation
            self.epoch, self.consumed = self.epoch + 1, 0

    def finish(self) -> TrainOutcome:
        """After the loop: the last checkpoint, the best weights back, test scored, adapter saved."""
        config, step = self.config, self.step
        if config.checkpoint_every_steps and step > self.start_step:
            # before test is scored: an evaluation that runs out of memory resumes here, not up to
            # checkpoint_every_steps - 1 steps back
            self._save_checkpoint(0)
        with torch.no_grad():
            for name, value in self.best_state.items():
                self.params[name].copy_(value)
        test_scores = self._evaluate("test")
        if MISMATCHED_SPLIT in self.eval_loaders:  # MNLI: matched is `test`, mismatched beside it
            mismatched = self._evaluate(MISMATCHED_SPLIT)
            test_scores |= {f"{name}_mismatched": value for name, value in mismatched.items()}
        if not config.no_save:
            (self.placement.save or _save_adapter)(self.model, self.run_dir / "adapter")
        if not self.keep_checkpoints:
            remove_checkpoints(self.run_dir)  # finished: nothing left to resume
        encoded = self.encoded
        return TrainOutcome(
            metrics={"val": self.best_val, "test": test_scores},
            steps=step,
            samples_seen=self.samples_seen,
            train_seconds=self.train_seconds,
            samples_per_s=self.samples_seen / self.train_seconds if self.train_seconds else 0.0,
            best_step=self.best_step,
            losses=self.losses,
            memory=peak_memory(self.device),
            longest_tokens=max((len(e.input_ids) for split in encoded.values() for e in split), default=0),
            settings=self.settings,
            examples={name: len(items) for name, items in encoded.items()},
            truncated=self.truncated,
            loss_summary=summarise_losses(self.losses, step - self.epoch_start_step).to_record(),
        )


def _save_adapter(model: Any, folder: Path) -> None:
    model.save_pretrained(folder)


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
