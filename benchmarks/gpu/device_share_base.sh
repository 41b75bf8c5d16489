#!/usr/bin/env bash
# One device call: `bash benchmarks/gpu/device_share_base.sh` with $OUT set runs
# benchmarks/gpu/share_base_sweep.py on one GPU: the 210M-Llama LoRA sweep one job at a time,
# through orch with `share_base: off`, and with `share_base: sequential`, on the same machine.
#   SEEDS (default 2) seeds of each of the 4 configs; PLAN (default 4) jobs per card for off and
#   sequential; LIMIT_S (default 540) the sweep's wall-clock limit.
# Writes $OUT/share-base.json (the script's summary and every job's figures), $OUT/daemon-MODE.log
# (each mode's daemon log) and $OUT/log-share-base.txt.
# Wheels of what the machine lacks (libtmux, sqlite-utils, sqlite-fts4, click-default-group and
# their small deps) are expected in wheels/ (git-ignored: carry it).
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/orch-share-out}
WORK=/tmp/orch-share
SEEDS=${SEEDS:-2}
PLAN=${PLAN:-4}
LIMIT_S=${LIMIT_S:-540}
mkdir -p "$OUT"
rm -rf "$WORK"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  nproc
  python3 -m pip install -q --no-deps --target /tmp/site wheels/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  python3 -c "import sys, torch, transformers, peft, libtmux, sqlite_utils; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'libtmux', libtmux.__version__, torch.cuda.get_device_name())"
  tmux -V
  git log -1 --format='commit %H %s' 2>/dev/null
  started=$(date +%s)
  timeout "$LIMIT_S" python3 benchmarks/gpu/share_base_sweep.py --work "$WORK" --out "$OUT" \
    --seeds "$SEEDS" --plan "$PLAN"
  echo "share_base_sweep.py exited $? after $(($(date +%s) - started)) s"
  for mode in serial off sequential; do
    cp "$WORK/$mode/state.db.daemon.log" "$OUT/daemon-$mode.log" 2>/dev/null
  done
  nvidia-smi --query-gpu=memory.used --format=csv
} 2>&1 | tee "$OUT/log-share-base.txt"
