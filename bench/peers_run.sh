#!/usr/bin/env bash
# Issue 32's evidence in device calls, from the repository root: FlashInfer (and vLLM's custom all-reduce as
# FlashInfer ships it) as peers of `weft bench`, the fused all-reduce + add + RMSNorm alone, and tp_decode with
# flashinfer-fused. FlashInfer travels in .carry_peers (ignored), made by bench/NOTES.md's recipe ("Peers"):
#   fi.tar.xz         the flashinfer-python wheel's files without the sources no comm kernel compiles
#   *.whl             apache-tvm-ffi (the one dependency the comm path imports that the GPU machine lacks)
#   aot/NAME.so.gz    FlashInfer's comm kernels, built for sm_90a (loaded from its AOT folder; without them
#                     FlashInfer JIT-builds them at first use, minutes of nvcc, and this script returns them)
#
#   bash bench/peers_run.sh 2 probe   # install, import, the bench and the fused call at two sizes (~1 min)
#   bash bench/peers_run.sh 2 all     # the canonical all-reduce bench, the fused call alone, tp_decode (~4 min)
#   bash bench/peers_run.sh 4 all
#   bash bench/peers_run.sh 4 bench   # the all-reduce bench alone
#   bash bench/peers_run.sh 4 lamport # issue 33: Lamport variants tuned into a copy of the registry, then the
#                                     # all-reduce bench 1 KB-16 MB, recorded into that copy
#                                     # ($OUT/registry_lamport_x<N>), against the peers (~3 min); NORM_LAMPORT=1
#                                     # also times the fused call alone on that registry (Lamport one-shot in it)
#   bash bench/peers_run.sh 2 compiled # issue 33: the bench 1 KB-4 MB (SIZES) with --compiled: each plan interpreted and
#                                     # as its own kernel, in one job with the peers, recorded into a copy of the
#                                     # registry ($OUT/registry_compiled_x<N>.tgz); about a minute a size with LL128
#                                     # lines (16 KB in 3.5 min on 2xH200), less with NO_LL128=1
#   bash bench/peers_run.sh 4 compiled3 # the compiled stage's three jobs in one call (1-64 KB without lines,
#                                     # 256 KB-4 MB, 16-256 MB; SMALL_S, LARGE_S, HUGE_S), then their merged table;
#                                     # TOP=K: every bench times only the registry's K fastest plans a size
#                                     # (weft bench --top; at 4 GPUs all ~80 plans take ~120 s a size compiled)
#   bash bench/peers_run.sh 2 decode  # the fused call alone (bench/norm_peers.py: weft as selected, and interpreted
#                                     # where it selects compiled), then tp_decode RUNS times (default 3; ~2 min)
#   bash bench/peers_run.sh 2 pdl     # tp_decode --backend norm at BATCH (1,4): the step's kernels profiled
#                                     # (--profile 5), then weft's and then FlashInfer's PDL off, then weft's
#                                     # compiled kernels triggering their dependents at their end (~3 min);
#                                     # PDL_VARIANTS: other tp_decode flag sets, ';'-separated
#   bash bench/peers_run.sh 4 midsize # issue 33: the traffic model's mid-size candidates (bench/NOTES.md, "Mid sizes
#                                     # on 4 GPUs"; results/traffic_predictions_midsize_4xh200.json) tuned into a copy
#                                     # of the registry, then the bench 1-16 MB, recorded
#                                     # into that copy ($OUT/registry_midsize_x<N>), against the peers (~6 min)
# .carry_peers also holds platformdirs' wheel (weft's proof cache needs it; the device image lacks it).
# N=2 runs on GPUs 0 and 1 of a larger machine. Files land in $OUT.
set -u
N=${1:-2}
STAGE=${2:-all}
. bench/device_env.sh
LOG="$OUT/log_peers_${N}.txt"
step() { echo "== $*" | tee -a "$LOG"; }
PEERS_LOG=$LOG . bench/peers_env.sh
[ "$N" = 2 ] && export CUDA_VISIBLE_DEVICES=${GPUS2:-0,1}  # GPUS2=1,0: the same GPUs, ranks swapped
REG=${REG:-bench/registry_h200x$N}
G="${N}x$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | grep -oE 'H[0-9]+' | tr H h)"  # 2xh100, 4xh200
step "import flashinfer.comm, then load (or JIT-build) its comm kernels"
timeout 480 python3 -c '
import time
t = time.time()
from executor.gpu import peers
print(peers.missing() or "import ok", peers.version(), f"{time.time() - t:.1f} s", flush=True)
from flashinfer.comm import trtllm_ar, vllm_ar
for load in (trtllm_ar.get_trtllm_comm_module, vllm_ar.get_vllm_comm_module):
    t = time.time()
    load()
    print(load.__name__, f"{time.time() - t:.1f} s", flush=True)
