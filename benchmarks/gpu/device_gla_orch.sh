#!/usr/bin/env bash
# One device call, most important result first, with $OUT set:
#   (a) a GLA-1.3B warm-up step in its own process (fla's Triton kernels compile into
#       TRITON_CACHE_DIR; stacks dumped every 60 s, so a hang shows where it is),
#       beside it the Llama memory rows (nothing to compile there);
#   (b) only if (a) finished: the `worker: lora` GLA suite through orch (benchmarks/gpu/gla_sweep.py);
#   (c) the GLA memory rows, in what time is left.
# Wheels of what the machine lacks (libtmux, sqlite-utils and deps, fla) are expected in .whl/.
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/orch-gla-out}
WORK=/tmp/orch-gla
LIMIT_S=${LIMIT_S:-530}  # the whole script, so that $OUT comes back inside the call's limit
mkdir -p "$OUT" "$WORK"
export TRITON_CACHE_DIR=$WORK/triton-cache
left() { echo $((LIMIT_S - SECONDS)); }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  time timeout 90 python3 -c "import torch, triton, fla, transformers, peft; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
  time timeout 120 python3 benchmarks/gpu/gla_sweep.py make-gla --dir $WORK/gla-1.3b
  timeout 200 python3 benchmarks/lora_memory.py --models llama --steps 10 --warmup 2 \
    --out "$OUT/lora_memory_llama.json" >$WORK/llama_rows.log 2>&1 &
  llama_pid=$!
  date -u
  time timeout -k 5 220 python3 benchmarks/gpu/gla_warmup.py --model $WORK/gla-1.3b \
    --traceback-every-s 60 --out "$OUT/gla_warmup.json"
  warm_rc=$?
  echo "warm-up exit $warm_rc at $SECONDS s"
  wait $llama_pid
  echo "llama rows exit $? at $SECONDS s"
  cat $WORK/llama_rows.log
  if [ "$warm_rc" = 0 ]; then
    budget_s=$(($(left) - 150))
    [ $budget_s -gt 240 ] && budget_s=240
    time timeout -k 5 $((budget_s + 40)) python3 benchmarks/gpu/gla_sweep.py --work $WORK --out "$OUT" \
      --model $WORK/gla-1.3b --budget-s $budget_s
    echo "sweep exit $? at $SECONDS s"
    time timeout -k 5 $(($(left) - 5)) python3 benchmarks/lora_memory.py --models gla --steps 10 --warmup 2 \
      --traceback-every-s 60 --out "$OUT/lora_memory_gla.json"
    echo "gla rows exit $? at $SECONDS s"
  fi
  nvidia-smi
  ls -la "$OUT"
} 2>&1 | tee "$OUT/log.txt"
