"""The rows of a fused group's batch, each routed to its own adapter (`share_base: fused`).

peft refuses `adapter_names` in training, so the routing is our own: each LoRA Linear of the
group's PEFT model computes the base over all rows, then adds each member's
lora_B(lora_A(dropout(x[rows]))) * scaling to its own contiguous slice of rows (peft's
`_mixed_batch_forward`, with slices). FusedModel holds that PEFT model over the cached base, one
named adapter per member, and gives each member's JobRun its Placement (attach, route, save, own
parameters); workers.lora.fused drives the members.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from workers.lora.base_cache import BaseCache
from workers.lora.config import RunConfig
from workers.lora.dropout import stacked_masks
from workers.lora.model import build_lora_config
from workers.lora.train import Placement

Route = tuple[str, int, int | None]  # (adapter, first row, row after the last; None: to the end)


class Routes:
    """The rows of the forward running now, per adapter; read by every patched LoRA layer."""

    def __init__(self) -> None:
        self.now: list[Route] | None = None

    @contextlib.contextmanager
    def use(self, routes: list[Route]) -> Iterator[None]:
        """Routes that cut the rows in order, back to back from row 0 (routed_forward adds the
        joined outputs to the rows by position): checked once here, not in every layer."""
        stops = [stop for _, _, stop in routes]
        if not routes or [start for _, start, _ in routes] != [0, *stops[:-1]] or None in stops[:-1]:
            raise RuntimeError(f"a fused group's routes {routes} do not cut its rows in order from row 0")
        before, self.now = self.now, routes
        try:
            yield
        finally:
            self.now = before


def routed_forward(layer: Any, routes: Routes, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A LoRA Linear's forward over a fused batch: the base once, the adapters stacked.

    Members whose adapters here have one shape (rank, scaling, rows) and whose rows go in alike
    (as they are, or through their dropout or cast) are computed together: their A and B weights
    stacked, two batched matmuls for all of them (`_stacked_output`), where one member at a time
    launched some twenty kernels each (the host's launches, not the GPU, set a fused tick's pace).
    A stack whose members sit side by side is one slice of the batch seen as one matrix a member
    (no copy kept for the backward); rows that go in as they are are stacked only so. Rows that go
    through a dropout and a cast are prepared for the whole stack at once: one cast, and one
    multiplication by the members' own keyed masks drawn into one tensor. A member alone goes the
    same way (a stack of one). The adapters' outputs are joined in row order (rows of a member
    without an adapter here hold -0.0, which adds as an exact identity) and added to the base
    output in one addition."""
    if routes.now is None:
        raise RuntimeError("a fused group's forward ran without routes")
    result = layer.base_layer(x, *args, **kwargs)
    if layer.disable_adapters:
        return result
    bounds = [(start, result.shape[0] if stop is None else stop) for _, start, stop in routes.now]
    if bounds[-1][1] != result.shape[0]:  # in order from row 0 (Routes.use): the last must end the batch
        raise RuntimeError(f"a fused group's routes {bounds} do not cover its {result.shape[0]} rows")
    members = [(adapter, b) for (adapter, _, _), b in zip(routes.now, bounds, strict=True) if adapter in layer.lora_A]
    if not members:
        return result
    def span(stack: list[int]) -> tuple[int, int]:  # the rows of a stack whose members sit side by side
        return members[stack[0]][1][0], members[stack[-1]][1][1]

    def side_by_side(stack: list[int]) -> bool:
        return all(members[a][1][1] == members[b][1][0] for a, b in itertools.pairwise(stack))

    stacks = [(stack, as_it_is, side_by_side(stack)) for stack, as_it_is in _stacks(layer, members, x)]
    # what RowSlices cuts: a stack of members side by side is one slice; any other member its own
    # (the whole batch needs no cut)
    pieces = sorted(
        piece for stack, _, together in stacks
        for piece in ([span(stack)] if together else [members[i][1] for i in stack])
    )  # fmt: skip
    whole_batch = pieces == [(0, x.shape[0])]
    sliced = {pieces[0]: x} if whole_batch else dict(zip(pieces, RowSlices.apply(x, tuple(pieces)), strict=True))
    outputs: dict[int, torch.Tensor] = {}
    for stack, as_it_is, together in stacks:
        adapters = [members[i][0] for i in stack]
        if together:  # one slice: a matrix a member, no copy
            rows = sliced[span(stack)].reshape(len(stack), -1, *x.shape[1:])
        else:
            rows = _stack([sliced[members[i][1]] for i in stack])
        if not as_it_is:
            rows = _prepared(layer, adapters, rows)
        stacked = _stacked_output(layer, adapters, rows.reshape(len(stack), -1, x.shape[-1]))
        if len(stacks) == 1 and len(members) == len(bounds):  # the whole batch, every member, side by side
            return (result + stacked.reshape(*result.shape[:-1], stacked.shape[-1])).to(result.dtype)
        for i, output in zip(stack, stacked, strict=True):
            start, stop = members[i][1]
            outputs[i] = output.reshape(stop - start, *x.shape[1:-1], output.shape[-1])
    present = iter(outputs[i] for i in range(len(members)))
    dtype = outputs[0].dtype
    joined = [
        next(present) if adapter in layer.lora_A
        else torch.full((stop - start, *result.shape[1:]), -0.0, dtype=dtype, device=result.device)
        for (adapter, _, _), (start, stop) in zip(routes.now, bounds, strict=True)
    ]  # fmt: skip
    return (result + (joined[0] if len(joined) == 1 else torch.cat(joined))).to(result.dtype)


