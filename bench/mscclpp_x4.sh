#!/bin/bash
# MSCCL++'s DSL corpus beyond 2 ranks, in one device call on a 4-GPU machine (from the repository root, $OUT set):
#   1. the 4- and 8-rank single-node plans on the one-GPU path (every rank a process of one GPU, outputs against
#      numpy bit for bit): 4 ranks on GPU 0 and 8 ranks on GPU 1 at once;
#   2. the 4-rank multi-node plans (port channels) on 4 GPUs as 2 hosts x 2 GPUs: two torchrun "nodes" declared
#      as hosts host0/host1 (WEFT_HOST), NCCL forced onto its network path, each plan against NCCL;
#   3. the 2-rank sendrecv plan (port channels inside one host) on GPUs 0 and 1 against NCCL.
set -u
. bench/device_env.sh
export PYTHONPATH="$PWD:$WEFT_SITE"
P=tests/fixtures/mscclpp/plans
nvidia-smi -L > "$OUT/gpus.txt"
if [ "${SKIP_ONE:-0}" != 1 ]; then
FOUR=$(ls $P/single_node-*numgpus-4.json | grep -v nvls)
EIGHT=$(ls $P/single_node-*numgpus-8.json | grep -v nvls)
CUDA_VISIBLE_DEVICES=0 timeout -k 5 ${ONE_S:-150} python tests/gpu/one_device.py "$OUT/one4.json" $FOUR --nproc 4 \
  --sizes 64KB --timeout 20 --wait $(( ${ONE_S:-150} - 10 )) > "$OUT/one4.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout -k 5 ${ONE_S:-150} python tests/gpu/one_device.py "$OUT/one8.json" $EIGHT --nproc 8 \
  --sizes 64KB --timeout 20 --wait $(( ${ONE_S:-150} - 10 )) > "$OUT/one8.log" 2>&1 &
wait
for n in 4 8; do tail -n 3 "$OUT/one$n.log"; done
rm -rf "$OUT"/one*.ranks
fi
MULTI="$P/multi_node-allgather-gpuspernode-2.json $P/multi_node-allgather_pkt-gpuspernode-2.json \
  $P/multi_node-allgather_tbg-numgpus-4-gpuspernode-2-tbgsize-2.json $P/multi_node-reducescatter-gpuspernode-2.json \
  $P/multi_node-reducescatter_pkt-gpuspernode-2.json $P/multi_node-send_recv-nnodes-2-gpuspernode-2-instances-2.json"
port=$((20000 + RANDOM % 20000))
for h in 0 1; do
  CUDA_VISIBLE_DEVICES=$((2 * h)),$((2 * h + 1)) WEFT_HOST=host$h WEFT_HOSTS_NOTE="ranks 0-1 host0, 2-3 host1" \
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    timeout -k 5 ${MULTI_S:-120} python -m torch.distributed.run --nnodes 2 --node-rank $h --nproc-per-node 2 \
    --master-addr 127.0.0.1 --master-port $port bench/mscclpp_corpus_gpu.py "$OUT/multinode_4gpu.json" $MULTI \
    > "$OUT/multi$h.log" 2>&1 &
done
wait
echo "multi-node rc files: $(ls $OUT)"
grep -h -o "via NET/[A-Za-z]*" "$OUT"/multi*.log | sort | uniq -c > "$OUT/nccl_transport.txt"
grep -h '^{"plan"' "$OUT/multi0.log" | cut -c1-220
# keep the logs small: drop NCCL's INFO lines
for h in 0 1; do grep -v "NCCL INFO" "$OUT/multi$h.log" | tail -n 60 > "$OUT/multi$h.tail"; rm "$OUT/multi$h.log"; done
CUDA_VISIBLE_DEVICES=0,1 timeout -k 5 ${TWO_S:-60} python -m torch.distributed.run --nproc_per_node 2 \
  bench/mscclpp_corpus_gpu.py "$OUT/sendrecv_2gpu.json" $P/multi_node-send_recv-nnodes-1-gpuspernode-2-instances-2.json \
  > "$OUT/sendrecv.log" 2>&1; echo "sendrecv rc $?"
grep -v "^\s*$" "$OUT/sendrecv.log" | grep -v "NCCL INFO" | tail -n 12
