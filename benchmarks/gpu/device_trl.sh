#!/usr/bin/env bash
# One device call: `bash benchmarks/gpu/device_trl.sh serial|orch` with $OUT set; the two calls
# together are the TRL benchmark (benchmarks/gpu/trl_sweep.py), about 7 and 5 minutes:
#   serial: the sweep one job at a time (plan 1): solo run times and true peaks
#   orch:   the same sweep through orch with plan 4
#   CASE=scarce|plentiful|family (default family) picks the sweep; EXTRA="--mps --overlap" is
#   passed to the run (e.g. CASE=scarce EXTRA=--overlap bash benchmarks/gpu/device_trl.sh orch);
#   give the serial run the same --max-steps and --mem-gib as the orch run it is measured against
# then, on any machine: python benchmarks/gpu/trl_sweep.py analyze --orch trl-orch.json --serial trl-serial.json
# Wheels of what the machine lacks (trl, datasets, dill, multiprocess, libtmux, sqlite-utils and
# their small deps) are expected in wheels/ (git-ignored: carry it).
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
MODE=${1:-orch}
OUT=${OUT:-/tmp/orch-trl-out}
WORK=/tmp/orch-trl
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 -m pip install -q --no-deps --target /tmp/site wheels/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  python3 -c "import torch, transformers, peft, trl, datasets, libtmux, sqlite_utils; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, torch.cuda.get_device_name())"
  tmux -V
  case "$MODE" in
    serial) timeout 560 python3 benchmarks/gpu/trl_sweep.py run --work $WORK --out "$OUT" --tag serial --gpu-plan 1 --budget-s 500 --case "${CASE:-family}" ${EXTRA:-} ;;
    orch)   timeout 560 python3 benchmarks/gpu/trl_sweep.py run --work $WORK --out "$OUT" --tag orch --gpu-plan 4 --budget-s 500 --case "${CASE:-family}" ${EXTRA:-} ;;
  esac
  # the ballast is killed by the script on its way out; make sure
  [ -f $WORK/ballast.json ] && kill -9 "$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['pid'])" $WORK/ballast.json)" 2>/dev/null
  nvidia-smi --query-gpu=memory.used --format=csv
} 2>&1 | tee "$OUT/log-trl-$MODE.txt"
