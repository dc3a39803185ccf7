#!/usr/bin/env bash
# Kernel variants against this tree in one device call, from the repository root with $OUT set: the all-reduce
# bench (--compiled, graph replay, --peers none) over one registry's plans, run from each tree in turn, each with
# its own kernel cache, in the order ORDER (default "new base var var base new": every side twice, alternated).
#
#   here:    git archive --format=tar.gz BASE -o .carry_base/base.tgz            (side "base")
#            c=$(git stash create) && git archive --format=tar.gz $c -o .carry_base/var.tgz   (side "var": an edit
#            of this tree, archived and then reverted); platformdirs' wheel in .carry_base too (carry .carry_base)
#   device:  mkdir -p .carry_peers && cp .carry_base/platformdirs*.whl .carry_peers/ && REG=DIR bash bench/variants_ab.sh
#
# REG (a registry folder, required), NPROC (4), GPUS (0,1,2,3), SIZES, SAMPLES (6), CALLS (30), RUN_S (a run's limit,
# 150), LL128=1 (LL plans timed with LL128 lines too, as PLAN+ll128). bench/ab_compare.py then prints this tree / base ($OUT/reset) and var / this tree ($OUT/store): the raw
# files stay in $OUT/ab.tgz. The thirteenth session's call (bench/NOTES.md) ran CALLS=100 RUN_S=90, too little for
# eight plans compiled and interpreted: 2-3 sizes a run.
set -u
. bench/device_env.sh
export CUDA_VISIBLE_DEVICES=${GPUS:-0,1,2,3}
HERE=$PWD
REG=$(realpath "${REG:?REG: the registry whose plans every side times}")  # each side runs in its own tree
for s in base var; do
  [ -f ".carry_base/$s.tgz" ] || continue
  rm -rf "/tmp/weft-$s" && mkdir -p "/tmp/weft-$s" && tar -xzf ".carry_base/$s.tgz" -C "/tmp/weft-$s" || exit 2
done
LOG="$OUT/log_ab.txt"
tree() { [ "$1" = new ] && echo "$HERE" || echo "/tmp/weft-$1"; }
run() {  # side index
  local t
  t=$(tree "$1")
  echo "== $(date -u +%T) $1 $2" | tee -a "$LOG"
  (cd "$t" && WEFT_KERNEL_CACHE="/tmp/kc-$1" PYTHONPATH="$t:$WEFT_SITE" timeout -k 5 "${RUN_S:-150}" \
    python3 -c 'from weft.cli import run; run()' bench allreduce --nproc "${NPROC:-4}" --plans registry \
    --registry "$REG" --sizes "${SIZES:-4KB,16KB,64KB,256KB,1MB,4MB}" --samples "${SAMPLES:-6}" \
    --calls "${CALLS:-30}" --timeout 5 --compiled ${LL128:+--ll128} --peers none -o "$OUT/ab/ab_allreduce_$2_$1.json" \
    >>"$LOG" 2>&1)
  echo "rc=$?" | tee -a "$LOG"
}
mkdir -p "$OUT/ab"
i=0
for side in ${ORDER:-new base var var base new}; do
  i=$((i + 1))
  run "$side" "$i"
done
# ab_compare reads sides "base" and "new": this tree against base, then var against this tree
mkdir -p "$OUT/reset" "$OUT/store"
for f in "$OUT"/ab/*_new.json; do
  cp "$f" "$OUT/reset/"
  cp "$f" "$OUT/store/$(basename "$f" _new.json)_base.json"
done
for f in "$OUT"/ab/*_base.json; do cp "$f" "$OUT/reset/"; done
for f in "$OUT"/ab/*_var.json; do cp "$f" "$OUT/store/$(basename "$f" _var.json)_new.json"; done
echo "== this tree / base" | tee -a "$LOG"
python3 bench/ab_compare.py "$OUT/reset" | tee -a "$LOG"
echo "== var / this tree" | tee -a "$LOG"
python3 bench/ab_compare.py "$OUT/store" | tee -a "$LOG"
rm -rf "$OUT/reset" "$OUT/store"
tar -czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
