"""Kernel launches through the driver's cuLaunchKernelEx, with programmatic dependent launch (PDL).

With PDL a launch may start while the kernel before it on the stream is still running: the interpreter loads its
static tables, then waits (``griddepcontrol.wait``) until that kernel has finished and its memory is visible, and
it lets the kernel after it start early (``griddepcontrol.launch_dependents``). Back-to-back collectives then
overlap one launch's start with the previous one's end. Inside a CUDA graph capture the launch becomes a kernel
node with a programmatic edge. Without the attribute the same kernel runs as an ordinary launch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.errors import ExecutorError

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: (x, y, z) blocks a cluster


class _Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def _scalar(value: Any) -> ctypes._SimpleCData:
    """One kernel argument as the C value the kernel reads: device arrays as their address."""
    if isinstance(value, np.int32):
        return ctypes.c_int32(int(value))
    if isinstance(value, np.int64):
        return ctypes.c_int64(int(value))
    if isinstance(value, np.uint64):
        return ctypes.c_uint64(int(value))
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):  # a CuPy array
        return ctypes.c_uint64(int(data.ptr))
    raise ExecutorError(f"executor: cannot pass a {type(value).__name__} to the interpreter kernel")


@dataclass
class Arguments:
    """A kernel's arguments packed once for cuLaunchKernelEx (the values and the pointer array to them)."""

    values: list
    pointers: Any

    @classmethod
    def pack(cls, args: Sequence[Any]) -> Arguments:
        values = [_scalar(a) for a in args]
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        return cls(values, pointers)


@dataclass
class Launch:
    """One kernel launch prepared once (function, grid, block, attributes, packed arguments); call it with a
    stream handle to launch."""

    driver: Any
    function: ctypes.c_void_p
    config: _Config
    args: Arguments
    attribute: Any  # kept alive: config points at it

    def __call__(self, stream: int) -> None:
        self.config.hStream = stream
        code = self.driver.cuLaunchKernelEx(ctypes.byref(self.config), self.function, self.args.pointers, None)
        if code != 0:
            raise ExecutorError(f"executor: cuLaunchKernelEx failed with CUDA driver error {code}")


class Launcher:
    """Prepares launches of CUfunctions with or without PDL; one per process (it holds the driver library)."""

    def __init__(self, programmatic: bool = True) -> None:
        self.programmatic = programmatic
        try:
            self._driver = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise ExecutorError(f"executor: cannot load the CUDA driver (libcuda.so.1): {e}") from e
        self._driver.cuLaunchKernelEx.restype = ctypes.c_int
        self._driver.cuOccupancyMaxActiveClusters.restype = ctypes.c_int

    def resident_clusters(self, function: int, block: int, cluster: int) -> int:
        """How many clusters of ``cluster`` blocks of ``block`` threads of ``function`` the device holds at once
        (the driver's cuOccupancyMaxActiveClusters; a cluster's blocks must share one GPC, so this can be fewer
        than the resident blocks over ``cluster``); 0 where the driver refuses the question."""
        config, _attributes = launch_config(cluster, block, False, cluster)
        count = ctypes.c_int(0)
        code = self._driver.cuOccupancyMaxActiveClusters(
            ctypes.byref(count), ctypes.c_void_p(function), ctypes.byref(config)
        )
        return count.value if code == 0 else 0

    def prepare(self, function: int, grid: int, block: int, args: Arguments, cluster: int = 1) -> Launch:
        """``cluster``: blocks a thread-block cluster (1: no cluster attribute; else it must divide ``grid``)."""
        config, attributes = launch_config(grid, block, self.programmatic, cluster)
        return Launch(self._driver, ctypes.c_void_p(function), config, args, attributes)


def launch_config(grid: int, block: int, programmatic: bool, cluster: int = 1) -> tuple[_Config, Any]:
    """cuLaunchKernelEx's config for a 1-D launch and the attributes it points at (keep both alive): PDL where
    ``programmatic``, clusters of ``cluster`` blocks where above 1."""
    if cluster < 1 or grid % cluster:
        raise ExecutorError(f"executor: a cluster of {cluster} blocks does not divide a grid of {grid}")
    attributes = (_Attribute * 2)()
    count = 0
    if programmatic:
        attributes[count].id = PROGRAMMATIC_STREAM_SERIALIZATION
        attributes[count].value[0] = 1  # programmaticStreamSerializationAllowed
        count += 1
    if cluster > 1:
        attributes[count].id = CLUSTER_DIMENSION
        ctypes.memmove(attributes[count].value, (ctypes.c_uint * 3)(cluster, 1, 1), 12)
        count += 1
    return _Config(grid, 1, 1, block, 1, 1, 0, None, attributes if count else None, count), attributes


def cluster_of(config: _Config) -> int:
    """Blocks a thread-block cluster in a launch of ``config`` (1: no cluster attribute)."""
    for i in range(config.numAttrs):
        if config.attrs[i].id == CLUSTER_DIMENSION:
            return int.from_bytes(bytes(config.attrs[i].value[:4]), "little")
    return 1


TAIL_SOURCE = r"""
extern "C" __global__ void weft_cluster_tail() {}
"""
TAIL_CLUSTER = 8  # one cluster of 8 blocks (the portable largest)


def cluster_tail(cupy: Any) -> Launch:
    """An empty kernel in one thread-block cluster, launched without PDL: the engine's ``gemm_tail``, launched
    after each collective so that a clustered GEMM after it runs as fast as after an empty clustered launch."""
    kernel = cupy.RawModule(code=TAIL_SOURCE).get_function("weft_cluster_tail")
    function = getattr(kernel, "kernel", kernel).ptr
    return Launcher(programmatic=False).prepare(function, TAIL_CLUSTER, 32, Arguments.pack([]), TAIL_CLUSTER)
