#!/usr/bin/env bash
# One device call: `bash benchmarks/gpu/device_share_base.sh` with $OUT set runs
# benchmarks/gpu/share_base_sweep.py on one GPU: the 210M-Llama LoRA sweep one job at a time,
# through orch with `share_base: off`, and with `share_base: sequential`, on the same machine.
#   SEEDS (default 2) seeds of each of the 4 configs, or several counts ("4 2": one sweep each,
#   in turn); MODES (default serial,off,sequential; fusedN: share_base fused with N members)
#   the script's --modes; SIZE (210m or 1b3) the Llama; PLAN (default 4) jobs
#   per card for off and sequential; LIMIT_S (default 540) the wall-clock limit of each sweep;
#   EXTRA more of the script's options (EXTRA=--mps: every mode's daemon runs with --mps).
# Writes, per seed count N, $OUT/sN/share-base.json (the script's summary and every job's
# figures) and $OUT/sN/daemon-logs.tar.gz (each mode's daemon log); and $OUT/log-share-base.txt.
# Wheels of what the machine lacks (libtmux, sqlite-utils, sqlite-fts4, click-default-group and
# their small deps) are expected in wheels/ (git-ignored: carry it).
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/orch-share-out}
WORK=/tmp/orch-share
SEEDS=${SEEDS:-2}
MODES=${MODES:-serial,off,sequential}
PLAN=${PLAN:-4}
LIMIT_S=${LIMIT_S:-540}
SIZE=${SIZE:-210m}
mkdir -p "$OUT"
rm -rf "$WORK"-s*
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  nproc
  python3 -m pip install -q --no-deps --target /tmp/site wheels/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  python3 -c "import sys, torch, transformers, peft, libtmux, sqlite_utils; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'libtmux', libtmux.__version__, torch.cuda.get_device_name())"
  tmux -V
  for n in $SEEDS; do
    started=$(date +%s)
    mkdir -p "$OUT/s$n"
    timeout "$LIMIT_S" python3 benchmarks/gpu/share_base_sweep.py --work "$WORK-s$n" \
      --out "$OUT/s$n" --seeds "$n" --plan "$PLAN" --modes "$MODES" --size "$SIZE" ${EXTRA:-}
    echo "share_base_sweep.py --seeds $n exited $? after $(($(date +%s) - started)) s"
    (cd "$WORK-s$n" && tar czf "$OUT/s$n/daemon-logs.tar.gz" */state.db*)
  done
  nvidia-smi --query-gpu=memory.used --format=csv
} 2>&1 | tee "$OUT/log-share-base.txt"
