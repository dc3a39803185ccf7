#!/usr/bin/env bash
# The GPU gate in one device call, from the repository root with $OUT set:
#
#   here:    z3-solver, ortools, immutabledict (cp312 manylinux wheels, unpacked, tarred with xz) as
#            .carry_solvers/solvers.tar.xz and platformdirs' wheel beside it (carry .carry_solvers): the device image
#            has none of them, and the whole suite imports them when it collects
#   device:  GPUS=2,3 NPROC=2 STEPS="gpu tour" bash bench/gpu_gate.sh
#
# gpu:   `python -m pytest -m gpu` over the whole suite at NPROC ranks (WEFT_GPU_NPROC) on the GPUs named by GPUS;
#        the log is $OUT/gpu_tests_x<NPROC>.txt
# tour:  tests/test_readme_tour.py, the README's CLI tour from an empty folder, GPU lines included (it needs 2 GPUs);
#        the log is $OUT/tour_gpu.txt
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=${GPUS:-0,1} WEFT_GPU_NPROC=${NPROC:-2}
SITE=/tmp/weft-solvers
if [ ! -d "$SITE/z3" ]; then
  mkdir -p "$SITE" && tar -xJf .carry_solvers/solvers.tar.xz -C "$SITE" || exit 2
  python3 -m zipfile -e .carry_solvers/platformdirs-*.whl "$SITE" || exit 2
fi
export PYTHONPATH="$PWD:$SITE"
LOG="$OUT/log_gate_${NPROC:-2}.txt"
step() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }
for s in ${STEPS:-gpu tour}; do
  case $s in
    gpu)
      step "pytest -m gpu (whole suite) at $WEFT_GPU_NPROC ranks on GPUs $CUDA_VISIBLE_DEVICES"
      timeout -k 10 "${GPU_S:-330}" python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
        >"$OUT/gpu_tests_x$WEFT_GPU_NPROC.txt" 2>&1
      echo "rc=$?" | tee -a "$LOG"
      tail -n 4 "$OUT/gpu_tests_x$WEFT_GPU_NPROC.txt" | tee -a "$LOG" ;;
    tour)
      step "the README tour, GPU lines included, on GPUs $CUDA_VISIBLE_DEVICES"
      nvidia-smi -L >"$OUT/tour_gpu.txt"
      timeout -k 10 "${TOUR_S:-150}" python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider \
        tests/test_readme_tour.py >>"$OUT/tour_gpu.txt" 2>&1
      echo "rc=$?" | tee -a "$LOG"
      tail -n 3 "$OUT/tour_gpu.txt" | tee -a "$LOG" ;;
  esac
done
step "done"
