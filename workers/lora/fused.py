"""`share_base: fused`: several jobs of one base train in one process at once. Their rows go
through the frozen base together (one GEMM per base layer), each row routed to its own adapter.

peft refuses `adapter_names` in training, so the routing is our own (workers.lora.routing: each
LoRA Linear computes the base over all rows, then each member's adapter on its own rows).
Everything else is each member's own JobRun (its optimizer,
scheduler, data order, keyed dropout masks, accumulation, evaluations, checkpoints, result):
FusedTrainer only drives their loops, a tick at a time.

A member's numbers do not depend on its batch-mates beyond float rounding (the padding to the
longest member's micro-batch changes the attention's reduction lengths), and are not bit-equal
to the same job alone. DoRA members, and LoRA layers other than Linear, train alone (sequential)
once the group is empty.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workers.lora.__main__ import EXIT_STOPPED, Attempt, AttemptEnd, JobStopped, is_oom, run_attempt
from workers.lora.base_cache import BaseCache
from workers.lora.config import RunConfig
from workers.lora.device import reset_peak, select_device
from workers.lora.member import PROCESS_ENDED, MemberSpec
from workers.lora.routing import FusedModel, Route, Routes, Unfusable, unfusable
from workers.lora.train import JobRun, MicroBatch, answer_logits

EXIT_GROUP_OOM = 75  # the daemon requeues each member, uncounted, with a smaller group
STOPPED = "orch stopped the attempt (cancelled, hung or its client gone)"


def group_oom_line(members: int) -> str:
    return f"orch: fused group of {members} members ran out of memory"


@dataclass
class Member:
    spec: MemberSpec
    attempt: Attempt
    job: JobRun | None = None
    steps: Any = None
    micro: MicroBatch | None = None
    name: str = ""
    largest: int = 1  # members in the largest group it trained in


class FusedTrainer:
    """Drives the loops of a fused group's members, one tick (a micro-batch of each) at a time."""

    def __init__(self, cache: BaseCache, base_env: dict[str, str] | None = None) -> None:
        self.cache, self.fused = cache, FusedModel(cache)
        self.base_env = dict(os.environ) if base_env is None else base_env
        self.members: list[Member] = []
        self.waiting_solo: list[tuple[MemberSpec, str]] = []
        self.usable = True
        self.lock = threading.Lock()  # members and waiting_solo, read by a server's threads
        self.fused.before_eval = self._before_eval

    @contextlib.contextmanager
    def context(self, spec: MemberSpec) -> Iterator[None]:
        """The member's environment and output, while its own code runs (nested: another
        member's end within a member's evaluation restores that member's)."""
        before = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.base_env | spec.env)
        try:
            with contextlib.ExitStack() as stack:
                if spec.out is not None:
                    stack.enter_context(contextlib.redirect_stdout(spec.out))
                    stack.enter_context(contextlib.redirect_stderr(spec.out))
                yield
        finally:
            os.environ.clear()
            os.environ.update(before)

    def check_stops(self, running: str | None = None) -> None:
        """End every member whose stop is set, except the one whose code runs now (`running`:
        its own heartbeat ends it); its stop then counts as seen."""
        for member in list(self.members):
            if member.spec.stop.is_set() and member.name != running:
                member.spec.seen.set()
                self._end(member, JobStopped(STOPPED))

    def _before_eval(self, name: str) -> None:
        self.check_stops(running=name)
        for member in self.members:
            if member.name == name and member.spec.stop.is_set():
                member.spec.seen.set()
                raise JobStopped(STOPPED)

    def add(self, spec: MemberSpec) -> None:
        """Set a job up in the group (its first micro-batch ready), or end it at once."""
        self.check_stops()  # a setup (a resume's wait, say) may take long: the stops first
        if not spec.claim():
            return  # stopped while queued: ended by its stop already
        if spec.stop.is_set():
            spec.seen.set()
            spec.done(EXIT_STOPPED)
            return
        member = Member(spec, Attempt(spec.run_dir, spec.config_path))
        with self.context(spec):
            try:
                config = member.attempt.prepare()
                why = unfusable(config) or self._mismatch(config)
                if why is not None:
                    raise Unfusable(why)
                placement = self.fused.placement()
                member.name = placement.adapter
                heartbeat = spec.heartbeat(spec.run_dir, spec.stop)
                member.job = JobRun(config, spec.run_dir, heartbeat, _log, self.cache, member.attempt.digests,
                                    keep_checkpoints=True, placement=placement)  # fmt: skip
                member.job.setup()
                member.steps = member.job.loop()
                member.micro = next(member.steps)
            except Unfusable as exc:
                _log(f"share_base: fused: {exc}; it waits for the group to finish")
                spec.unclaim()  # a stop meanwhile ends it at once (MemberSpec.withdraw)
                with self.lock:
                    self.waiting_solo.append((spec, str(exc)))
                return
            except StopIteration:
                pass  # nothing to train (a resume at its last step): finished below
            except Exception as exc:
                self._end(member, exc)
                return
        with self.lock:
            self.members.append(member)
        reset_peak(select_device())  # a member's peak covers the groups of its size, not earlier ones
        if member.micro is None:
            self._finish(member)

    def _mismatch(self, config: RunConfig) -> str | None:
        """What this job does not share with the group (its clients' group key keeps such jobs
        apart; a job handed over anyway trains alone after the group)."""
        if not self.members or self.members[0].job is None:
            return None
        group = self.members[0].job.config
        for name in ("model", "prec", "max_seq_len", "gradient_checkpointing"):
            if getattr(config, name) != getattr(group, name):
                return f"its {name} differs from the fused group's: it trains alone in the process (sequential)"
        return None

    def _end(self, member: Member, exc: BaseException) -> None:
        with self.context(member.spec):
            end = member.attempt.failed(exc)
        self._leave(member, end)

    def _finish(self, member: Member) -> None:
        assert member.job is not None
        with self.context(member.spec):
            try:
                outcome = member.job.finish()
            except Exception as exc:
                end = member.attempt.failed(exc)
            else:
                end = member.attempt.succeeded(outcome, {"share_base": "fused", "fused_members_max": member.largest})
        self._leave(member, end)

    def _leave(self, member: Member, end: AttemptEnd) -> None:
        if member.steps is not None:
            member.steps.close()  # a loop left mid-epoch: its loader (and data workers) go now
        if member.job is not None and member.job.params:
            for parameter in member.job.params.values():
                parameter.grad = None
        self.fused.detach(member.name)
        with self.lock:
            left = member in self.members
            if left:
                self.members.remove(member)
        if left and self.members:
            reset_peak(select_device())  # the others' peaks: of the smaller group from here
        self.usable = self.usable and end.process_usable
        member.spec.done(end.exit_code)

    def run_solo(self) -> None:
        """The first job waiting to train alone, once the group is empty."""
        with self.lock:
            spec, why = self.waiting_solo.pop(0)
        if not spec.claim():
            return  # stopped while it waited: ended by its stop already
        spec.seen.set()  # it trains under its own heartbeat, which honours its stop
        with self.context(spec):
            heartbeat = spec.heartbeat(spec.run_dir, spec.stop)
            end = run_attempt(spec.run_dir, spec.config_path, self.cache, heartbeat,
                              shared={"share_base": "sequential", "fused_fallback": why})  # fmt: skip
        self.cache.release()
        self.usable = self.usable and end.process_usable
        spec.done(end.exit_code)

    def tick(self) -> None:
        """One forward and backward over a micro-batch of every member; each member's loop then
        goes on (an optimizer step where its accumulation group is complete)."""
        self.check_stops()
        active = list(self.members)
        if not active:
            return
        for member in active:
            member.largest = max(member.largest, len(active))
        first = active[0].job
        assert first is not None
        micro = [m.micro for m in active if m.micro is not None]
        keep = 1 if all(m.job is not None and m.job.config.logits_to_keep > 0 for m in active) else 0
        try:
            batch, routes = concatenate([m.batch for m in micro], [m.name for m in active], first.pad_token_id)
            losses = forward_backward(first.model, batch, routes, [m.scale for m in micro], first.kind, keep,
                                      first.autocast, self.fused.routes)  # fmt: skip
        except Exception as exc:
            self._group_failed(active, exc)
            return
        del batch
        for member, loss in zip(active, losses, strict=True):
            if member not in self.members:
                continue  # stopped meanwhile (another member's evaluation checks every stop)
            assert member.steps is not None
            failure: BaseException | None = None
            with self.context(member.spec):
                try:
                    member.micro = member.steps.send(loss)
                except StopIteration:
                    member.micro = None
                except Exception as exc:
                    member.micro, failure = None, exc
            if failure is not None and is_oom(failure) and len(self.members) >= 2:
                # its own step, evaluation or checkpoint ran out of memory the group shares
                self._group_failed(list(self.members), failure)
                return
            if failure is not None:
                self._end(member, failure)  # a non-finite loss, say: this member alone fails
            elif member.micro is None:
                self._finish(member)

    def _group_failed(self, active: list[Member], exc: BaseException) -> None:
        """A shared forward or backward failed: an OOM of several members ends each with exit 75
        (the daemon requeues them with a smaller group); anything else fails each member."""
        if is_oom(exc) and len(active) >= 2:
            for member in active:
                with self.context(member.spec):
                    print(group_oom_line(len(active)), file=sys.stderr, flush=True)
                self._leave(member, AttemptEnd(EXIT_GROUP_OOM, True))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return
        for member in active:
            self._end(member, exc)

    def run(self, admit: Callable[[bool], list[MemberSpec] | None]) -> bool:
        """Train until `admit(idle)` (blocking when the group is empty) says no more (None);
        whether this process is still usable. An unusable process ends every job it holds with
        no answer (PROCESS_ENDED: each client says the warm process ended, as at its death)."""
        while self.usable:
            if not self.waiting_solo or self.members:
                new = admit(not self.members and not self.waiting_solo) if not self.waiting_solo else []
                if new is None and not self.members and not self.waiting_solo:
                    break
                for spec in new or []:
                    self.add(spec)
            if not self.members and self.waiting_solo:
                self.run_solo()
                continue
            self.tick()
        if not self.usable:
            self._abandon(admit)
        return self.usable

    def _abandon(self, admit: Callable[[bool], list[MemberSpec] | None]) -> None:
        for member in list(self.members):
            with contextlib.suppress(Exception):
                self._leave(member, AttemptEnd(PROCESS_ENDED, False))
        with self.lock:
            waiting, self.waiting_solo = [spec for spec, _ in self.waiting_solo], []
        for spec in [*waiting, *(admit(False) or [])]:
            if spec.claim():
                spec.done(PROCESS_ENDED)


