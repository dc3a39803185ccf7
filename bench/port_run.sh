#!/usr/bin/env bash
# The two-host proof on one 2-GPU machine, in one device call (results under $OUT, at most 8 files):
#   bash bench/port_run.sh
# 1. pytest tests/gpu/test_port_two_hosts.py: every two-host plan against NCCL (eager + CUDA graph), the bad cases,
#    a dead peer, and 4 ranks as 2 hosts x 2 GPUs over gloo;
# 2. `weft run` and `weft bench` launched as two torchrun nodes of one GPU each (WEFT_HOST=host0/host1), NCCL forced
#    onto its network path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1);
# 3. with HOP=1, bench/port_hop.py: one hop of the engine (NCCL send/recv) at 1 KB and 64 MB, same transport.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD"
LOG="$OUT/log.txt"
mkdir -p "$OUT/port"
step() { echo "== $* ($(date -u +%T))" | tee -a "$LOG"; }
two_nodes() {  # LIMIT seconds; two torchrun "nodes" of one GPU each, declared as two hosts, network path forced
  local limit=$1; shift
  local port=$((20000 + RANDOM % 20000))
  for R in 0 1; do
    CUDA_VISIBLE_DEVICES=$R WEFT_HOST=host$R NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      timeout -k 5 "$limit" python -m torch.distributed.run --nnodes 2 --node-rank $R --nproc-per-node 1 \
      --master-addr 127.0.0.1 --master-port $port --no-python "$@" >>"$LOG" 2>&1 &
  done
  wait
}
weft_cli=(python -c 'from weft.cli import run; run()')
step "pytest tests/gpu/test_port_two_hosts.py"
WEFT_PORT_OUT="$OUT/port" timeout -k 5 ${PYTEST_S:-120} python -m pytest -q -m "gpu or not gpu" -p no:cacheprovider \
  tests/gpu/test_port_two_hosts.py >>"$LOG" 2>&1; echo "pytest exit $?" | tee -a "$LOG"
step "weft run across two torchrun nodes"
two_nodes 40 "${weft_cli[@]}" run examples/plans/two_hosts/ring-allreduce.plan.json --size 1MB --check --timeout 20
for C in allreduce allgather reducescatter; do
  step "weft bench $C across two torchrun nodes (graph)"
  if [ $C = allreduce ]; then SIZES=1KB,64KB,1MB,16MB,64MB; PLANS=(examples/plans/two_hosts/{ring,trees,milp,direct}-$C.plan.json)
  else SIZES=1KB,1MB,64MB; PLANS=(examples/plans/two_hosts/{ring,trees,milp}-$C.plan.json); fi
  two_nodes 80 "${weft_cli[@]}" bench $C --timeout 20 --sizes $SIZES --samples 5 --calls 5 \
    --plans "${PLANS[@]}" -o "$OUT/gpu_${C}_bf16_graph_2xh200_port.json"
done
if [ "${HOP:-0}" = 1 ]; then
  step "port hop"
  two_nodes 30 python bench/port_hop.py "$OUT/port_hop_2xh200.json" --sizes 1KB,64MB --iters 50
fi
step "done"
(cd "$OUT" && tar -czf port.tgz port && rm -rf port)
