"""What a keyed LoRA dropout mask costs the host on a GPU, and whether a mask drawn into a slot of
a stack's buffer equals the one drawn into a tensor of its own (workers/lora/dropout.py).

    python3 benchmarks/gpu/dropout_draw.py --out OUT [--draws 2000]

For a member's rows of the fused sweep's shape (16 prompts × 34 positions × 2,048 and × 5,632, fp32):
host microseconds per draw, synchronised at the end of the run of draws, with a fresh
`torch.Generator` each draw (as KeyedDropout did) and with one generator seeded again for each;
then, per slot of a 4-member buffer drawn with one generator, whether the slot's mask equals
a fresh tensor's drawn with a fresh generator (same seed). Writes OUT/dropout-draw.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def per_draw_us(shape: tuple[int, ...], draws: int, device: torch.device, reuse: bool) -> float:
    mask = torch.empty(shape, device=device)
    kept = torch.Generator(device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for n in range(draws):
        generator = kept if reuse else torch.Generator(device=device)
        generator.manual_seed(1_000_003 * n + 7)
        mask.bernoulli_(0.95, generator=generator)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return round((time.perf_counter() - started) / draws * 1e6, 1)


def slots_equal(shape: tuple[int, ...], members: int, device: torch.device) -> list[bool]:
    """Per slot: its mask (drawn with one generator seeded again, as KeyedDropout draws now)
    equals the mask drawn into a tensor of its own with a fresh generator (as it drew before)."""
    buffer = torch.empty((members, *shape), device=device)
    kept = torch.Generator(device=device)
    equal = []
    for slot, mask in enumerate(buffer):
        own = torch.empty(shape, device=device)
        for target, generator in ((mask, kept), (own, torch.Generator(device=device))):
            generator.manual_seed(slot + 11)
            target.bernoulli_(0.95, generator=generator)
        equal.append(bool(torch.equal(mask, own)))
    return equal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    figures: dict[str, object] = {"device": str(device), "torch": torch.__version__}
    for width in (2048, 5632):
        shape = (16, 34, width)
        per_draw_us(shape, 50, device, reuse=False)  # warm-up
        figures[f"us_per_draw_fresh_generator_{width}"] = per_draw_us(shape, args.draws, device, reuse=False)
        figures[f"us_per_draw_one_generator_{width}"] = per_draw_us(shape, args.draws, device, reuse=True)
        figures[f"slot_equals_own_{width}"] = slots_equal(shape, 4, device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dropout-draw.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