def concatenate(
    batches: list[dict[str, torch.Tensor]], names: list[str], pad_token_id: int
) -> tuple[dict[str, torch.Tensor], list[Route]]:
    """The members' micro-batches as one, left-padded to the longest (mask 0, position 0, as the
    collator pads), and each member's rows."""
    length = max(b["input_ids"].shape[1] for b in batches)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in batches[0]}
    routes: list[Route] = []
    row = 0
    for batch, name in zip(batches, names, strict=True):
        extra = length - batch["input_ids"].shape[1]
        for key, value in batch.items():
            if value.dim() == 2 and extra:
                fill = pad_token_id if key == "input_ids" else 0
                value = torch.nn.functional.pad(value, (extra, 0), value=fill)
            parts[key].append(value)
        rows = batch["input_ids"].shape[0]
        routes.append((name, row, row + rows))
        row += rows
    return {k: torch.cat(v) for k, v in parts.items()}, routes


def forward_backward(
    model: Any, batch: dict[str, torch.Tensor], routes: list[Route], scales: list[float], kind: str,
    logits_to_keep: int, autocast: Callable[[], Any], routing: Routes,
) -> list[float]:  # fmt: skip
    """One forward of the fused batch and one backward of the members' losses, each scaled as
    its own job scales it; each member's mean loss. The routes hold through the backward too
    (activation checkpointing computes the forward again there)."""
    with routing.use(routes), autocast():
        logits = answer_logits(model, batch, logits_to_keep, kind)
        sums = [
            torch.nn.functional.cross_entropy(logits[start:stop], batch["target_ids"][start:stop], reduction="sum")
            for _, start, stop in routes
        ]
        total = sum(loss_sum * scale for loss_sum, scale in zip(sums, scales, strict=True))
        assert isinstance(total, torch.Tensor)
        total.backward()
    return [float(s.detach()) / ((stop or 0) - start) for s, (_, start, stop) in zip(sums, routes, strict=True)]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
