#!/usr/bin/env bash
# The fused norm's evidence on 2 GPUs in one device call (issue 23), run from the repository root:
#   bash bench/norm_run.sh        # pytest -m gpu tests/gpu/test_fused_norm.py (stops here if it fails), then
#                                 # bench/norm_plans.py (each candidate plan forced, in the step's shape), then
#                                 # examples/tp_decode.py --batch 1,4,16 RUNS times (default 3), 50 replays each
# TESTS=0 / PLANS=0 leave a stage out. Files land in $OUT: the results JSON and tp_decode_2xh200_norm_log.txt.
set -u
. bench/device_env.sh
export PYTHONPATH="$PWD:$WEFT_SITE"
REG=bench/registry_h200x2
LOG="$OUT/tp_decode_2xh200_norm_log.txt"
step() { echo "== $*" | tee -a "$LOG"; }
if [ "${TESTS:-1}" = 1 ]; then
  step "pytest -m gpu tests/gpu/test_fused_norm.py"
  timeout 240 python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_fused_norm.py \
    > "$OUT/gpu_tests_fused_norm_2xh200.txt" 2>&1
  rc=$?
  tail -4 "$OUT/gpu_tests_fused_norm_2xh200.txt" | tee -a "$LOG"
  [ "$rc" = 0 ] || { grep -E "rank [01]: (split|eager|graph)" "$OUT/gpu_tests_fused_norm_2xh200.txt" | cut -c1-900; exit 1; }
fi
if [ "${PLANS:-1}" = 1 ]; then
  step "bench/norm_plans.py"
  WEFT_REGISTRY="$REG" timeout 200 torchrun --nproc-per-node 2 bench/norm_plans.py -o "$OUT/norm_plans_2xh200.json" \
    >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
  grep -E "^batch|^  " "$LOG"
fi
for run in $(seq 1 "${RUNS:-3}"); do
  step "tp_decode run $run"
  WEFT_REGISTRY="$REG" timeout 170 torchrun --nproc-per-node 2 examples/tp_decode.py --batch 1,4,16 --iters 50 \
    --json "$OUT/tp_decode_2xh200_norm_$run.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
done
grep "^tp=" "$LOG" | sed -e 's/weft: [^w]*//' | cut -c1-1200
