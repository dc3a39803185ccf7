#!/bin/bash
# Issue 36's evidence in one device call on a 4-GPU machine (from the repository root, $OUT set):
#   1. the all-to-all and expert-exchange GPU tests (tests/gpu/test_alltoall.py, test_experts_gpu.py) on 2 and 4
#      GPUs;
#   2. for 2 and 4 GPUs: the direct all-to-all tuned into a registry of its own (registry_a2a_x<N>: LL up to
#      8 MB, with LL128 lines timed too, and Simple, at several instance counts, one thread block per peer or one
#      for every peer), then `weft bench alltoall` 1 KB-256 MB in
#      graph replay against NCCL (and torch symmetric memory's all_to_all_vdev where NVSHMEM loads; the bench runs
#      again without it if that fails), the times recorded into that registry;
#   3. examples/moe_layer.py at EP=4 and EP=2 on those registries (NCCL, weft's expert exchange and the layer
#      around weft's all-to-all, in one job);
#   4. 2DH on 4 GPUs declared as 2 hosts x 2 GPUs (bench/mscclpp_x4.sh's setup: two torchrun "nodes" as WEFT_HOST
#      host0/host1, NCCL forced onto its network path): the 2DH and flat direct plans through the port engine, in
#      one bench against NCCL's all-to-all over the same transport. TWODH_FABRIC=sockets (default; everything on
#      sockets, as run on 2026-11-27: 2DH 0.45-0.55x NCCL, one lane) or nvlink (NCCL_HOSTID per host: NVLink inside a
#      host, sockets between, the asymmetric fabric 2DH is for, as bench/port_x4.sh's final_nvlink); TWODH_LANES
#      sets the port engine's lanes at every size (WEFT_PORT_LANES); unset (the default since 2026-11-27), the
#      engine's own default: 4 lanes from 1 MB (CUDA_DEVICE_MAX_CONNECTIONS=32 here), one below. The runs of
#      2026-11-27 forced 4 (TWODH_LANES=4 repeats them).
# NS="2" runs the 2-GPU half only (default "4 2"). Stages can be skipped (SKIP_TESTS=1 SKIP_BENCH=1 SKIP_MOE=1 SKIP_2DH=1) and their time limits changed (TESTS_S,
# TUNE_S, BENCH_S, MOE_S, TWODH_S). MOE_ARGS adds to moe_layer.py's arguments (--no-pdl weft, --weft-late-trigger)
# and MOE_TAG to its files' names. Everything lands in $OUT: logs, results JSON, registries. Never run yet: if one
# 600 s call is too short, split it (SKIP_MOE=1 SKIP_2DH=1, then SKIP_TESTS=1 SKIP_BENCH=1) with REGS naming a
# git-ignored folder of the tree (kept between calls on a warm machine), so the second call's MoE layer selects
# by the first call's recorded times.
set -u
. bench/device_env.sh
export PYTHONPATH="$PWD:$WEFT_SITE"
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-2G}  # symmetric memory's all-to-all: 2 x 256 MB + splits
LOG="$OUT/log_moe.txt"
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
weft() { python3 -c 'from weft.cli import run; run()' "$@"; }
nvidia-smi -L > "$OUT/gpus.txt"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | grep -oE 'H[0-9]+' | tr H h)  # h100, h200
spec() { echo "hgx_h200:gpus=$1"; }  # the registries' topology: the catalog board (WEFT_TOPOLOGY), on H100 too
visible() { [ "$1" = 2 ] && echo "${GPUS2:-0,1}" || echo 0,1,2,3; }  # GPUS2=2,3: the 2-GPU runs on the other pair

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for n in 2 4; do
    step "gpu tests: all-to-all on $n GPUs"
    CUDA_VISIBLE_DEVICES=$(visible $n) WEFT_GPU_NPROC=$n timeout -k 5 ${TESTS_S:-120} \
      python3 -m pytest -q -m gpu tests/gpu/test_alltoall.py tests/gpu/test_experts_gpu.py -p no:cacheprovider > "$OUT/tests_alltoall_x$n.txt" 2>&1
    echo "rc=$?" | tee -a "$LOG"; tail -n 12 "$OUT/tests_alltoall_x$n.txt" | tee -a "$LOG"
  done
fi

