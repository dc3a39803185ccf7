#!/usr/bin/env bash
# Device calls that gather the GPU evidence from a snapshot of HEAD, each inside the device tool's 600 s per call
# and its 8 files back under $OUT:
#
#   here:    git archive --format=tar.gz HEAD -o devsnap.tgz   (untracked, not ignored: it travels with the tree)
#   device:  bash bench/device_run.sh 2 tests      # pytest -m gpu, then the all-reduce bench      (~2.5 min)
#            bash bench/device_run.sh 2 more       # all-reduce without PDL, reduce-scatter, all-gather, eager,
#                                                  # tp_decode (~3 min)
#            bash bench/device_run.sh 2 ll128      # LL plans timed with and without LL128 lines (recorded apart),
#                                                  # tp_decode --ll128
#            bash bench/device_run.sh 2 pytest     # pytest -m gpu alone (~1.5 min), to put before another stage;
#                                                  # PYTEST_S=520 for 4 GPUs, whose worker job ran past 260 s in v8
#            bash bench/device_run.sh 2 diag       # kernel_trace of the LL128 plans, eager overhead, tp_decode twice
#            bash bench/device_run.sh 2 decode     # tp_decode RUNS times (default 2), ITERS (50) replays each
#            bash bench/device_run.sh 2 trace      # tp_decode --trace: the all-reduce's phases in the step and alone
#            bash bench/device_run.sh 4 first      # a first machine of N GPUs: pytest -m gpu, the benches in both
#                                                  # packet formats (recorded), tp_decode in between (~9 min)
#            bash bench/device_run.sh 4 x4         # issue 24: the three benches (recorded), tp_decode with all four
#                                                  # backends, then pytest -m gpu in what is left (~9 min)
#            TAG=a SNAP=v9.tgz bash bench/device_run.sh 2 startab; TAG=b bash bench/device_run.sh 2 startab
#                                                  # v10's A/B (git archive abd6646 -o v9.tgz: the kernel before the
#                                                  # start rework): tp_decode and the small all-reduce sizes, each
#                                                  # side ~2 min, nothing recorded
#
# A snapshot, not the working tree: an edit half-written by someone else must not travel (it cost a run once).
# Benches record every plan's time into the registry; registry.tgz brings it back (untar it over bench/).
set -u
N=${1:-2}
STAGE=${2:-tests}
. bench/device_env.sh
SNAP=${SNAP:-devsnap.tgz}  # SNAP=other.tgz runs another snapshot (an A/B of two commits in one call)
W=/tmp/weft-snap-${SNAP%.tgz}
if [ ! -d "$W" ] || [ "$SNAP" -nt "$W" ]; then
  rm -rf "$W" && mkdir -p "$W" && tar -xzf "$SNAP" -C "$W" || exit 2
fi
cd "$W" || exit 2
export PYTHONPATH="$W:$WEFT_SITE" WEFT_GPU_NPROC="$N"
REG=bench/registry_h200x$N
LOG="$OUT/log_${LOGAS:-$STAGE}.txt"  # LOGAS=name: stages of one call share a log (8 files come back)
S=1KB,4KB,16KB,64KB,256KB,1MB,4MB,16MB,64MB,256MB
weft() { python -c 'from weft.cli import run; run()' "$@"; }
step() { echo "== $*" | tee -a "$LOG"; }
bench() {  # collective, seconds, extra arguments
  local c=$1 t=$2; shift 2
  step "bench $c $*"
  timeout "$t" python -c 'from weft.cli import run; run()' bench "$c" --nproc "$N" --plans registry \
    --registry "$REG" --samples 6 --calls 10 --timeout 5 "$@" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
  tar -czf "$OUT/registry.tgz" "$REG"
}
decode() {  # seconds, iterations, results file under $OUT, extra arguments: one tp_decode run, batches 1-64
  local t=$1 iters=$2 json=$3; shift 3
  WEFT_REGISTRY="$REG" timeout "$t" torchrun --nproc-per-node "$N" examples/tp_decode.py --batch 1,4,16,64 \
    --iters "$iters" --json "$OUT/$json" "$@" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
}

if [ "$STAGE" = tests ] || [ "$STAGE" = pytest ]; then
  step "GPU tests"
  timeout "${PYTEST_S:-200}" python -m pytest -m gpu -q -rf --tb=line tests/gpu > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt" | tee -a "$LOG"
  grep "^worker" "$OUT/gpu_tests.txt" | tail -12 | tee -a "$LOG"
  [ "$STAGE" = pytest ] && exit 0
  bench allreduce 300 --record --sizes "$S" -o "$OUT/gpu_allreduce.json"
elif [ "$STAGE" = ll128 ]; then
  L=1KB,16KB,64KB,256KB,1MB,2MB,4MB
  bench allreduce 300 --ll128 --record --sizes "$S" -o "$OUT/gpu_allreduce_ll128.json"
  if [ "${RSAG:-1}" = 1 ]; then
    bench reducescatter 60 --ll128 --record --sizes "$L" -o "$OUT/gpu_reducescatter_ll128.json"
    bench allgather 60 --ll128 --record --sizes "$L" -o "$OUT/gpu_allgather_ll128.json"
  fi
  step "tp_decode (LL128 lines where measured faster)"
  decode 150 30 "tp_decode_ll128.json"
  grep "^tp=" "$LOG"
