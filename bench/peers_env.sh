# Sourced by the device scripts that time the peers (bench/peers_run.sh, bench/compiled_record.sh), after
# bench/device_env.sh, from the repository root: FlashInfer installed once into $SITE from the carried folder
# ($PEERS_CARRY, default .carry_peers: bench/NOTES.md's "Peers" recipe), its pip output in $PEERS_LOG (default
# /dev/null), and the environment its comm kernels load in. A failed install exits the script with 2.
C=${PEERS_CARRY:-.carry_peers}
SITE=/tmp/peers-site
if [ ! -d "$SITE/flashinfer" ]; then
  echo "== install FlashInfer from $C" | tee -a "${PEERS_LOG:-/dev/null}"
  mkdir -p "$SITE" && tar -xJf "$C/fi.tar.xz" -C "$SITE" || exit 2
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$C"/*.whl >>"${PEERS_LOG:-/dev/null}" 2>&1 ||
    exit 2
  for so in "$C"/aot/*.so.gz; do
    [ -e "$so" ] || continue
    name=$(basename "$so" .so.gz)
    mkdir -p "$SITE/flashinfer/data/aot/$name" && gunzip -c "$so" >"$SITE/flashinfer/data/aot/$name/$name.so"
  done
fi
# sm_90a only; a JIT build spreads each source over every core (nvcc --split-compile)
export PYTHONPATH="$PWD:$SITE:$WEFT_SITE" FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws FLASHINFER_CUDA_ARCH_LIST=9.0a \
  FLASHINFER_EXTRA_CUDAFLAGS="--split-compile=0"
