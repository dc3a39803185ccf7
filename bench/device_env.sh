# Sourced by every device script (bench/*.sh), from the repository root: the environment every GPU job here runs in.
# NVLink multicast stays off (the machines' rule). What the device image lacks comes from the carried folders, into
# one folder, $WEFT_SITE, that the scripts put on PYTHONPATH after the tree:
#   .carry_solvers/solvers.tar.xz       z3-solver, ortools and immutabledict, unpacked and tarred with xz
#   .carry_ort/solvers.tar.xz           the same without z3 (20 MB), for when the tree and .carry_solvers pass the
#                                       64 MiB a call carries (the fourteenth session: 36 + 30 MB); the GPU gate
#                                       then leaves out tests/test_smt.py, which imports z3 as it is collected
#   .carry_*/platformdirs-*.whl         platformdirs (weft's proof cache names its folder with it), from
#                                       .carry_solvers, .carry_ort or .carry_peers, whichever travelled
#   .carry_kernels/kernel_cache.tgz     a kernel cache (folder wk/) brought back from an earlier call's $OUT
#                                       (`tar -czf $OUT/kernel_cache.tgz -C /tmp wk`): unpacked into /tmp/wk and
#                                       made WEFT_KERNEL_CACHE, so tp_decode's compiled kernels are not built again
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
WEFT_SITE=/tmp/weft-solvers
mkdir -p "$WEFT_SITE"
for solvers in .carry_solvers/solvers.tar.xz .carry_ort/solvers.tar.xz; do
  if [ -f "$solvers" ] && [ ! -f "$WEFT_SITE/.solvers" ]; then
    tar -xJf "$solvers" -C "$WEFT_SITE" && touch "$WEFT_SITE/.solvers"
  fi
done
for wheel in .carry_solvers/platformdirs-*.whl .carry_ort/platformdirs-*.whl .carry_peers/platformdirs-*.whl; do
  if [ -f "$wheel" ] && [ ! -d "$WEFT_SITE/platformdirs" ]; then
    python3 -m zipfile -e "$wheel" "$WEFT_SITE"
  fi
done
export WEFT_SITE
if [ -f .carry_kernels/kernel_cache.tgz ] && [ ! -d /tmp/wk ]; then
  tar -xzf .carry_kernels/kernel_cache.tgz -C /tmp && chmod 700 /tmp/wk
fi
if [ -d /tmp/wk ]; then
  export WEFT_KERNEL_CACHE=/tmp/wk
fi
