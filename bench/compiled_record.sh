#!/usr/bin/env bash
# Compiled benches (all-reduce unless COLL names another) against the peers, each recorded into a copy of a registry, in one device call, from
# the repository root with $OUT set (carry .carry_peers: FlashInfer, installed by bench/peers_env.sh):
#
#   JOBS="4:r4:bench/exp_r4:1KB,4KB,16KB,64KB,256KB:200 2:r2:bench/exp_r2:1KB,1MB:150:0,1" bash bench/compiled_record.sh
#
# Each job is NPROC:LABEL:REGISTRY:SIZES:SECONDS[:GPUS] (GPUS default 0,1,2,3; LL128=1 adds --ll128; TOP=K times
# only the registry's K fastest plans a size, so that a sweep from 1 KB to 256 MB ends in one job; SAMPLES and
# CALLS, default 6 and 10: the bench's own 30 and 20 time ten times the calls; COLL, default allreduce, the
# collective): `weft bench COLL --compiled --record` over every plan of a copy of REGISTRY at SIZES, the peers timed
# beside it, written to $OUT/gpu_<COLL>_bf16_graph_<NPROC>x<gpu>_<LABEL>.json, the copy tarred as $OUT/reg_<LABEL>.tgz (a call returns
# eight files: past eight, the logs go into $OUT/logs_compiled_record.tgz). `weft registry record --registry bench/registry_h200x<N>
# FILE` then stores the file's times in a committed registry whose entries hold the same plans.
#
# The twelfth session's registries (bench/NOTES.md) were made here with `weft tune allreduce -t hgx_h200:gpus=N
# --method direct --protocols lamport --instances 16,32,64,128 --threads 256,512 --multipeer --registry DIR` (4 and
# 2 GPUs; `--method twoshot ... --instances 16,32,64,128 --threads 512,1024 --lamport-max-bytes 16MB` for 1-4 MB),
# plus the committed registry's fastest LL entries at those sizes, copied in.
set -u
. bench/device_env.sh
. bench/peers_env.sh
G="x$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | grep -oE 'H[0-9]+' | tr H h)"  # xh100, xh200
job() {  # nproc label registry sizes seconds [gpus]
  local reg="$OUT/reg_$2"
  rm -rf "$reg" && cp -r "$3" "$reg"
  echo "== bench $2 ($1 ranks, $4) $(date -u +%T)"
  CUDA_VISIBLE_DEVICES=${6:-0,1,2,3} timeout -k 5 "$5" python3 -c 'from weft.cli import run; run()' bench "${COLL:-allreduce}" \
    --nproc "$1" --plans registry --registry "$reg" --sizes "$4" --samples "${SAMPLES:-6}" --calls "${CALLS:-10}" --timeout 5 --compiled \
    ${LL128:+--ll128} ${TOP:+--top "$TOP"} --record -o "$OUT/gpu_${COLL:-allreduce}_bf16_graph_${1}${G}_$2.json" >"$OUT/log_$2.txt" 2>&1
  echo "rc=$?"
  grep -A9 "^# weft bench" "$OUT/log_$2.txt" | head -10
  tar -czf "$OUT/reg_$2.tgz" -C "$OUT" "reg_$2" && rm -rf "$reg"
}
for spec in ${JOBS:-}; do
  IFS=: read -r n label reg sizes secs gpus <<<"$spec"
  job "$n" "$label" "$reg" "$sizes" "$secs" "$gpus"
done
# a call brings back eight files: past that, the logs travel in one tarball (the results files stay as they are)
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar -czf logs_compiled_record.tgz log_*.txt && rm -f log_*.txt)
fi
