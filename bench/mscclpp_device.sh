#!/bin/bash
# MSCCL++'s DSL corpus on GPUs, in one device call (from the repository root, $OUT set):
#   2-rank plans on 2 GPUs against NCCL (bench/mscclpp_corpus_gpu.py), MSCCL++'s all-reduce plans against weft's
#   own in one bench job, and the 4- and 8-rank plans (in place included) on the one-GPU path.
set -u
. bench/device_env.sh
export PYTHONPATH="$PWD:$WEFT_SITE"
P=tests/fixtures/mscclpp/plans
nvidia-smi -L > "$OUT/gpus.txt"
TWO="$P/single_node-allgather.json $P/single_node-allgather_tbg.json"
for p in allgather_pkt allgather_pkt_rppkt allreduce allreduce_naivy allreduce_pkt alltoall-alltoall \
         alltoall-alltoall_pipeline alltoall-alltoall_ring alltoall-alltoall_ring_oop alltoall-alltoall_ring_peers; do
  TWO="$TWO $P/single_node-$p-numgpus-2.json"
done
FOUR=$(ls $P/single_node-*numgpus-4.json | grep -v nvls)
EIGHT=$(ls $P/single_node-*numgpus-8.json | grep -v nvls)
timeout 90 python -m torch.distributed.run --nproc_per_node 2 bench/mscclpp_corpus_gpu.py "$OUT/mscclpp_2gpu.json" \
  $TWO > "$OUT/two.log" 2>&1; echo "two-GPU check rc $?"
W=""
for p in direct-ll-x1 direct-ll-x8 twoshot-simple-x8 twoshot-simple-x16 direct-simple-x16; do
  W="$W tests/gpu/plans/allreduce-$p.json"
done
timeout 80 python -c 'from weft.cli import run; run()' bench allreduce --nproc 2 --plans \
  $P/single_node-allreduce-numgpus-2.json $P/single_node-allreduce_pkt-numgpus-2.json \
  $P/single_node-allreduce_naivy-numgpus-2.json $W --sizes 1KB,64KB,1MB,16MB,128MB --samples 8 --calls 10 \
  -o "$OUT/gpu_allreduce_mscclpp_vs_weft_2xh200.json" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
for n in 4 8; do
  eval "PLANS=\$$( [ $n = 4 ] && echo FOUR || echo EIGHT )"
  CUDA_VISIBLE_DEVICES=0 timeout 100 python tests/gpu/one_device.py "$OUT/one$n.json" $PLANS --nproc $n \
    --sizes 64KB --timeout 20 --wait 95 > "$OUT/one$n.log" 2>&1; echo "one-GPU $n ranks rc $?"
  tail -n 2 "$OUT/one$n.log"
done