def _stacks(layer: Any, members: list[tuple[str, tuple[int, int]]], x: torch.Tensor) -> list[tuple[list[int], bool]]:
    """The members (indices, in row order) computed together, and for each stack whether its rows
    go in as they are. Members share a stack where their weights' shapes and dtypes, scaling, rows
    and the way their rows go in (as they are, or through a dropout of one p and a cast) agree;
    rows that go in as they are are stacked only side by side (one slice of the batch: members of
    one shape apart are stacks of their own, and no copy of their rows is made and saved). A LoRA
    bias is a stack alone."""
    stacks: dict[tuple[Any, ...], list[list[int]]] = {}
    untouched: dict[int, bool] = {}
    for index, (adapter, (start, stop)) in enumerate(members):
        lora_A, lora_B = layer.lora_A[adapter], layer.lora_B[adapter]
        untouched[index] = _goes_in_as_it_is(layer, adapter, x)
        if lora_A.bias is not None or lora_B.bias is not None:  # peft's lora_bias: a stack of its own
            key: tuple[Any, ...] = ("own", adapter)
        else:
            key = (tuple(lora_A.weight.shape), lora_A.weight.dtype, tuple(lora_B.weight.shape),
                   lora_B.weight.dtype, layer.scaling[adapter], stop - start, untouched[index],
                   None if untouched[index] else getattr(layer.lora_dropout[adapter], "p", None))  # fmt: skip
        runs = stacks.setdefault(key, [])
        if runs and (not untouched[index] or members[runs[-1][-1]][1][1] == start):
            runs[-1].append(index)
        else:
            runs.append([index])
    return [(stack, untouched[stack[0]]) for runs in stacks.values() for stack in runs]


def _goes_in_as_it_is(layer: Any, adapter: str, x: torch.Tensor) -> bool:
    """Whether a member's rows reach its adapter's first matmul as they are: no dropout, and no
    cast, or peft's cast to the LoRA weights' dtype (fp32) undone by autocast before the matmul
    (bf16 -> fp32 -> bf16, forward and backward, both exact), so skipped."""
    weight_dtype = layer.lora_A[adapter].weight.dtype
    return _identity(layer.lora_dropout[adapter]) and (
        x.dtype == weight_dtype or _autocast_round_trip(x, weight_dtype)
    )


def _prepared(layer: Any, adapters: list[str], rows: torch.Tensor) -> torch.Tensor:
    """A stack's rows that do not go in as they are, `rows` being (members, *a member's rows), as
    peft prepares each member's: cast to the LoRA weights' dtype, then through its dropout (the
    mask multiplies the cast copy, as peft's does). The cast is one for the stack, and keyed masks
    of one p are drawn into one tensor and applied in one multiplication (stacked_masks); any
    other dropout runs on its own member's rows."""
    cast = layer._cast_input_dtype(rows, layer.lora_A[adapters[0]].weight.dtype)
    dropouts = [layer.lora_dropout[adapter] for adapter in adapters]
    if all(_identity(dropout) for dropout in dropouts):  # a cast alone
        return cast
    masks = stacked_masks(dropouts, cast)
    if masks is not None:
        return cast * masks
    return _stack([dropout(own) for dropout, own in zip(dropouts, cast, strict=True)])


def _stacked_output(layer: Any, adapters: list[str], rows: torch.Tensor) -> torch.Tensor:
    """lora_B(lora_A(rows)) * scaling for each member of a stack, `rows` being (members, n, in):
    the members' A and B weights stacked, and two batched matmuls. The weights' stack is one
    copy (a member alone: a view); under autocast each stack is cast once."""
    lora_A, lora_B = layer.lora_A[adapters[0]], layer.lora_B[adapters[0]]
    scaling = layer.scaling[adapters[0]]
    if lora_A.bias is not None or lora_B.bias is not None:  # alone in its stack (_stacks)
        return lora_B(lora_A(rows)) * scaling
    A = _stack([layer.lora_A[adapter].weight for adapter in adapters])
    B = _stack([layer.lora_B[adapter].weight for adapter in adapters])
    return torch.bmm(torch.bmm(rows, A.transpose(1, 2)), B.transpose(1, 2)) * scaling


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One tensor of the members' (a member alone: a view of its own, no copy)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


