"""A fused group's routed LoRA forward (workers/lora/routing.py): members of one shape stacked,
two batched matmuls a layer for all of them.

- It agrees with the plain loop it replaced (each member's rows plus its own adapter's output,
  one addition per member, after peft's cast of the rows to the LoRA weights' dtype) on the logits
  and every LoRA gradient: bit for bit under bf16 autocast on CPU, and within float rounding in
  fp32 (a batched matmul is not the plain one) and on a GPU where there is one; with and without
  LoRA dropout; for members of other ranks and targets (some layers hold some members' adapters
  only), of one shape (the whole batch one stack), of two shapes side by side (each stack one
  slice of the batch) and of one shape apart (their rows stacked).
- A member's numbers are bit-equal alone, stacked with members of its shape, or beside members
  of other shapes, at the tiny model's sizes (on CPU; on a GPU under bf16 autocast).
- Three more members of one shape add far fewer operations than the loop adds.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")

from benchmarks.routing_loop import loop_forward  # noqa: E402
from workers.lora.dropout import install_keyed_dropout  # noqa: E402
from workers.lora.model import build_tiny_llama  # noqa: E402
from workers.lora.routing import Routes, routed_forward  # noqa: E402

pytestmark = [pytest.mark.train]

MEMBERS = {  # name: (rank, targets)
    "a": (8, ["q_proj", "v_proj"]),
    "b": (4, ["q_proj", "k_proj", "o_proj", "down_proj"]),
    "c": (2, ["q_proj", "v_proj"]),
}  # q_proj: every member (the rows' gradients joined whole); the others: some members
ROUTES = [("a", 0, 2), ("b", 2, 5), ("c", 5, 7)]
A, B, C = MEMBERS["a"], MEMBERS["b"], MEMBERS["c"]
GROUPS = {  # members, routes
    "ranks": (MEMBERS, ROUTES),
    "one-shape": ({"a": A, "a2": A, "a3": A}, [("a", 0, 2), ("a2", 2, 4), ("a3", 4, 6)]),
    "side-by-side": ({"b": B, "a": A, "a2": A, "c": C, "c2": C},
                     [("b", 0, 2), ("a", 2, 4), ("a2", 4, 6), ("c", 6, 7), ("c2", 7, 8)]),
    "apart": ({"a": A, "b": B, "a2": A}, [("a", 0, 2), ("b", 2, 4), ("a2", 4, 6)]),
}  # fmt: skip


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def fused_model(
    dropout: float, device: str = "cpu", members: dict[str, tuple[int, list[str]]] = MEMBERS
) -> tuple[Any, list[Any]]:
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import Linear

    base, _ = build_tiny_llama(seed=3)
    model = None
    for name, (rank, targets) in members.items():
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=targets,
                            init_lora_weights=False)  # fmt: skip
        if model is None:
            model = get_peft_model(base, config, adapter_name=name)
        else:
            model.add_adapter(name, config)
    assert model is not None
    model.base_model.set_adapter(list(members))
    model.to(device)
    # each member's masks its own, keyed by its seed and the step (as in the worker): the same
    # whatever order the routing draws them in
    keys = [install_keyed_dropout(model, seed=1 + n, adapter=name) for n, name in enumerate(members)]
    assert all((key is None) == (dropout == 0) for key in keys)
    model.draw_keys = [key for key in keys if key is not None]
    return model, [m for m in model.modules() if isinstance(m, Linear)]


def run(
    model: Any, layers: list[Any], forward: Any, autocast: bool, seed: int, device: str = "cpu",
    routes_now: list[Any] = ROUTES, lengths: dict[int, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`lengths`: the own prompt length of some members (by their index), shorter than the batch's
    (their rows left-padded to it in the group)."""
    routes = Routes()
    for layer in layers:
        layer.forward = functools.partial(forward, layer, routes)
    generator = torch.Generator().manual_seed(11)
    input_ids = torch.randint(3, 40, (routes_now[-1][2], 9), generator=generator).to(device)
    model.zero_grad(set_to_none=True)
    for n, key in enumerate(model.draw_keys):  # `seed` as the step: the same masks for both routings
        key.at(seed, 0, sequence_length=(lengths or {}).get(n, input_ids.shape[1]))
    context = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with routes.use(routes_now), context:
        logits = model(input_ids=input_ids).logits
        logits.float().square().sum().backward()  # a sum: each row's gradient its own
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.detach().clone(), **grads}


