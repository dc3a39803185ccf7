#!/usr/bin/env bash
# One device call that gathers all GPU evidence: the GPU tests, the benchmarks (recording into the registry) and
# tp_decode, from a snapshot of HEAD, returning at most 8 files under $OUT (the device tool's limit).
#
#   here:    git archive --format=tar.gz HEAD -o devsnap.tgz   (untracked, not ignored: it travels with the tree)
#   device:  bash bench/device_run.sh [2|4]            ($OUT set by the device tool)
#
# A snapshot, not the working tree: an edit half-written by someone else must not travel (it cost a run once).
set -u
N=${1:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
W=/tmp/weft-snap
rm -rf "$W" && mkdir -p "$W" && tar -xzf devsnap.tgz -C "$W" && cd "$W" || exit 2
export PYTHONPATH="$W" WEFT_GPU_NPROC="$N"
REG=bench/registry_h200x$N
LOG="$OUT/log.txt"
weft() { python -c 'from weft.cli import run; run()' "$@"; }
step() { echo "== $*" | tee -a "$LOG"; }

step "GPU tests"
timeout 240 python -m pytest -m gpu -q -rf --tb=line tests/gpu > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt" | tee -a "$LOG"
S=1KB,4KB,16KB,64KB,256KB,1MB,4MB,16MB,64MB,256MB
for c in allreduce reducescatter allgather; do
  step "bench $c"
  timeout 150 weft bench "$c" --nproc "$N" --plans registry --registry "$REG" --record --sizes "$S" --samples 6 \
    --calls 10 --timeout 5 -o "$OUT/gpu_${c}.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
done
step "bench allreduce eager"
timeout 60 weft bench allreduce --nproc "$N" --plans registry --registry "$REG" --eager --sizes 1KB,64KB,1MB \
  --samples 6 --calls 20 --timeout 5 -o "$OUT/gpu_allreduce_eager.json" >> "$LOG" 2>&1
echo "rc=$?" | tee -a "$LOG"
step "tp_decode"
WEFT_REGISTRY="$REG" timeout 120 torchrun --nproc-per-node "$N" examples/tp_decode.py --batch 1,4,16,64 --iters 30 \
  --json "$OUT/tp_decode.json" >> "$LOG" 2>&1
echo "rc=$?" | tee -a "$LOG"
grep "^tp=" "$LOG"
tar -cf "$OUT/registry.tar" "$REG"
grep -A12 "^# weft bench" "$LOG"
