"""The GPU executor's padded path on CPU (issue 20 item 1): ``InterpreterEngine.execute`` at a size off the plan's
granule copies each part to its padded place, runs the plan there and copies each output part back.

No GPU: one InterpreterEngine per rank, each in a thread, over a fake CuPy whose 2-D copies move real host bytes.
The plan's own run at the padded size (what the GPU kernel does) is the CPU reference executor's, on the padded
buffers the executors hand it; everything around it is the executor's code.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_any_size import _expected, _inputs
from test_inference_capture_flow import FakeArray

from codegen import compile_schedule
from executor.errors import ExecutorError
from executor.gpu.engine import InterpreterEngine
from executor.reference.prove import run_reference
from topologies import resolve
from weft.synthesis import synthesize

TOPOLOGY = resolve("hgx_h200:gpus=4")
N = TOPOLOGY.nranks


HostArray = FakeArray  # a device array over host bytes (its address is real, so the fake copies move real data)


class CallerArray:
    """A caller's fp32 CuPy-like array over a numpy array."""

    device = SimpleNamespace(id=0)
    flags = SimpleNamespace(c_contiguous=True)

    def __init__(self, values: np.ndarray):
        self.values = np.ascontiguousarray(values, dtype=np.float32)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.values.shape,
            "typestr": "<f4",
            "data": (self.values.ctypes.data, False),
            "strides": None,
            "version": 3,
        }


def _copy_2d(dst, dst_pitch, src, src_pitch, width, height, kind, stream):
    for row in range(height):
        ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)


class FakeCupy:
    uint8 = np.uint8

    def __init__(self) -> None:
        self.cuda = SimpleNamespace(
            Device=lambda device: nullcontext(),
            get_current_stream=lambda: SimpleNamespace(ptr=0),
            runtime=SimpleNamespace(deviceSynchronize=lambda: None, memcpy2DAsync=_copy_2d),
        )

    def zeros(self, n: int, dtype) -> HostArray:
        return HostArray(np.zeros(n, dtype))


def _executors(plan) -> list[InterpreterEngine]:
    """One executor per rank whose direct executions meet at a barrier, where the reference executor runs the plan
    on every rank's padded buffers."""
    barrier, seen = threading.Barrier(N), {}

    def direct(rank):
        def execute(p, input, output=None, stream=None, dtype=None, lines=None, residual=None, compiled=None):
            seen[rank] = (input, output)
            if barrier.wait() == 0:
                nbytes = max(len(seen[0][0].host), len(seen[0][1].host))
                ins = [seen[r][0].host.view(np.float32) for r in range(N)]
                for r, y in enumerate(run_reference(p, ins, nbytes, dtype)):
                    seen[r][1].host.view(np.float32)[:] = y
            barrier.wait()
            return output

        return execute

    comms = []
    for rank in range(N):
        comm: Any = object.__new__(InterpreterEngine)  # a bare executor: the test sets the fields it reads
        comm.rank, comm.world_size, comm.device, comm._ll128, comm._compiled = rank, N, 0, False, False
        comm._cupy, comm._error, comm._tripwire = FakeCupy(), np.zeros(8, np.int32), None
        comm._plans, comm._padded, comm._residual_refusals = {}, {}, {}
        comm.execute = direct(rank)  # the plan's run at the padded size; the padded path around it is real
        comms.append(comm)
    return comms


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce", "alltoall"])
def test_the_executor_runs_a_size_off_the_granule_padded(name):
    plan = compile_schedule(synthesize(TOPOLOGY, name, "direct"), TOPOLOGY, instances=2)
    nbytes = plan.message_parts * 20
    assert not plan.accepts(nbytes) and plan.runs(nbytes)
    inputs = _inputs(name, nbytes, "fp32", np.random.default_rng(3))
    want = _expected(name, inputs, "fp32")
    outputs = [CallerArray(np.full(len(w), np.nan)) for w in want]
    comms, errors = _executors(plan), []

    def run(rank):
        try:
            InterpreterEngine.execute(comms[rank], plan, CallerArray(inputs[rank]), outputs[rank])
        except Exception as e:  # noqa: BLE001 (reported below, with the rank)
            errors.append((rank, e))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    for got, w in zip(outputs, want, strict=True):
        assert np.array_equal(got.values, w)
    padded = next(iter(comms[0]._padded.values()))[0]
    assert len(padded.host) == plan.padding(nbytes).padded_part_bytes * len(inputs[0]) * 4 // 20


def test_a_size_off_the_granule_outside_the_plans_range_is_refused_in_one_line():
    plan = compile_schedule(synthesize(TOPOLOGY, "allreduce", "direct"), TOPOLOGY, instances=2)
    nbytes = plan.max_message_size + 4
    assert nbytes % plan.granule
    with pytest.raises(ExecutorError, match=f"plan {plan.name}: size {nbytes} B is outside its range"):
        InterpreterEngine.execute(_executors(plan)[0], plan, CallerArray(np.zeros(nbytes // 4)))