def assert_near(new: Any, old: Any, share: float, name: str) -> None:
    """Within `share` of the tensor's largest value: the two routings sum in other orders (on a
    GPU a batched matmul and one a member take other kernels), so an element that is a small
    sum of large terms may differ by more than its own size, and the largest value is the
    scale its rounding is of."""
    gap, scale = float((new - old).abs().max()), float(old.abs().max())
    assert gap <= share * scale, f"{name}: {gap:.3g} apart, the largest value {scale:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("group", list(GROUPS))
def test_the_stacked_forward_agrees_with_the_loop_it_replaced(
    group: str, autocast: bool, dropout: float, device: str
) -> None:
    members, routes_now = GROUPS[group]
    model, layers = fused_model(dropout, device, members=members)
    new = run(model, layers, routed_forward, autocast, seed=5, device=device, routes_now=routes_now)
    old = run(model, layers, loop_forward, autocast, seed=5, device=device, routes_now=routes_now)
    assert new.keys() == old.keys() and len(new) == 1 + 2 * sum(len(t) for _, t in members.values()) * 2
    for name in old:  # measured on CPU: fp32 within 3.5e-7 of the largest value, bf16 bit-equal
        if autocast and device == "cpu":
            assert torch.equal(new[name], old[name]), name
        else:
            assert_near(new[name], old[name], 1e-2 if autocast else 1e-5, name)
    other = run(model, layers, routed_forward, autocast, seed=6, device=device, routes_now=routes_now)
    assert dropout == 0 or not torch.equal(other["logits"], new["logits"])  # the test can fail


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_a_padded_members_masks_in_a_stack_agree_with_the_loop(autocast: bool, device: str) -> None:
    """A member whose own prompts are shorter than the group's (its rows left-padded to the
    longest) draws its mask over its own positions and keeps the padding's, in a stack whose
    masks are drawn into one tensor as in the loop, which draws each member's alone."""
    members, routes_now = GROUPS["one-shape"]
    model, layers = fused_model(0.1, device, members=members)
    new = run(model, layers, routed_forward, autocast, 5, device, routes_now, lengths={1: 6})
    old = run(model, layers, loop_forward, autocast, 5, device, routes_now, lengths={1: 6})
    for name in old:
        if autocast and device == "cpu":
            assert torch.equal(new[name], old[name]), name
        else:
            assert_near(new[name], old[name], 1e-2 if autocast else 1e-5, name)
    unpadded = run(model, layers, routed_forward, autocast, 5, device, routes_now)
    assert not torch.equal(unpadded["logits"][2:4], new["logits"][2:4])  # the test can fail
    assert torch.equal(unpadded["logits"][:2], new["logits"][:2])  # the other members' own


# fp32 on a GPU is left out: on one H200 a member's fp32 numbers differ with its batch-mates under
# the loop routing too (the base's matmuls run over the group's rows), bf16 autocast is bit-equal
INDEPENDENT = [(d, a) for d in DEVICES for a in (False, True) if d == "cpu" or a]


PRECISION = {False: "fp32", True: "bf16-autocast"}


@pytest.mark.parametrize(("device", "autocast"), INDEPENDENT, ids=lambda v: PRECISION.get(v, v))
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_members_numbers_do_not_depend_on_who_it_is_stacked_with(autocast: bool, dropout: float, device: str) -> None:
    """Member a (its weights, seed and rows the same each time) alone, in a stack of three, and
    beside members of other ranks and targets: its logits and LoRA gradients are bit-equal. At
    larger shapes a stack of one can take another matmul path than a stack of several (on CPU
    in bf16 at 4,096 rows a member's lora_A gradient differed by 3.7e-4 relative): equal there
    within float rounding only, as the fused worker says."""
    seen = []
    for members, routes_now in [
        ({"a": MEMBERS["a"]}, [("a", 0, 2)]),
        GROUPS["one-shape"],
        (MEMBERS, ROUTES),
    ]:
        model, layers = fused_model(dropout, device, members=members)
        numbers = run(model, layers, routed_forward, autocast, seed=5, device=device, routes_now=routes_now)
        seen.append({"logits": numbers["logits"][:2], **{k: v for k, v in numbers.items() if ".a." in k}})
    alone, stacked, beside = seen
    assert alone.keys() == stacked.keys() == beside.keys() and len(alone) == 1 + 2 * 2 * 2
    for name in alone:
        assert torch.equal(alone[name], stacked[name]) and torch.equal(alone[name], beside[name]), name


