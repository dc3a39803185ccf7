#!/usr/bin/env bash
# Issue 34's "no behaviour or speed change" A/B, in one device call, from the repository root with $OUT set:
#
#   here:    mkdir -p .carry_base && git archive --format=tar.gz BASE -o .carry_base/base.tgz   (carry .carry_base)
#   device:  GPUS=0,1 bash bench/house_ab.sh
#
# The eighth session's call (bench/NOTES.md): GPUS=0,1 SIZES=1MB,4MB,16MB,64MB,256MB SMALL_SIZES=1KB,4KB,16KB,64KB,256KB
# STEPS="small bench decode decode2" BENCH_S=100 DECODE_S=100 ITERS=30: the small sizes in $OUT/small, 8 runs
# alternated (SMALL_SIZES, SMALL_SAMPLES, SMALL_CALLS; 9 samples of 500 calls unless set), the rest as below, ~500 s.
#
# On the 2 GPUs named by GPUS, the all-reduce bench (1 KB-256 MB, bf16, graph replay, the committed 2-GPU registry's
# plans, nothing recorded) runs base, this tree, this tree, base (ABBA, so a drift over the call lands on both sides
# alike), then examples/tp_decode.py base then this tree (STEPS="bench decode decode2": tp_decode ABBA too). Each
# side runs from its own tree with its own registry and
# kernel cache (SIZES, SAMPLES and CALLS set the bench's sizes, samples and calls a sample). bench/ab_compare.py
# prints the ratio this tree / base at every size and batch.
set -u
. bench/device_env.sh
export CUDA_VISIBLE_DEVICES=${GPUS:-0,1}
HERE=$PWD
BASE=/tmp/weft-base
rm -rf "$BASE" && mkdir -p "$BASE" && tar -xzf .carry_base/base.tgz -C "$BASE" || exit 2
LOG="$OUT/log_ab.txt"
S=${SIZES:-1KB,4KB,16KB,64KB,256KB,1MB,4MB,16MB,64MB,256MB}
step() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }
tree() { [ "$1" = base ] && echo "$BASE" || echo "$HERE"; }
bench() {  # side, index[, folder, sizes, samples, calls]
  local t dir=${3:-$OUT}
  t=$(tree "$1")
  mkdir -p "$dir"
  step "bench allreduce, side $1 ($2) ${4:-$S}"
  (cd "$t" && WEFT_KERNEL_CACHE=/tmp/kc-$1 PYTHONPATH="$t:$WEFT_SITE" timeout -k 5 "${BENCH_S:-110}" \
    python3 -c 'from weft.cli import run; run()' bench allreduce --nproc 2 --plans registry \
    --registry bench/registry_h200x2 --sizes "${4:-$S}" --samples "${5:-${SAMPLES:-6}}" --calls "${6:-${CALLS:-10}}" \
    --timeout 5 --peers none -o "$dir/ab_allreduce_$2_$1.json" >>"$LOG" 2>&1)
  echo "rc=$?" | tee -a "$LOG"
}
# The small sizes again, in $OUT/small, with many calls a sample: a sample is one graph replay of CALLS calls on each
# rank, and the ranks start each replay a few µs apart (each launches its own), so the rank that waits pays that skew
# once per replay. At 3 µs a call and 10-20 calls a sample it moved a run's times by up to 9%, at 200 calls by 1-3%,
# at 500 by under 2%.
small() {  # side, index
  bench "$1" "$2" "$OUT/small" "${SMALL_SIZES:-1KB,4KB,16KB,64KB}" "${SMALL_SAMPLES:-9}" "${SMALL_CALLS:-500}"
}
decode() {  # side, index
  local t
  t=$(tree "$1")
  step "tp_decode, side $1 ($2)"
  (cd "$t" && WEFT_KERNEL_CACHE=/tmp/kc-$1 WEFT_REGISTRY=bench/registry_h200x2 PYTHONPATH="$t:$WEFT_SITE" \
    timeout -k 5 "${DECODE_S:-150}" python3 -m torch.distributed.run --nproc-per-node 2 examples/tp_decode.py \
    --batch 1,4,16,64 --iters "${ITERS:-50}" --json "$OUT/ab_decode_$2_$1.json" >>"$LOG" 2>&1)
  echo "rc=$?" | tee -a "$LOG"
}
for s in ${STEPS:-bench decode}; do
  case $s in
    bench) bench base 1; bench new 2; bench new 3; bench base 4 ;;
    decode) decode base 5; decode new 6 ;;
    decode2) decode new 9; decode base 10 ;;  # tp_decode again (BA): with decode, ABBA
    bench2) bench new 7; bench base 8 ;;  # two more bench runs (BA), for a later call on the same pair
    bench3) bench base 11; bench new 12 ;;  # and two more (AB): "bench bench2 bench3 bench4" runs 5 a side,
    bench4) bench new 13; bench base 14 ;;  # alternated, for the sizes where a few ns are 2%
    small) small base 21; small new 22; small new 23; small base 24; small new 25; small base 26; small base 27
      small new 28 ;;  # the small sizes, ABBA twice over, in $OUT/small
  esac
done
step "compare"
python3 bench/ab_compare.py "$OUT" | tee -a "$LOG"
[ -d "$OUT/small" ] && python3 bench/ab_compare.py "$OUT/small" | tee -a "$LOG"
