#!/usr/bin/env bash
# The GLA-1.3B rows of benchmarks/lora_memory.py, one batch size per process (each prints on
# its own, so a slow Triton compile or autotune cannot hide the rows already measured).
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/orch-gpu-out}
mkdir -p "$OUT"
{
  python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  time timeout 90 python3 -c "import fla, fla.models; print('fla', fla.__version__)"
  for b in 4 8 16; do
    time timeout 170 python3 benchmarks/lora_memory.py --models gla --batches $b --out "$OUT/lora_memory_gla_b$b.json"
  done
} 2>&1 | tee "$OUT/log.txt"
