#!/usr/bin/env bash
# 4 GPUs as 2 hosts x 2 GPUs (ranks 0-1 on GPUs 0,1 as host0; 2-3 on GPUs 2,3 as host1), in one device call:
#   STEPS="ab pytest" bash bench/port_x4.sh      # from the repository root, $OUT set
# ab:      every two_hosts_2gpu plan at 1 lane and at LANES_AB lanes (bench/port_x4.py), NCCL on sockets
#          (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, as bench/mscclpp_x4.sh), then the same with NCCL_HOSTID per host
#          (NVLink inside a host, sockets between: the asymmetric fabric, for NCCL and the engine alike);
# final:   the result files (sockets), every plan at 1 lane then at 4 (LANES), SIZES ascending, SAMPLES (3) samples a
#          plan, with the plans synthesized for sockets everywhere beside them (examples/plans/two_hosts_2gpu_sockets,
#          named METHOD-COLLECTIVE@sockets, and the MILP's at one chunk a rank, @sockets_c1); final_nvlink: the same
#          with NCCL_HOSTID, the two_hosts_2gpu plans only;
#          FINAL_OUT: its folder (default $OUT); PIECE: the least of a chunk a lane carries, in bytes (default the
#          engine's PIECE_BYTES, 64 KB)
# pytest:  tests/gpu/test_port_two_hosts.py (-m gpu).
set -u
. bench/device_env.sh
# lanes run on 2 x L streams (theirs and their NCCL groups'): with CUDA's default 8 hardware queues, streams share
# queues and a lane's kernel can wait behind another lane's, which spins for a peer: a false dependency
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export PYTHONPATH="$PWD:$WEFT_SITE"
LOG="$OUT/log.txt"
step() { echo "== $* ($(date -u +%T))" | tee -a "$LOG"; }
x4() {  # LIMIT FABRIC(sockets|nvlink) ARGS...: two torchrun nodes of 2 GPUs each
  local limit=$1 fabric=$2; shift 2
  local port=$((20000 + RANDOM % 20000))
  for h in 0 1; do
    if [ "$fabric" = sockets ]; then net="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"; else net="NCCL_HOSTID=host$h"; fi
    env CUDA_VISIBLE_DEVICES=$((2 * h)),$((2 * h + 1)) WEFT_HOST=host$h $net NCCL_DEBUG=INFO \
      NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$OUT/nccl.$fabric.$h.%p.log" \
      timeout -k 5 "$limit" python -m torch.distributed.run --nnodes 2 --node-rank $h --nproc-per-node 2 \
      --master-addr 127.0.0.1 --master-port $port bench/port_x4.py "$@" >>"$LOG" 2>&1 &
  done
  wait
  grep -h -o "via [A-Za-z/]*" "$OUT"/nccl.$fabric.*.log 2>/dev/null | sort | uniq -c >> "$OUT/transport_$fabric.txt"
  rm -f "$OUT"/nccl.$fabric.*.log
}
for s in ${STEPS:-ab}; do
  case $s in
    ab)
      step "A/B sockets: lanes 1 vs ${LANES_AB:-4}"
      x4 ${AB_S:-90} sockets "$OUT/ab" --sizes ${SIZES_AB:-1MB,16MB,64MB} --lanes 1,${LANES_AB:-4} \
        --samples 3 --calls 2 --tag 2hosts_ab --methods ring,direct,milp
      step "A/B nvlink inside hosts (NCCL_HOSTID)"
      x4 ${AB_S:-90} nvlink "$OUT/ab" --sizes ${SIZES_AB:-1MB,16MB,64MB} --lanes 1,${LANES_AB:-4} \
        --samples 3 --calls 2 --tag 2hosts_nvlink_ab --methods ring,direct,milp ;;
    final)  # one lane count after the other (each whole before the next), sizes ascending, files after each size
      step "final sockets: lanes ${LANES:-1,4}"
      x4 ${FINAL_S:-150} sockets "${FINAL_OUT:-$OUT}" --sizes ${SIZES:-1MB,4MB,16MB,64MB,256MB} --lanes ${LANES:-1,4} \
        --samples ${SAMPLES:-3} --calls 1 --warmup 1 --tag 2hosts --dump-s $(( ${FINAL_S:-150} - 25 )) \
        --fabric-plans examples/plans/two_hosts_2gpu_sockets --fabric-plans examples/plans/two_hosts_2gpu_sockets_c1 \
        ${PIECE:+--piece-bytes $PIECE} ;;
    final_nvlink)
      step "final nvlink inside hosts (NCCL_HOSTID): lanes ${LANES:-1,4}"
      x4 ${FINAL_S:-150} nvlink "$OUT" --sizes ${SIZES:-1MB,4MB,16MB,64MB,256MB} --lanes ${LANES:-1,4} \
        --samples ${SAMPLES:-3} --calls 1 --warmup 1 --tag 2hosts_nvlink --dump-s $(( ${FINAL_S:-150} - 25 )) ;;
    pytest)
      step "pytest -m gpu tests/gpu/test_port_two_hosts.py"
      timeout -k 5 ${PYTEST_S:-120} python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_port_two_hosts.py \
        >>"$LOG" 2>&1; echo "pytest exit $?" | tee -a "$LOG" ;;
  esac
done
step "done"
grep -v "NCCL INFO" "$LOG" | grep -v "^\s*$" | tail -n 60
