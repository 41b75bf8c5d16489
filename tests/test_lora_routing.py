"""A fused group's routed LoRA forward (workers/lora/routing.py) gives, bit for bit, the numbers of
the plain loop it replaced: each member's rows plus its own adapter's output, one addition per
member, after peft's cast of the rows to the LoRA weights' dtype. Checked on the logits and on
every LoRA gradient, in fp32 and under bf16 autocast, with and without LoRA dropout, on CPU and
on a GPU where there is one, for members with other ranks and other targets (some layers hold one
member's adapter only), so both ways RowSlices joins the rows' gradients are taken."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")

from benchmarks.routing_loop import loop_forward  # noqa: E402
from workers.lora.model import build_tiny_llama  # noqa: E402
from workers.lora.routing import Routes, routed_forward  # noqa: E402

pytestmark = [pytest.mark.train]

MEMBERS = {  # name: (rank, targets)
    "a": (8, ["q_proj", "v_proj"]),
    "b": (4, ["q_proj", "k_proj", "o_proj", "down_proj"]),
    "c": (2, ["q_proj", "v_proj"]),
}  # q_proj: every member (the rows' gradients joined whole); the others: some members


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def fused_model(dropout: float, device: str = "cpu") -> tuple[Any, list[Any]]:
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import Linear

    base, _ = build_tiny_llama(seed=3)
    model = None
    for name, (rank, targets) in MEMBERS.items():
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=targets,
                            init_lora_weights=False)  # fmt: skip
        if model is None:
            model = get_peft_model(base, config, adapter_name=name)
        else:
            model.add_adapter(name, config)
    assert model is not None
    model.base_model.set_adapter(list(MEMBERS))
    model.to(device)
    return model, [m for m in model.modules() if isinstance(m, Linear)]


def run(model: Any, layers: list[Any], forward: Any, autocast: bool, seed: int, device: str = "cpu") -> dict[str, Any]:
    routes = Routes()
    for layer in layers:
        layer.forward = functools.partial(forward, layer, routes)
    generator = torch.Generator().manual_seed(11)
    input_ids = torch.randint(3, 40, (7, 9), generator=generator).to(device)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for both routings
    context = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with routes.use([("a", 0, 2), ("b", 2, 5), ("c", 5, 7)]), context:
        logits = model(input_ids=input_ids).logits
        logits.float().square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.detach().clone(), **grads}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_routed_forward_is_bit_equal_to_the_loop_it_replaced(autocast: bool, dropout: float, device: str) -> None:
    model, layers = fused_model(dropout, device)
    new = run(model, layers, routed_forward, autocast, seed=5, device=device)
    old = run(model, layers, loop_forward, autocast, seed=5, device=device)
    assert new.keys() == old.keys() and len(new) == 1 + 2 * sum(len(t) for _, t in MEMBERS.values()) * 2
    for name in old:
        assert torch.equal(new[name], old[name]), name
    other = run(model, layers, routed_forward, autocast, seed=6, device=device)  # the test can fail
    assert dropout == 0 or not torch.equal(other["logits"], new["logits"])


@pytest.mark.parametrize(
    "routes", [[("a", 2, 5), ("b", 0, 2)], [("a", 0, 2), ("b", 3, 5)], [("a", 0, None), ("b", 2, 5)], []]
)
def test_routes_that_do_not_cut_the_rows_in_order_are_refused(routes: list[Any]) -> None:
    """The joined outputs are added to the rows by position: routes out of order, with a gap, or
    with an open end before the last would add an adapter to another member's rows."""
    with pytest.raises(RuntimeError, match="do not cut its rows in order"), Routes().use(routes):
        pass