for n in ${NS:-4 2}; do
  REG="${REGS:-$OUT}/registry_a2a_x$n"
  if [ ! -d "$REG" ]; then
    step "tune the direct all-to-all for $(spec $n) into $REG"
    # as the all-reduce registries' winners: LL of 512 threads up to 8 MB (the staging size), Simple of 1024.
    # --duplex: one block per peer both writes it and waits for it (the per-peer shape spins half its blocks), so
    # twice the instances fit: the traffic model (bench/NOTES.md, all-to-all) predicts simple-x32-dx at 1.15-1.2x
    # NCCL at 128-256 MB on 4 GPUs, where simple-x16 measured 1.02-1.05x; Simple multi-peer shapes measured slower
    # everywhere (2026-11-27), so they are left out
    timeout -k 5 ${TUNE_S:-120} python3 -c 'from weft.cli import run; run()' tune alltoall -t "$(spec $n)" \
      --registry "$REG" --protocols ll --instances 1,4,16,32,64 --threads 512 --ll-max-bytes 8MB --duplex \
      >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
    timeout -k 5 ${TUNE_S:-120} python3 -c 'from weft.cli import run; run()' tune alltoall -t "$(spec $n)" \
      --registry "$REG" --protocols simple --instances 4,16,32,64 --threads 512,1024 --duplex --no-multipeer \
      >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
  fi
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    RES="$OUT/gpu_alltoall_bf16_graph_${n}x$GPU.json"
    bench() {
      CUDA_VISIBLE_DEVICES=$(visible $n) timeout -k 5 ${BENCH_S:-150} python3 -c 'from weft.cli import run; run()' \
        bench alltoall --nproc $n --plans registry --registry "$REG" --sizes 1KB:256MB --ll128 --record \
        --samples ${SAMPLES:-10} --calls ${CALLS:-10} --timeout 10 -o "$RES" "$@" >> "$LOG" 2>&1
    }
    step "weft bench alltoall on $n GPUs, with torch symmetric memory's all-to-all"
    bench --peers symm; rc=$?
    echo "rc=$rc" | tee -a "$LOG"
    if [ $rc -gt 1 ]; then
      step "again without symmetric memory (rc $rc)"
      bench --peers none; echo "rc=$?" | tee -a "$LOG"
    fi
  fi
  if [ "${SKIP_MOE:-0}" != 1 ]; then
    step "examples/moe_layer.py at EP=$n"
    CUDA_VISIBLE_DEVICES=$(visible $n) WEFT_REGISTRY="$REG" WEFT_TOPOLOGY="$(spec $n)" timeout -k 5 ${MOE_S:-150} \
      python3 -m torch.distributed.run --nproc-per-node $n examples/moe_layer.py --iters ${MOE_ITERS:-30} \
      --layers ${MOE_LAYERS:-1} --routing ${MOE_ROUTING:-shared} --tokens ${MOE_TOKENS:-1,2,4,8,16,32,64,128,256} \
      $([ "${MOE_LOCAL:-0}" = 1 ] && echo --exchange-copies) ${MOE_ARGS:-} --json "$OUT/moe_layer_${n}x$GPU${MOE_TAG:-}.json" \
      > "$OUT/moe_layer_x$n${MOE_TAG:-}.log" 2>&1
    echo "rc=$?" | tee -a "$LOG"; grep -v "NCCL INFO" "$OUT/moe_layer_x$n${MOE_TAG:-}.log" | tail -n 12 | cut -c1-400 |
      tee -a "$LOG"
  fi
done

if [ "${SKIP_2DH:-0}" != 1 ]; then
  T=hgx_h200:nodes=2,gpus=2
  P="$OUT/twodh_plans"
  step "2DH and flat direct all-to-all plans for $T"
  for m in 2dh direct; do
    weft synth alltoall -t "$T" --method $m --compile --protocol simple -o "$P/" >> "$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
  done
  PLANS=$(ls "$P"/*.plan.json)
  port=$((20000 + RANDOM % 20000))
  step "weft bench alltoall on 4 GPUs as 2 hosts x 2 GPUs (port engine; NCCL on its network path): $PLANS"
  for h in 0 1; do
    if [ "${TWODH_FABRIC:-sockets}" = sockets ]; then net="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"; else net="NCCL_HOSTID=host$h"; fi
    env CUDA_VISIBLE_DEVICES=$((2 * h)),$((2 * h + 1)) WEFT_HOST=host$h $net ${TWODH_LANES:+WEFT_PORT_LANES=$TWODH_LANES} \
      CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout -k 5 ${TWODH_S:-150} \
      python3 -m torch.distributed.run --nnodes 2 --node-rank $h --nproc-per-node 2 --master-addr 127.0.0.1 \
      --master-port $port --no-python python3 -c 'from weft.cli import run; run()' bench alltoall \
      --plans $PLANS --sizes ${TWODH_SIZES:-64KB:64MB} --samples ${TWODH_SAMPLES:-6} --calls ${TWODH_CALLS:-5} \
      --timeout 20 -o "$OUT/gpu_alltoall_bf16_graph_2dh_2x2${GPU}_${TWODH_FABRIC:-sockets}.json" > "$OUT/twodh$h.log" 2>&1 &
  done
  wait
  grep -h -o "via NET/[A-Za-z]*" "$OUT"/twodh*.log | sort | uniq -c > "$OUT/twodh_nccl_transport.txt"
  cat "$OUT/twodh_nccl_transport.txt" | tee -a "$LOG"
  for h in 0 1; do grep -v "NCCL INFO" "$OUT/twodh$h.log" | tail -n 40 > "$OUT/twodh$h.tail"; rm "$OUT/twodh$h.log"; done
  tail -n 25 "$OUT/twodh0.tail" | tee -a "$LOG"
  # which plan won each size, and each plan's time (plans_us by hash)
  python3 - "$OUT/gpu_alltoall_bf16_graph_2dh_2x2${GPU}_${TWODH_FABRIC:-sockets}.json" "$P" <<'EOF' | tee -a "$LOG"
import json, sys
from pathlib import Path
from schedules.plan import load_plan
doc = json.loads(Path(sys.argv[1]).read_text())
names = {load_plan(p).content_hash: load_plan(p).weft.solver for p in Path(sys.argv[2]).glob("*.plan.json")}
for r in doc["rows"]:
    each = {names.get(h, h): us for h, us in r["plans_us"].items()}
    busbw = {k: r["size"] / (v * 1e3) * 0.75 for k, v in {"nccl": r["nccl_us"], **each}.items()}
    print(r["size"], {k: round(v, 2) for k, v in busbw.items()}, "GB/s busbw; wrong", r["wrong"])
EOF
fi
[ "${REGS:-$OUT}" != "$OUT" ] && cp -r "$REGS"/registry_a2a_x* "$OUT/" 2>/dev/null
step "done"
ls -la "$OUT" | tee -a "$LOG"
