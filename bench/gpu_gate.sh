#!/usr/bin/env bash
# The GPU gate in one device call, from the repository root with $OUT set:
#
#   here:    platformdirs' wheel in a carried folder (.carry_peers, .carry_solvers or .carry_ort; bench/device_env.sh);
#            the solvers (z3-solver, ortools, immutabledict: .carry_solvers/solvers.tar.xz) are optional
#   device:  GPUS=2,3 NPROC=2 STEPS="gpu tour" bash bench/gpu_gate.sh
#
# gpu:   `python -m pytest -m gpu` over the whole suite at NPROC ranks (WEFT_GPU_NPROC) on the GPUs named by GPUS;
#        the log is $OUT/gpu_tests_x<NPROC>.txt; NVCC_APART=1 runs the nvcc-only -m gpu tests (no GPU) in a second
#        pytest beside it, logged to $OUT/gpu_tests_nvcc_x<NPROC>.txt. SHARDS="0,1 2,3" (GPU groups) or PART=K/N
#        runs it file by file instead (bench/gpu_shards.py): one queue of files, a worker a group, so that two pairs
#        of a 4-GPU machine share the 2-rank suite, and PART keeps every Nth file, so that N calls run it whole;
#        the summary is $OUT/gpu_shards_x<NPROC>[_p<K>of<N>].json, a log a group; RESUME=an earlier call's summary
#        runs only the files that did not pass there (file by file, NVCC_APART=1 runs the nvcc tests beside the
#        groups inside gpu_shards.py, in its summary, logged to gpu_tests_x<NPROC>_apart.txt). Without z3 or ortools (the
#        device image has neither), the test files that import them as they are collected, none of which holds a
#        GPU test (tests/test_gpu_shards.py checks), are left out: the call then needs no solver carried
# a2a:   tests/gpu/test_alltoall.py alone, with its ranks' output, and their stacks if it outlives A2A_S
# tour:  tests/test_readme_tour.py, the README's CLI tour from an empty folder, GPU lines included (it needs 2 GPUs);
#        the log is $OUT/tour_gpu.txt
set -u
. bench/device_env.sh
export CUDA_VISIBLE_DEVICES=${GPUS:-0,1} WEFT_GPU_NPROC=${NPROC:-2} PYTHONPATH="$PWD:$WEFT_SITE"
export WEFT_TEST_TIMINGS="$OUT/scenario_seconds_x${NPROC:-2}.jsonl"  # each torch job's scenarios, timed (rank 0)
LOG="$OUT/log_gate_${NPROC:-2}.txt"
step() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }
for s in ${STEPS:-gpu tour}; do
  case $s in
    gpu)
      step "pytest -m gpu (whole suite) at $WEFT_GPU_NPROC ranks on GPUs $CUDA_VISIBLE_DEVICES"
      apart=()
      python3 -c "import z3" 2>/dev/null || apart+=(--ignore=tests/test_smt.py --ignore=tests/test_bound_validity.py)
      python3 -c "import ortools" 2>/dev/null ||
        apart+=(--ignore=tests/test_milp.py --ignore=tests/test_milp_hierarchy.py --ignore=tests/test_bound_validity.py)
      nvcc=(tests/test_cuda_compile.py tests/test_compiled.py)  # the -m gpu tests that only run nvcc (no GPU)
      sharded=${SHARDS:-}${PART:-}${RESUME:-}
      if [ "${NVCC_APART:-0}" = 1 ] && [ -z "$sharded" ]; then
        # in a second pytest beside the GPU tests: the two together are the whole -m gpu selection (file by file,
        # gpu_shards.py runs them itself, beside its GPU groups: --apart, below)
        apart+=(--ignore=tests/test_cuda_compile.py --ignore=tests/test_compiled.py)
        timeout -k 10 "${GPU_S:-330}" python3 -m pytest -m gpu -v -rfE --tb=short -p no:cacheprovider \
          tests/test_cuda_compile.py tests/test_compiled.py >"$OUT/gpu_tests_nvcc_x$WEFT_GPU_NPROC.txt" 2>&1 &
      fi
      if [ -n "$sharded" ]; then
        # file by file from one queue, a worker a GPU group; no file starts past GPU_S; NVCC_APART=1: the nvcc
        # tests by a worker of their own beside the groups, in the same summary (so that RESUME knows them)
        [ "${NVCC_APART:-0}" = 1 ] && apart+=("${nvcc[@]/#/--apart=}")
        python3 bench/gpu_shards.py --groups ${SHARDS:-$CUDA_VISIBLE_DEVICES} --nproc "$WEFT_GPU_NPROC" \
          --limit-s "${GPU_S:-330}" --test-s "${TEST_S:-200}" ${PART:+--part "$PART"} ${RESUME:+--resume "$RESUME"} --out "$OUT" \
          "${apart[@]}" 2>&1 | tee -a "$LOG" | tail -n 40
        echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
      else
        # -v: a line a test as it ends; pytest-timeout (in the image) ends a test that outlives TEST_S
        timeout -k 10 "${GPU_S:-330}" python3 -m pytest -m gpu -v -rfE --tb=short -p no:cacheprovider \
          --timeout "${TEST_S:-200}" --timeout-method signal "${apart[@]}" ${PYTEST_ARGS:-} \
          >"$OUT/gpu_tests_x$WEFT_GPU_NPROC.txt" 2>&1
        echo "rc=$?" | tee -a "$LOG"
        tail -n 4 "$OUT/gpu_tests_x$WEFT_GPU_NPROC.txt" | tee -a "$LOG"
      fi
      if [ "${NVCC_APART:-0}" = 1 ] && [ -z "$sharded" ]; then
        wait
        echo "nvcc tests:" | tee -a "$LOG"
        tail -n 2 "$OUT/gpu_tests_nvcc_x$WEFT_GPU_NPROC.txt" | tee -a "$LOG"
      fi ;;
    tour)
      step "the README tour, GPU lines included, on GPUs $CUDA_VISIBLE_DEVICES"
      nvidia-smi -L >"$OUT/tour_gpu.txt"
      timeout -k 10 "${TOUR_S:-150}" python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider \
        tests/test_readme_tour.py >>"$OUT/tour_gpu.txt" 2>&1
      echo "rc=$?" | tee -a "$LOG"
      tail -n 3 "$OUT/tour_gpu.txt" | tee -a "$LOG" ;;
    a2a)  # tests/gpu/test_alltoall.py alone, its ranks' output shown; past A2A_S their stacks are dumped (SIGABRT)
      step "tests/gpu/test_alltoall.py alone at $WEFT_GPU_NPROC ranks on GPUs $CUDA_VISIBLE_DEVICES"
      PYTHONFAULTHANDLER=1 timeout -k 5 "${A2A_S:-100}" python3 -m pytest -m gpu -v -s -rfE --tb=short \
        -p no:cacheprovider tests/gpu/test_alltoall.py >"$OUT/a2a_x$WEFT_GPU_NPROC.txt" 2>&1
      rc=$?
      echo "rc=$rc" | tee -a "$LOG"
      if [ $rc = 124 ]; then pkill -ABRT -f "gpu/test_alltoall.py"; sleep 3; fi
      tail -n 5 "$OUT/a2a_x$WEFT_GPU_NPROC.txt" | tee -a "$LOG" ;;
  esac
done
step "done"
