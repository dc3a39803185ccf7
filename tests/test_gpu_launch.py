"""The driver launch's C layouts and argument packing (no GPU needed)."""

import ctypes

import numpy as np
import pytest

from executor.errors import ExecutorError
from executor.gpu import launch as gpu_launch


def test_the_launch_structs_match_cuda_h():
    # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union; CUlaunchConfig: 7 uints, stream,
    # attribute pointer and count, 8-byte aligned
    assert ctypes.sizeof(gpu_launch._Attribute) == 72 and gpu_launch._Attribute.value.offset == 8
    assert ctypes.sizeof(gpu_launch._Config) == 56
    assert gpu_launch._Config.hStream.offset == 32 and gpu_launch._Config.attrs.offset == 40


class _Data:
    ptr = 0xDEAD0000


class _DeviceArray:
    data = _Data()


def test_arguments_are_packed_as_the_kernel_reads_them():
    packed = gpu_launch.Arguments.pack([_DeviceArray(), np.uint64(7), np.int32(-3), np.int64(1 << 40)])
    kinds = [type(v) for v in packed.values]
    assert kinds == [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64]
    assert [v.value for v in packed.values] == [0xDEAD0000, 7, -3, 1 << 40]
    # each pointer addresses its value
    assert [
        ctypes.cast(p, ctypes.POINTER(type(v))).contents.value
        for p, v in zip(packed.pointers, packed.values, strict=True)
    ] == [v.value for v in packed.values]


def test_an_argument_of_another_kind_is_refused():
    with pytest.raises(ExecutorError, match="cannot pass a float"):
        gpu_launch.Arguments.pack([1.5])


class _Driver:
    def __init__(self, code: int) -> None:
        self.code = code
        self.calls: list[tuple[object, ...]] = []

    def cuLaunchKernelEx(self, config, function, pointers, extra):
        cfg = config._obj
        self.calls.append((cfg.gridDimX, cfg.blockDimX, cfg.hStream, cfg.numAttrs, function.value, extra))
        return self.code


def _launch(code: int, attributes: int) -> gpu_launch.Launch:
    config = gpu_launch._Config(12, 1, 1, 256, 1, 1, 0, None, None, attributes)
    return gpu_launch.Launch(
        _Driver(code), ctypes.c_void_p(0x1234), config, gpu_launch.Arguments.pack([np.int32(1)]), None
    )


def test_a_prepared_launch_goes_to_the_stream_it_is_called_with():
    launch = _launch(0, 1)
    launch(0xAB)
    launch(0xCD)
    assert launch.driver.calls == [(12, 256, 0xAB, 1, 0x1234, None), (12, 256, 0xCD, 1, 0x1234, None)]


def test_a_failed_launch_raises_with_the_driver_code():
    with pytest.raises(ExecutorError, match="driver error 719"):
        _launch(719, 0)(0)


def test_residency_is_checked_for_the_block_size_of_each_plan(monkeypatch):
    """One interpreter entry serves 512- and 1024-thread blocks; a GPU holds twice as many of the smaller."""
    from types import SimpleNamespace

    from executor.gpu import build as gpu_build
    from executor.gpu import engine

    monkeypatch.setattr(gpu_build, "resident_blocks", lambda kernel, threads, device: 132 * 1024 // threads)
    comm = object.__new__(engine.InterpreterEngine)
    comm._kernels, comm._resident, comm.device = {}, {}, 0
    comm._module = SimpleNamespace(get_function=lambda name: SimpleNamespace(ptr=1))
    comm._launcher = SimpleNamespace(prepare=lambda function, grid, block, args, cluster: (grid, block))
    comm._cluster, comm._cc, comm._resident_clusters, comm.launch_clusters = 1, "90", {}, {}

    def ctx(blocks: int, threads: int):
        return SimpleNamespace(
            tables=SimpleNamespace(nthreadblocks=blocks, threads=threads, lamport_buffers=0), vector_bytes=16
        )

    assert comm._prepare(ctx(64, 1024), "bf16", (np.int32(0),)) == (64, 1024)
    assert comm._prepare(ctx(256, 512), "bf16", (np.int32(0),)) == (256, 512)
    with pytest.raises(ExecutorError, match="needs 256 thread blocks of 1024 threads at once but GPU 0 holds 132"):
        comm._prepare(ctx(256, 1024), "bf16", (np.int32(0),))
    assert comm.launch_clusters == {1: 2}  # the two launches prepared, neither in a cluster
