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

    def prepare(self, function: int, grid: int, block: int, args: Arguments) -> Launch:
        attribute = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        attribute.value[0] = 1  # programmaticStreamSerializationAllowed
        config = _Config(
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            None,
            ctypes.pointer(attribute) if self.programmatic else None,
            1 if self.programmatic else 0,
        )
        return Launch(self._driver, ctypes.c_void_p(function), config, args, attribute)
