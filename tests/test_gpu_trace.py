"""The timed interpreter build's read-back (executor/gpu/trace.py) and its layout shared with interpreter.cu."""

import re

import numpy as np
import pytest

from executor.gpu import build as gpu_build
from executor.gpu import trace


def test_the_slot_layout_matches_the_kernel():
    # the tracer lives with the context both kernels share (ops.cuh: the interpreter's and the compiled plans')
    source = (gpu_build.source_dir() / "ops.cuh").read_text()
    assert int(re.search(r"constexpr int kTraceOps = (\d+);", source).group(1)) == trace.TRACE_OPS
    assert "constexpr int kTraceSlots = 3 + kTraceOps + 2;" in source


def test_sums_become_mean_microseconds_per_launch_per_block():
    raw = np.zeros((2, trace.TRACE_SLOTS), np.uint64)
    # block 0: 3 GHz, two launches; block 1: 1.5 GHz, its 20 ops fold into the last op slot
    raw[0, :5] = [600, 1200, 600, 3000, 6000]
    raw[0, -2:] = [12000, 4000]
    raw[1, 3 + trace.TRACE_OPS - 1] = 3000
    raw[1, -2:] = [3000, 2000]
    first, second = trace.summarize(raw.ravel(), 2, [2, 20], launches=2)
    assert first.phases == {"tables": 0.1, "dependency wait": 0.2, "barrier": 0.1}
    assert first.ops == (0.5, 1.0) and first.total == 2.0
    assert len(second.ops) == trace.TRACE_OPS and second.ops[-1] == 1.0 and second.total == 1.0


def test_no_launch_is_an_error():
    with pytest.raises(ValueError, match="no launches"):
        trace.summarize(np.zeros(trace.TRACE_SLOTS, np.uint64), 1, [1], launches=0)


def test_the_lamport_trace_cases_build_and_fit_both_protocols():
    # bench/kernel_trace.py --lamport builds its plans here: each case's LL and Lamport plans accept its size (a 4 MB
    # case once stopped the GPU run halfway: LL plans take up to 1 MB)
    from _bench import bench_script

    module = bench_script("kernel_trace")
    pairs = module.lamport_pairs(2)
    assert len(pairs) == 2 * len(module.LAMPORT_CASES)
    assert [p.lamport is not None for p, _, _ in pairs[:2]] == [False, True]
    assert all(plan.accepts(nbytes) for plan, nbytes, _ in pairs)
