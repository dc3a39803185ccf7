# Sourced by the device scripts (bench/gpu_gate.sh, bench/house_ab.sh), from the repository root: the environment
# every GPU job here runs in. NVLink multicast stays off (the machines' rule), and what the device image lacks
# comes from .carry_solvers (carried): z3-solver, ortools and immutabledict unpacked as solvers.tar.xz, and
# platformdirs' wheel (weft's proof cache names its folder with it). They land in one folder on PYTHONPATH, after
# the tree itself.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
WEFT_SITE=/tmp/weft-solvers
if [ -d .carry_solvers ] && [ ! -f "$WEFT_SITE/.done" ]; then
  mkdir -p "$WEFT_SITE" && tar -xJf .carry_solvers/solvers.tar.xz -C "$WEFT_SITE" &&
    python3 -m zipfile -e .carry_solvers/platformdirs-*.whl "$WEFT_SITE" && touch "$WEFT_SITE/.done"
fi
export WEFT_SITE
