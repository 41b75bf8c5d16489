"""A tiny data-parallel training script for `torchrun`, as a researcher's own script would be.

    torchrun --nproc_per_node={nproc} --master_addr=127.0.0.1 --master_port={port} \
        examples/torchrun_tiny.py --steps 20 {cfg.use_fsdp?--sharded} {cfg.fsdp_cpu_offload?--cpu-offload}

Every rank trains a small MLP under DistributedDataParallel over gloo (CPU, or CUDA tensors when
a GPU is visible: gloo lets two ranks share one card, which NCCL refuses). `--sharded` shards the
optimizer state across ranks (ZeroRedundancyOptimizer, the optimizer half of FSDP);
`--cpu-offload` keeps the optimizer state on the CPU. `--budget-mib` makes the script honest about
memory without a GPU: a rank whose model + gradient + Adam state (MiB, sharded or not) exceeds
the budget fails with torch's CUDA out-of-memory message, as an over-full card would. Rank 0
prints `step N/M loss X` lines and, at the end, one JSON line with the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

MIB = 1024 * 1024


def state_mib(model: nn.Module, world: int, sharded: bool, offload: bool) -> float:
    """Per-rank training state: weights and gradients, plus Adam's two moments (1/world each when
    sharded, none on the card when offloaded)."""
    params = sum(p.numel() for p in model.parameters()) * 4 / MIB
    adam = 0.0 if offload else 2 * params / (world if sharded else 1)
    return 2 * params + adam


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--step-s", type=float, default=0.05, help="pause per step (visible progress)")
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--cpu-offload", action="store_true")
    parser.add_argument("--budget-mib", type=float, default=0.0)
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = torch.cuda.is_available()
    device = torch.device(f"cuda:{local % torch.cuda.device_count()}") if on_gpu else torch.device("cpu")
    dist.init_process_group("gloo")
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    need = state_mib(model, world, args.sharded, args.cpu_offload)
    if args.budget_mib and need > args.budget_mib and rank == world - 1:
        print(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need:.2f} MiB. "
            f"GPU {local} has a total capacity of {args.budget_mib:.2f} MiB (rank {rank})",
            file=sys.stderr,
            flush=True,
        )
        return 1  # torchrun ends the other ranks and exits non-zero: the whole job's OOM
    ddp = DistributedDataParallel(model)
    optimizer_device_params = ddp.parameters()
    if args.sharded:
        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            optimizer_device_params, optimizer_class=torch.optim.Adam, lr=1e-3
        )
    else:
        optimizer = torch.optim.Adam(optimizer_device_params, lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    loss = torch.tensor(0.0)
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        for _ in range(args.grad_accum):  # batch x accumulation is the effective batch
            x = torch.randn(args.batch, args.hidden, generator=generator).to(device)
            loss = (ddp(x) - x[:, :1]).pow(2).mean() / args.grad_accum
            loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_s)
    peak_mib = torch.cuda.max_memory_allocated(device) / MIB if on_gpu else None
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "peak_alloc_mib": peak_mib})
    if rank == 0:
        print(json.dumps({"loss": round(loss.item(), 4), "world_size": world, "sharded": args.sharded,
                          "cpu_offload": args.cpu_offload, "master_port": int(os.environ["MASTER_PORT"]),
                          "ranks": gathered}), flush=True)
    dist.barrier()  # every rank past its last collective before any leaves
    # No destroy_process_group(): with gloo it now and then never returned on one rank (two jobs
    # at once on a loaded 2-core machine); the process exit closes the group's sockets anyway.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