' >> "$LOG" 2>&1
echo "rc=$?" | tee -a "$LOG"
tail -4 "$LOG"
bench() {  # seconds, then weft bench's arguments
  local t=$1; shift
  step "weft bench allreduce $*"
  local lines=--ll128  # NO_LL128=1: each LL plan timed with its packets only (half the timers)
  [ "${NO_LL128:-0}" = 1 ] && lines=
  timeout "$t" python3 -c 'from weft.cli import run; run()' bench allreduce --nproc "$N" --plans registry \
    --registry "$REG" --samples 6 --calls 10 --timeout 5 $lines ${TOP:+--top $TOP} "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "rc=$rc" | tee -a "$LOG"
  return $rc
}
norm() {  # seconds, then norm_peers.py's arguments
  local t=$1; shift
  step "bench/norm_peers.py $*"
  WEFT_REGISTRY="$REG" timeout "$t" torchrun --nproc-per-node "$N" bench/norm_peers.py "$@" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
}
if [ "$STAGE" = probe ]; then
  bench 150 --sizes 1KB,1MB -o "$OUT/probe_allreduce_$G.json"
  norm 90 --tokens 1,16 --samples 3 -o "$OUT/probe_norm_$G.json"
  for d in /tmp/fi-ws/.cache/flashinfer/*/*/cached_ops/*/; do  # kernels built here: bring them back
    name=$(basename "$d")
    [ -f "$d/$name.so" ] && gzip -c "$d/$name.so" > "$OUT/$name.so.gz"
  done
elif [ "$STAGE" = lamport ]; then
  L="$OUT/registry_lamport_x$N"
  rm -rf "$L" && cp -r "$REG" "$L" && REG=$L
  step "tune Lamport all-reduce variants for hgx_h200:gpus=$N into $L"
  timeout 180 python3 -c 'from weft.cli import run; run()' tune allreduce -t "hgx_h200:gpus=$N" --protocols lamport \
    --instances 1,4,16,32,64 --threads 512,1024 --registry "$L" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
  bench 300 --sizes 1KB,4KB,16KB,64KB,256KB,1MB,4MB,16MB --record \
    -o "$OUT/gpu_allreduce_bf16_graph_${G}_lamport.json"
  # the fused all-reduce + add + RMSNorm on the same registry, the Lamport one-shot among its plans (NORM_LAMPORT=1)
  [ "${NORM_LAMPORT:-0}" = 1 ] && norm 120 -o "$OUT/gpu_allreduce_norm_bf16_graph_${G}_lamport.json"
  tar -czf "$OUT/registry_lamport_x$N.tgz" -C "$OUT" "registry_lamport_x$N" && rm -rf "$L"
elif [ "$STAGE" = compiled ] || [ "$STAGE" = compiled3 ]; then  # issue 33: every plan interpreted and compiled to
  L="$OUT/registry_compiled_x$N"  # its own kernel, beside the peers, the times recorded into one copy of the registry
  rm -rf "$L" && cp -r "$REG" "$L" && REG=$L
  if [ "$STAGE" = compiled ]; then
    bench "${BENCH_S:-300}" --sizes ${SIZES:-1KB,4KB,16KB,64KB,256KB,1MB,4MB} --compiled --record \
      -o "$OUT/gpu_allreduce_bf16_graph_${G}_compiled.json"
  else  # three jobs: 1-64 KB with packets only (LL16 wins there), 256 KB-4 MB, 16-256 MB; a file each
    for group in "small ${SMALL_S:-150} 1KB,4KB,16KB,64KB" "large ${LARGE_S:-260} 256KB,1MB,4MB" \
      "huge ${HUGE_S:-160} 16MB,64MB,256MB"; do
      set -- $group
      NO_LL128=$([ "$1" = small ] && echo 1 || echo 0) bench "$2" --sizes "$3" --compiled --record \
        -o "$OUT/gpu_allreduce_bf16_graph_${G}_compiled_$1.json"
    done
    python3 -c 'from weft.cli import run; run()' plot bench \
      "$OUT"/gpu_allreduce_bf16_graph_"${G}"_compiled_{small,large,huge}.json --markdown | tee -a "$LOG"
  fi
  tar -czf "$OUT/registry_compiled_x$N.tgz" -C "$OUT" "registry_compiled_x$N" && rm -rf "$L"
elif [ "$STAGE" = decode ]; then  # the fused call alone, then tp_decode RUNS times (its goal reads three runs)
  # NORM_ARGS="--candidates 3"; NORM_S: 120 s ended the thirteenth session's 2-GPU runs before 64 tokens
  # (norm_peers.py now writes its file after each token count, complete: false until the last)
  norm "${NORM_S:-240}" ${NORM_ARGS:-} -o "$OUT/gpu_allreduce_norm_bf16_graph_$G.json"
  for run in $(seq 1 "${RUNS:-3}"); do
    step "tp_decode run $run (five backends)"
    WEFT_REGISTRY="$REG" timeout 200 torchrun --nproc-per-node "$N" examples/tp_decode.py --batch 1,4,16,64 \
      --iters "${ITERS:-20}" --json "$OUT/tp_decode_${G}_$run.json" >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
  done
  grep -E "^tokens|^tp=" "$LOG"
  exit 0
elif [ "$STAGE" = pdl ]; then  # issue 33's batch-1 step gap: the step's kernels profiled, then PDL off on each side
  IFS=';' read -r -a variants <<< "${PDL_VARIANTS:---profile 5;--no-pdl weft;--no-pdl flashinfer;--weft-late-trigger}"
  for variant in "${variants[@]}"; do
    tag=$(echo "$variant" | tr -d '-' | tr ' ,/.' '____')
    step "tp_decode --backend norm $variant"
    WEFT_REGISTRY="$REG" timeout 150 torchrun --nproc-per-node "$N" examples/tp_decode.py --backend norm \
      --batch ${BATCH:-1,4} --iters "${ITERS:-20}" $variant --json "$OUT/tp_decode_${G}_$tag.json" >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
  done
  grep -E "^tp=" "$LOG"
  exit 0
elif [ "$STAGE" = midsize ]; then
  L="$OUT/registry_midsize_x$N"
  rm -rf "$L" && cp -r "$REG" "$L" && REG=$L
  tune() {  # seconds, then weft tune's arguments (every one a predicted contender at 1-16 MB)
    local t=$1; shift
    step "weft tune allreduce -t hgx_h200:gpus=$N $*"
    timeout "$t" python3 -c 'from weft.cli import run; run()' tune allreduce -t "hgx_h200:gpus=$N" --registry "$L" \
      --method twoshot "$@" >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
  }
  # predicted fastest at every size from 1 to 16 MB: the Lamport two-shot, per-peer x16 / x32-t512, multi-peer x64-x128
  tune 90 --protocols lamport --instances 16,32,64,128 --threads 512,1024 --lamport-max-bytes 16MB
  # next: LL128 lines to 16 MB, and the Simple two-shot that pulls (vLLM's way), x32-x128. The plain and pipelined
  # multi-peer two-shots are in the registry already, measured: the pull grid's plain variants (same names, made
  # again by today's codegen) are tuned aside and left out, so that each name in the bench is one plan
  tune 60 --protocols ll --instances 16,32,128 --threads 512,1024 --ll-max-bytes 16MB
  P="$OUT/registry_pull_x$N"
  rm -rf "$P" && cp -r "$L" "$P"
  L=$P tune 120 --protocols simple --instances 32,64,128 --threads 512,1024 --pull
  L=$REG
  grep -l '"name": "twoshot-allreduce-hgx_h200:gpus=[0-9]*-simple-x[-a-z0-9]*-pull' "$P"/entries/*.json |
    xargs -r cp -t "$L/entries/" && rm -rf "$P"
  python3 -c 'from weft.cli import run; run()' registry rebuild-index --registry "$L" >> "$LOG" 2>&1
  echo "pull entries: $(grep -l -- '-pull' "$L"/entries/*.json | wc -l); rc=$?" | tee -a "$LOG"
  bench 330 --sizes 1MB,2MB,4MB,8MB,16MB --record -o "$OUT/gpu_allreduce_bf16_graph_${G}_midsize.json"
  tar -czf "$OUT/registry_midsize_x$N.tgz" -C "$OUT" "registry_midsize_x$N" && rm -rf "$L"
else
  S=1KB,4KB,16KB,64KB,256KB,1MB,4MB,16MB,64MB,256MB
  # rc 1 is a wrong result (weft's or a peer's, in the file): only a crash (another code, no file) reruns without vLLM
  bench 240 --sizes "$S" -o "$OUT/gpu_allreduce_bf16_graph_$G.json" ||
    [ -s "$OUT/gpu_allreduce_bf16_graph_$G.json" ] ||
    bench 200 --sizes "$S" --peers flashinfer -o "$OUT/gpu_allreduce_bf16_graph_$G.json"
  [ "$STAGE" = bench ] && exit 0
  norm 120 -o "$OUT/gpu_allreduce_norm_bf16_graph_$G.json"
  step "tp_decode (five backends)"
  WEFT_REGISTRY="$REG" timeout 200 torchrun --nproc-per-node "$N" examples/tp_decode.py --batch 1,4,16,64 \
    --iters "${ITERS:-20}" --json "$OUT/tp_decode_$G.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
  grep "^tp=" "$LOG"
fi
grep -E "^tokens|flashinfer|^# weft bench" "$LOG" | head -40
grep -A12 "^# weft bench" "$LOG" || true
