#!/usr/bin/env bash
# One device call: `bash benchmarks/gpu/device_run.sh packed|baseline` with $OUT set.
#   packed:   GPU tests, the packed sweep (plan 6), the Llama memory benchmark
#   baseline: the same sweep one job at a time (plan 1), the GLA memory benchmark
#   repeat:   the packed sweep again (a second sample), the GLA rows at batch 4
#   two:      on a machine of two cards: the packed sweep (plan 6 per card), then the same jobs
#             one per card (plan 1), both with the ballast on each card
#   learn:    minutes-long jobs declared too low and too high (learn_sweep.py): concurrency of
#             the first 390 s against an oracle, OOMs after the first per shape (one call)
#   learn-start, then learn-collect within the machine's warm period: the same over the whole
#             10-minute window, in two calls
#   scale:    the daemon figures by queue size (benchmarks/daemon_figures.py) on this host's CPU
#             cores, with simulated GPUs: no GPU is used (~5 min)
#   torchrun: two torchrun jobs (examples/torchrun_tiny.py, DDP over gloo) through orch, 2 ranks
#             each (on one card when the machine has one), reporting per-rank peaks (~3 min)
# Wheels of what the machine lacks (libtmux, sqlite-utils and deps, fla) are expected in .whl/.
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
MODE=${1:-packed}
OUT=${OUT:-/tmp/orch-gpu-out}
WORK=/tmp/orch-gpu-sweep
mkdir -p "$OUT"
# the ballast process a sweep left holding the card's memory (its pid in DIR/ballast.json)
kill_ballast() {
  [ -f "$1/ballast.json" ] && kill -9 "$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['pid'])" "$1/ballast.json")" 2>/dev/null
}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  python3 -c "import torch, transformers, peft, libtmux, sqlite_utils; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, torch.cuda.get_device_name())"
  tmux -V
  case "$MODE" in
    packed)
      timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py  # one process: no pytest-xdist there
      timeout 300 python3 benchmarks/gpu/run_sweep.py --work $WORK --out "$OUT" --tag packed --gpu-plan 6 --budget-s 240
      kill_ballast $WORK
      nvidia-smi --query-gpu=memory.used --format=csv
      timeout 150 python3 benchmarks/lora_memory.py --models llama --out "$OUT/lora_memory_llama.json"
      ;;
    baseline)
      timeout 400 python3 benchmarks/gpu/run_sweep.py --work $WORK --out "$OUT" --tag baseline --gpu-plan 1 --budget-s 340
      kill_ballast $WORK
      timeout 150 python3 benchmarks/lora_memory.py --models gla --out "$OUT/lora_memory_gla.json"
      ;;
    repeat)
      timeout 300 python3 benchmarks/gpu/run_sweep.py --work $WORK --out "$OUT" --tag packed2 --gpu-plan 6 --budget-s 240
      kill_ballast $WORK
      timeout 280 python3 benchmarks/lora_memory.py --models gla --batches 4 --out "$OUT/lora_memory_gla_b4.json"
      ;;
    two)
      nvidia-smi -L
      timeout 180 python3 benchmarks/gpu/run_sweep.py --work $WORK --out "$OUT" --tag packed_x2 --gpu-plan 6 --budget-s 150
      kill_ballast $WORK
      timeout 230 python3 benchmarks/gpu/run_sweep.py --work $WORK --out "$OUT" --tag baseline_x2 --gpu-plan 1 --budget-s 200
      kill_ballast $WORK
      python3 benchmarks/gpu/analyze.py "$WORK/packed_x2" --baseline "$WORK/baseline_x2" --out "$OUT/summary_x2.json" | tail -5
      ;;
    torchrun)
      timeout 220 python3 benchmarks/gpu/torchrun_orch.py --work /tmp/orch-torchrun --out "$OUT" --budget-s 180
      nvidia-smi --query-gpu=memory.used --format=csv
      ;;
    scale)
      nproc; uptime
      timeout 420 python3 -m benchmarks.daemon_figures --queued 1000,10000,50000 --only-queued --no-cli --status-jobs 0 --json "$OUT/daemon_scale.json"
      uptime
      # every worker of a wave ending at the same moment: the hand-off's worst case
      timeout 150 python3 -m benchmarks.daemon_figures --queued 10000 --only-queued --no-cli --status-jobs 0 --handoff-configs 1 --json "$OUT/daemon_scale_lockstep.json"
      uptime
      ;;
    learn)
      timeout 540 python3 benchmarks/gpu/learn_sweep.py --work /tmp/orch-learn --out "$OUT" --budget-s 390
      kill_ballast /tmp/orch-learn
      ;;
    learn-start)
      # the whole 10-minute window outlasts one call: the sweep runs in its own session from a
      # copy of the repo (the next call re-copies the tree), and `learn-collect`, called while
      # the machine is still warm, waits for it and brings its files back
      rm -rf /tmp/orch-learn-repo /tmp/orch-learn-site /tmp/orch-learn-out && mkdir -p /tmp/orch-learn-out
      cp -r . /tmp/orch-learn-repo && rm -rf /tmp/orch-learn-repo/.whl && cp -r /tmp/site /tmp/orch-learn-site
      (cd /tmp/orch-learn-repo && PYTHONPATH=/tmp/orch-learn-site:/tmp/orch-learn-repo setsid bash -c "timeout 900 python3 benchmarks/gpu/learn_sweep.py --work /tmp/orch-learn --out /tmp/orch-learn-out --budget-s ${LEARN_BUDGET_S:-630} >/tmp/orch-learn-out/sweep.log 2>&1; echo \$? >/tmp/orch-learn-out/rc" </dev/null >/dev/null 2>&1 &)
      for _ in $(seq 1 $(( ${LEARN_START_WAIT_S:-510} / 30 ))); do sleep 30; tail -n 1 /tmp/orch-learn-out/sweep.log; done
      ;;
    learn-collect)
      for _ in $(seq 1 ${LEARN_COLLECT_WAIT_S:-420}); do [ -f /tmp/orch-learn-out/rc ] && break; sleep 1; done
      cat /tmp/orch-learn-out/rc; tail -n 60 /tmp/orch-learn-out/sweep.log
      kill_ballast /tmp/orch-learn
      cp /tmp/orch-learn-out/* "$OUT"/
      ;;
  esac
} 2>&1 | tee "$OUT/log.txt"
