#!/usr/bin/env bash
# The two-host proof on one 2-GPU machine, in one device call (results under $OUT, at most 8 files):
#   bash bench/port_run.sh
# 1. pytest tests/gpu/test_port_two_hosts.py: every two-host plan against NCCL (eager + CUDA graph), the bad cases,
#    a dead peer, and 4 ranks as 2 hosts x 2 GPUs over gloo;
# 2. `weft run` and `weft bench` launched as two torchrun nodes of one GPU each (WEFT_HOST=host0/host1), NCCL forced
#    onto its network path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1);
# 3. with HOP=1, bench/port_hop.py: one hop of the engine (NCCL send/recv) at 1 KB and 64 MB, same transport.
set -u
. bench/device_env.sh
export PYTHONPATH="$PWD:$WEFT_SITE"
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
WEFT_PORT_OUT="$OUT/port" timeout -k 5 ${PYTEST_S:-100} python -m pytest -q -m "gpu or not gpu" -p no:cacheprovider \
  tests/gpu/test_port_two_hosts.py >>"$LOG" 2>&1; echo "pytest exit $?" | tee -a "$LOG"
bench() {  # COLLECTIVE SIZES NAME [PLAN METHODS]: weft bench across two torchrun nodes (graph)
  step "weft bench $1 $3 across two torchrun nodes (graph)"
  local plans=(); for m in ${4:-ring trees milp}; do plans+=(examples/plans/two_hosts/$m-$1.plan.json); done
  two_nodes 70 "${weft_cli[@]}" bench $1 --timeout 20 --sizes $2 --samples 5 --calls 5 --plans "${plans[@]}" \
    -o "$OUT/gpu_$1_bf16_graph_2xh200_$3.json"
}
bench allreduce 1KB,64KB,1MB,16MB,64MB port "ring trees milp direct"
# NCCL's point-to-point settings (no effect on its collectives): more channels per peer, larger network chunks
NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=524288 bench allreduce 1MB,16MB,64MB port_p2ptuned "ring direct"
bench allgather 1KB,1MB,64MB port
bench reducescatter 1KB,1MB,64MB port
step "weft run across two torchrun nodes"
two_nodes 30 "${weft_cli[@]}" run examples/plans/two_hosts/ring-allreduce.plan.json --size 1MB --check --timeout 20
if [ "${HOP:-0}" = 1 ]; then
  step "port hop"
  two_nodes 30 python bench/port_hop.py "$OUT/port_hop_2xh200.json" --sizes 1KB,64MB --iters 50
fi
step "done"
(cd "$OUT" && tar -czf port.tgz port && rm -rf port)
