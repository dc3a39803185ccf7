"""CUDA IPC for buffers that may be sub-allocations (torch's caching allocator, CuPy's pool).

A handle always names a whole allocation, so a buffer is exported as (handle of its allocation's base,
offset from that base) and opened as the peer's mapping of the base plus the offset.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from executor.errors import ExecutorError

LAZY_ENABLE_PEER_ACCESS = 1


@dataclass(frozen=True)
class SharedBuffer:
    """What a peer needs to map one buffer: the allocation's IPC handle and the buffer's offset in it."""

    handle: bytes
    offset: int


def _libcuda() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise ExecutorError(f"executor: the CUDA driver library is not available ({e})") from None


def allocation_base(pointer: int) -> int:
    """The base address of the allocation holding ``pointer`` (cuMemGetAddressRange)."""
    lib = _libcuda()
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    fn = lib.cuMemGetAddressRange_v2
    fn.argtypes = (ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64)
    status = fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
    if status != 0:
        raise ExecutorError(
            f"executor: cuMemGetAddressRange failed for address {pointer:#x} (CUresult {status}); "
            "is the buffer CUDA device memory?"
        )
    return base.value


def export(pointer: int) -> SharedBuffer:
    import cupy

    base = allocation_base(pointer)
    return SharedBuffer(bytes(cupy.cuda.runtime.ipcGetMemHandle(base)), pointer - base)


@dataclass
class PeerMappings:
    """Opened peer allocations, by handle: CUDA refuses to open one allocation twice in a process."""

    opened: dict[bytes, int] = field(default_factory=dict)

    def open(self, shared: SharedBuffer) -> int:
        import cupy

        if shared.handle not in self.opened:
            self.opened[shared.handle] = cupy.cuda.runtime.ipcOpenMemHandle(shared.handle, LAZY_ENABLE_PEER_ACCESS)
        return self.opened[shared.handle] + shared.offset

    def close(self) -> None:
        import cupy

        for pointer in self.opened.values():
            cupy.cuda.runtime.ipcCloseMemHandle(pointer)
        self.opened.clear()
