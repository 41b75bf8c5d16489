#!/usr/bin/env bash
# One device call: `bash benchmarks/gpu/device_mps.sh` with $OUT set (about 7 minutes): the MPS GPU
# tests, the throughput factor per co-located count with and without MPS, error containment and
# the memory fence, and 4 jobs through `orch daemon run` with and without --mps.
# Wheels of what the machine lacks (libtmux, sqlite-utils, sqlite-fts4, click-default-group) in .whl/.
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/orch-mps-out}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  command -v nvidia-cuda-mps-control
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu_mps.py
  timeout 200 python3 benchmarks/gpu/mps_bench.py factors --out "$OUT" --steps 150
  timeout 120 python3 benchmarks/gpu/mps_bench.py contain --out "$OUT"
  timeout 200 python3 benchmarks/gpu/mps_bench.py orch --out "$OUT" --steps 300 --budget-s 90
  nvidia-smi --query-gpu=memory.used --format=csv
} 2>&1 | tee "$OUT/log-mps.txt"
