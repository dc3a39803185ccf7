"""Plans compiled to kernels of their own: one rank's device tables (``executor.gpu.tables``) at one size, dtype and
variant become a CUDA kernel whose ops are compile-time constants (``source``), built through NVRTC and cached by
a key that hashes the generated code and the headers (``build``). ``InterpreterEngine(compiled=True)`` (or a call's
``compiled=True``) launches it on the interpreter's context, and runs the interpreter wherever it is refused.
"""

from __future__ import annotations

from typing import Any

from executor.gpu.compiled import source
from executor.gpu.compiled.source import CompiledSource
from executor.gpu.tables import DeviceTables


def source_for(
    tables: DeviceTables, dtype: str, vector: int, label: str, trace: bool, late_trigger: bool = False
) -> CompiledSource:
    """The kernel source for ``tables`` under the headers of this tree (its cache key); raises ExecutorError with
    the reason the generator refuses it. ``late_trigger``: see ``source.generate``."""
    from executor.gpu.compiled import build

    return source.generate(tables, dtype, vector, label, build.headers_hash(), trace, late_trigger)


def kernel_for(
    tables: DeviceTables,
    dtype: str,
    vector: int,
    label: str,
    compute_capability: str,
    trace: bool,
    late_trigger: bool = False,
) -> Any:
    """The compiled kernel for ``tables`` (a CuPy RawKernel); raises ExecutorError with the reason it is refused."""
    from executor.gpu.compiled import build

    generated = source_for(tables, dtype, vector, label, trace, late_trigger)
    return build.load_kernel(generated, compute_capability, trace)