elif [ "$STAGE" = first ]; then  # 4 ranks, v8: each bench took under 30 s, tp_decode about 60 s
  step "GPU tests"
  timeout 260 python -m pytest -m gpu -q -rf --tb=line tests/gpu > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt" | tee -a "$LOG"
  grep "^worker" "$OUT/gpu_tests.txt" | tail -12 | tee -a "$LOG"
  bench allreduce 90 --ll128 --record --sizes "$S" -o "$OUT/gpu_allreduce.json"
  step "tp_decode (the plans just recorded)"
  decode 120 "${ITERS:-50}" "tp_decode.json"
  grep "^tp=" "$LOG"
  bench reducescatter 50 --ll128 --record --sizes "$S" -o "$OUT/gpu_reducescatter.json"
  bench allgather 50 --ll128 --record --sizes "$S" -o "$OUT/gpu_allgather.json"
elif [ "$STAGE" = x4 ]; then  # issue 24: the benches first (recorded), tp_decode, then pytest -m gpu in what is left
  bench allreduce 200 --ll128 --record --sizes "$S" -o "$OUT/gpu_allreduce.json"
  bench reducescatter 60 --ll128 --record --sizes "$S" -o "$OUT/gpu_reducescatter.json"
  bench allgather 60 --ll128 --record --sizes "$S" -o "$OUT/gpu_allgather.json"
  step "tp_decode (the plans just recorded; all four backends)"
  decode 120 "${ITERS:-30}" "tp_decode.json"
  grep "^tp=" "$LOG"
  step "sizes off the granule, padded (2-rank plans)"
  for p in allreduce-direct-ll-x4:1000004 allgather-direct-simple-x16:1000008 reducescatter-direct-simple-x16:1000008; do
    timeout 60 python -c 'from weft.cli import run; run()' run "tests/gpu/plans/${p%%:*}.json" --nproc 2 \
      --size "${p##*:}" --dtype bf16 --check >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
  done
  step "GPU tests"
  timeout "${PYTEST_S:-150}" python -m pytest -m gpu -q -rf --tb=line tests/gpu > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt" | tee -a "$LOG"
elif [ "$STAGE" = ab ]; then  # TAG=a|b: one side of an A/B, the sizes where LL128 lines run, nothing recorded
  bench allreduce 150 --ll128 --sizes 256KB,1MB,2MB,4MB,16MB -o "$OUT/gpu_allreduce_ab_${TAG:-a}.json"
elif [ "$STAGE" = startab ]; then  # TAG=a|b: one side of v10's A/B (a kernel's start), nothing recorded
  bench allreduce 90 --ll128 --sizes 1KB,4KB,16KB,64KB,256KB,1MB -o "$OUT/gpu_allreduce_start_${TAG:-a}.json"
  step "tp_decode (side ${TAG:-a})"
  decode 150 "${ITERS:-50}" "tp_decode_start_${TAG:-a}.json"
  grep "^tp=" "$LOG"
elif [ "$STAGE" = diag ]; then
  step "kernel_trace --lines"
  timeout 120 torchrun --nproc-per-node "$N" bench/kernel_trace.py --registry "$REG" --lines \
    -o "$OUT/kernel_trace_lines.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
  step "eager_overhead"
  timeout 90 torchrun --nproc-per-node "$N" bench/eager_overhead.py --registry "$REG" \
    -o "$OUT/eager_overhead.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
  for run in 1 2; do
    step "tp_decode run $run (lines where measured faster, 100 iterations)"
    decode 200 100 "tp_decode_$run.json"
  done
  grep "^tp=" "$LOG"
elif [ "$STAGE" = decode ]; then
  for run in $(seq 1 "${RUNS:-2}"); do
    step "tp_decode run $run"
    decode 200 "${ITERS:-50}" "tp_decode_$run.json"
  done
  grep "^tp=" "$LOG"
elif [ "$STAGE" = trace ]; then
  step "tp_decode --trace (weft-fused's all-reduce in the timed build, in the step and alone)"
  decode 200 "${ITERS:-50}" "tp_decode_trace.json" --trace
  grep "^trace" "$LOG"
else
  bench allreduce 100 --no-pdl --sizes 1KB,4KB,16KB,64KB,256KB,1MB,4MB -o "$OUT/gpu_allreduce_nopdl.json"
  bench reducescatter 130 --record --sizes "$S" -o "$OUT/gpu_reducescatter.json"
  bench allgather 130 --record --sizes "$S" -o "$OUT/gpu_allgather.json"
  bench allreduce 50 --eager --sizes 1KB,64KB,1MB --calls 20 -o "$OUT/gpu_allreduce_eager.json"
  step "tp_decode --no-ll128"
  decode 150 30 "tp_decode.json" --no-ll128
  grep "^tp=" "$LOG"
fi
grep -A12 "^# weft bench" "$LOG" || true