@pytest.mark.parametrize("group", ["one-shape", "side-by-side", "apart"])
def test_rows_that_go_in_as_they_are_are_not_copied_for_the_backward(group: str) -> None:
    """Without dropout (fp32: no cast), each stack's rows are a slice of the batch: what the first
    LoRA layer saves for its backward holds no copy of a member's rows."""
    members, routes_now = GROUPS[group]
    model, _ = fused_model(0.0, members=members)
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
    copies: list[tuple[int, ...]] = []

    def watched(layer: Any, routes: Routes, x: Any, *args: Any, **kwargs: Any) -> Any:
        def pack(saved: Any) -> Any:
            # (members, rows × positions, hidden); a weights' stack is (members, rank, hidden),
            # and no rank here is a multiple of the 9 positions
            rows = saved.dim() == 3 and saved.shape[-1] == x.shape[-1] and saved.shape[1] % x.shape[1] == 0
            if rows and not _shares(saved, x):
                copies.append(tuple(saved.shape))
            return saved

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
            return routed_forward(layer, routes, x, *args, **kwargs)

    numbers = run(model, [layer], watched, False, seed=5, routes_now=routes_now)
    assert numbers["logits"].shape[0] == routes_now[-1][2] and copies == []


def _shares(tensor: Any, other: Any) -> bool:
    return bool(tensor.untyped_storage().data_ptr() == other.untyped_storage().data_ptr())


def aten_calls(members: int, forward: Any, dropout: float = 0.0) -> int:
    """Operations a forward and backward of `members` members of one shape runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.calls += 1
            return func(*args, **(kwargs or {}))

    names = [f"m{i}" for i in range(members)]
    model, layers = fused_model(dropout, members={name: MEMBERS["a"] for name in names})
    with Count() as count:
        run(model, layers, forward, False, seed=5, routes_now=[(n, 2 * i, 2 * i + 2) for i, n in enumerate(names)])
    return count.calls


def test_a_layers_operations_do_not_grow_with_the_members_of_one_stack() -> None:
    """Three more members of one shape add a few operations a layer (each member's slice of the
    weights' gradients and its copy into the member's own; the test's own copy of each gradient),
    where the loop adds each member's whole adapter. Measured: 96 more against 422 more."""
    stacked = aten_calls(4, routed_forward) - aten_calls(1, routed_forward)
    loop = aten_calls(4, loop_forward) - aten_calls(1, loop_forward)
    assert 0 < 3 * stacked < loop, (stacked, loop)


def test_dropout_adds_only_each_members_mask_draw_to_a_stack() -> None:
    """With LoRA dropout the stack's rows are cast once and multiplied once by the members' masks,
    drawn into one tensor: three more members add their draws, one in each of the 4 LoRA layers,
    not a cast, division and multiplication each and their backward. Measured: 12 more than
    without dropout (drawing each member's mask and preparing its rows on its own: 140 more)."""
    without = aten_calls(4, routed_forward) - aten_calls(1, routed_forward)
    with_dropout = aten_calls(4, routed_forward, 0.1) - aten_calls(1, routed_forward, 0.1)
    layers = 4  # member a's q_proj and v_proj in each of the tiny Llama's 2 layers
    assert 0 < with_dropout - without <= 2 * 3 * layers, (with_dropout, without)


@pytest.mark.parametrize(
    "routes", [[("a", 2, 5), ("b", 0, 2)], [("a", 0, 2), ("b", 3, 5)], [("a", 0, None), ("b", 2, 5)], []]
)
def test_routes_that_do_not_cut_the_rows_in_order_are_refused(routes: list[Any]) -> None:
    """The joined outputs are added to the rows by position: routes out of order, with a gap, or
    with an open end before the last would add an adapter to another member's rows."""
    with pytest.raises(RuntimeError, match="do not cut its rows in order"), Routes().use(routes):
        pass