class RowSlices(torch.autograd.Function):
    """Rows of a batch, cut at `bounds` (a stack's span where its rows go in as they are, side by
    side; else one (start, stop) per member with an adapter: routed_forward). Autograd's
    own slicing makes, in the backward, a zero tensor of the whole batch per slice and adds each
    to the input's gradient; here the slices' gradients go into one tensor (-0.0 elsewhere, an
    exact identity when added): per element the same sum, in one or a few kernels."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bounds: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, ...]:
        ctx.bounds, ctx.shape = bounds, x.shape
        return tuple(x[start:stop] for start, stop in bounds)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        # (autograd gives every slice a gradient, zeros for one that was not used; routed_forward
        # cuts disjoint slices in order)
        bounds = ctx.bounds
        if bounds[0][0] == 0 and bounds[-1][1] == ctx.shape[0] and all(
            stop == start for (_, stop), (start, _) in itertools.pairwise(bounds)
        ):
            return torch.cat(grads), None  # the slices cover the batch
        whole = torch.full(ctx.shape, -0.0, dtype=grads[0].dtype, device=grads[0].device)
        for (start, stop), grad in zip(bounds, grads, strict=True):
            whole[start:stop] = grad
        return whole, None


def _identity(dropout: torch.nn.Module) -> bool:
    if isinstance(dropout, torch.nn.Identity):
        return True
    p = getattr(dropout, "p", None)
    return isinstance(p, (int, float)) and (p == 0 or not dropout.training)


def _autocast_round_trip(rows: torch.Tensor, weight_dtype: torch.dtype) -> bool:
    """Casting the rows to the weights' dtype is undone by autocast before the matmul."""
    device = rows.device.type
    return (
        weight_dtype == torch.float32
        and torch.is_autocast_enabled(device)
        and rows.dtype == torch.get_autocast_dtype(device)
    )


class Unfusable(Exception):
    """A member whose adapter cannot be routed (DoRA, a LoRA layer other than Linear)."""


def unfusable(config: RunConfig) -> str | None:
    """Why a job trains alone rather than fused, or None."""
    if config.peft.get("use_dora") or config.peft.get("dora"):
        return "DoRA (use_dora) trains alone in the process (sequential): its magnitude is not routed"
    return None


class FusedModel:
    """The group's PEFT model over the cached base: one named adapter per member."""

    def __init__(self, cache: BaseCache) -> None:
        self.cache, self.routes = cache, Routes()
        self.model: Any = None
        self.count = 0
        self.before_eval: Callable[[str], None] = lambda name: None  # the trainer's stop checks

    def names(self) -> list[str]:
        return list(self.model.peft_config) if self.model is not None else []

    def placement(self) -> Placement:
        self.count += 1
        name = f"fused_{self.count}"
        return Placement(
            adapter=name, attach=functools.partial(self._attach, name),
            route=functools.partial(self._route, name),
            save=functools.partial(_save_one, name), params=functools.partial(own_params, name),
        )  # fmt: skip

    def _route(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Around a member's evaluation: every stop is checked first (one may run long)."""
        self.before_eval(name)
        return self.routes.use([(name, 0, None)])

    def _attach(self, name: str, base: Any, config: RunConfig, kind: str) -> tuple[Any, list[str]]:
        from peft import get_peft_model
        from peft.tuners.lora import Linear

        lora_config, warnings = build_lora_config(config.peft, kind)
        if self.model is None:
            self.model = self.cache.adapted(get_peft_model(base, lora_config, adapter_name=name))
        else:
            self.model.add_adapter(name, lora_config)
        layers = [m for m in self.model.modules() if name in getattr(m, "lora_A", {})]
        if any(not isinstance(m, Linear) for m in layers):
            self.detach(name)
            raise Unfusable("a LoRA layer other than Linear trains alone in the process (sequential)")
        self._activate()
        for module in self.model.modules():
            if isinstance(module, Linear) and not hasattr(module, "_fused_routes"):
                setattr(module, "_fused_routes", self.routes)  # noqa: B010
                setattr(module, "forward", functools.partial(routed_forward, module, self.routes))  # noqa: B010
        return self.model, warnings

    def _activate(self) -> None:
        """Every member's adapter trains (requires_grad); the routes pick who sees which rows."""
        names = self.names()
        self.model.base_model.set_adapter(names)
        self.model.active_adapter = names[0]  # PeftModel's own: it reads that adapter's config

    def detach(self, name: str) -> None:
        """Take a member's adapter out; the last one takes the whole PEFT model out (as a job
        alone leaves the base)."""
        if self.model is None or name not in self.model.peft_config:
            return
        if len(self.model.peft_config) > 1:
            self.model.delete_adapter(name)
            self._activate()
            return
        self.model = None
        self.cache.release()


def own_params(name: str, model: Any) -> dict[str, torch.Tensor]:
    """A member's parameters, named as the job's "default" adapter alone would name them (its
    checkpoints and best state are those of the job alone)."""
    tag = f".{name}."
    return {n.replace(tag, ".default."): p for n, p in model.named_parameters() if tag in n}


def _save_one(name: str, model: Any, folder: Path) -> None:
    """The member's adapter as the job alone would save it (peft puts a named one in a subfolder)."""
    with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:
        model.save_pretrained(scratch, selected_adapters=[name])
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(Path(scratch) / name, folder)
