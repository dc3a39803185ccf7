#!/usr/bin/env bash
# Nsight Compute on weft's interpreter kernel, for the plans the bench picks at 1 KB and 1 MB (2 GPUs).
#
#   device:  bash bench/ncu_profile.sh        (after device_run.sh unpacked the snapshot; ~2 min)
#
# Only rank 0 runs under ncu. ncu serializes the kernels it profiles, so profiling both ranks would stall two
# kernels that wait on each other; with rank 1 free, rank 1 has always written its packets and signals before
# rank 0's profiled kernel starts, so rank 0's duration is the kernel's own critical path without the peer's
# latency. The bench's per-call time minus this duration is the launch gap plus the NVLink crossing.
# Single-pass metrics only: a replayed kernel would wait for a peer that does not replay.
set -u
. bench/device_env.sh
W=/tmp/weft-snap
cd "$W" || exit 2
export PYTHONPATH="$W:$WEFT_SITE"
weft() { python -c 'from weft.cli import run; run()' "$@"; }
rm -rf /tmp/plans /tmp/entries && weft registry export /tmp/entries --registry bench/registry_h200x2 > /dev/null || exit 2
python - <<'EOF' || exit 2
import json, pathlib
out = pathlib.Path("/tmp/plans"); out.mkdir()
for f in pathlib.Path("/tmp/entries").glob("*.json"):
    (out / f.name).write_text(json.dumps(json.loads(f.read_text())["plan"], indent=1))
EOF
METRICS=gpu__time_duration.sum,sm__cycles_active.max,launch__grid_size,launch__block_size,launch__registers_per_thread
METRICS=$METRICS,smsp__cycles_active.avg,dram__bytes.sum,lts__t_bytes.sum
port=29611
for spec in "ll-x1-t256 1KB" "ll-x4-t256 16KB" "ll-x64-t256 256KB" "simple-x32-2s 1MB" "simple-x16-2s 1KB"; do
  set -- $spec
  plan=$(grep -l "\"name\": \"direct-allreduce-hgx_h200:gpus=2-$1\"" /tmp/plans/*.json | head -1)
  [ -n "$plan" ] || { echo "no plan $1" | tee -a "$OUT/ncu.txt"; continue; }
  port=$((port + 1))
  echo "== $1 at $2 ($plan)" | tee -a "$OUT/ncu.txt"
  common=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2)
  env "${common[@]}" RANK=1 LOCAL_RANK=1 timeout 120 python -c 'from weft.cli import run; run()' run "$plan" \
    --size "$2" --iters 60 --timeout 30 > "/tmp/rank1_$1.txt" 2>&1 &
  env "${common[@]}" RANK=0 LOCAL_RANK=0 timeout 120 ncu --kernel-name regex:weft_interpret --launch-skip 20 \
    --cache-control none --clock-control none \
    --launch-count 30 --metrics "$METRICS" --csv python -c 'from weft.cli import run; run()' run "$plan" \
    --size "$2" --iters 60 --timeout 30 > "/tmp/ncu_$1.csv" 2> "/tmp/ncu_$1.err"
  echo "rank0 rc=$?" | tee -a "$OUT/ncu.txt"
  wait
  grep '^"' "/tmp/ncu_$1.csv" > "$OUT/ncu_$1.csv"
  python - "/tmp/ncu_$1.csv" <<'EOF' | tee -a "$OUT/ncu.txt"
import csv, statistics, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
m, v, u = head.index("Metric Name"), head.index("Metric Value"), head.index("Metric Unit")
by = {}
for r in body:
    by.setdefault((r[m], r[u]), []).append(float(r[v].replace(",", "")))
for (name, unit), xs in sorted(by.items()):
    print(f"  {name:40s} median {statistics.median(xs):12.1f} {unit:8s} min {min(xs):.1f} max {max(xs):.1f} n={len(xs)}")
EOF
  tail -n 4 "/tmp/ncu_$1.err" "/tmp/rank1_$1.txt" >> "$OUT/ncu.txt"
done
