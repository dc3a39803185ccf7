"""Build a generated kernel (``compiled.source``) through NVRTC and keep its cubin in the kernel cache.

The cache is the interpreter's (``executor.gpu.build``): a private folder, each cubin written atomically with the
SHA-256 of its bytes beside it and checked before it is loaded. A cubin's name carries the source's key, which
hashes the generated code (every op of one plan's rank, size, dtype and variant), the CUDA headers it includes and
the generator's version, so a change to any of them builds anew and an old cubin is never loaded for new code.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from executor.errors import ExecutorError
from executor.gpu import build as gpu_build
from executor.gpu.compiled.source import CompiledSource

HEADERS = (*(s for s in gpu_build.SOURCES if s.endswith(".cuh")), "compiled.cuh")


def headers_hash() -> str:
    """The hash of every CUDA header a compiled kernel includes (part of its cache key)."""
    h = hashlib.sha256()
    for name in HEADERS:
        h.update((gpu_build.source_dir() / name).read_bytes())
    return h.hexdigest()[:16]


def nvrtc_options(arch: str, trace: bool = False) -> tuple[str, ...]:
    """The options of build.py's NVRTC branch (its include path), for one architecture."""
    return ("-std=c++17", f"--gpu-architecture={arch}", f"-I{gpu_build.source_dir()}") + (
        gpu_build.TRACE_FLAGS if trace else ()
    )


def nvcc_command(source: Path, arch: str, output: Path, trace: bool = False) -> list[str]:
    """The nvcc line for the same source (what the CPU compile test runs where NVRTC is not at hand)."""
    flags = gpu_build.FLAGS + (gpu_build.TRACE_FLAGS if trace else ())
    return ["nvcc", "-cubin", f"-arch={arch}", *flags, f"-I{gpu_build.source_dir()}", "-o", str(output), str(source)]


def nvrtc_cubin(source: CompiledSource, arch: str, trace: bool = False) -> bytes:
    """The cubin NVRTC (CuPy's binding) builds from ``source`` for ``arch`` (e.g. sm_90)."""
    from cupy.cuda import nvrtc

    if not hasattr(nvrtc, "getCUBIN"):  # CuPy's binding before CUDA 11.1's cubin output
        raise ExecutorError(f"executor: compiled kernel {source.entry}: this CuPy's NVRTC binding returns no cubin")
    program = nvrtc.createProgram(source.code, f"{source.entry}.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, list(nvrtc_options(arch, trace)))
        except getattr(nvrtc, "NVRTCError", RuntimeError) as e:
            log = nvrtc.getProgramLog(program).strip().splitlines()
            first = next((line for line in log if "error" in line), log[0] if log else str(e))
            raise ExecutorError(f"executor: compiled kernel {source.entry}: NVRTC failed for {arch}: {first}") from None
        return bytes(nvrtc.getCUBIN(program))
    finally:
        nvrtc.destroyProgram(program)


def cached_cubin_path(source: CompiledSource, arch: str, trace: bool = False, directory: Path | None = None) -> Path:
    """The cubin of ``source`` for ``arch`` in the kernel cache, compiled through NVRTC where missing or not matching
    its stored hash."""
    directory = gpu_build.private_directory(directory or gpu_build.cache_dir())
    path = directory / f"{source.entry}-{arch}{'-trace' if trace else ''}.cubin"
    if gpu_build.cached_cubin(path) is not None:
        return path
    image = nvrtc_cubin(source, arch, trace)
    store_cubin(directory, path, image)
    return path


def prebuild(
    sources: Sequence[CompiledSource],
    arch: str,
    threads: int | None = None,
    trace: bool = False,
    directory: Path | None = None,
) -> dict[str, str]:
    """Builds the cubins of ``sources`` that the kernel cache lacks, ``threads`` NVRTC builds side by side (default:
    one a CPU; NVRTC lets go of the GIL while it compiles: 2.1x on 2 cores), so that ``load_kernel`` finds them built.
    Returns {entry: why} for the sources NVRTC refused; the others are in the cache."""
    unique = list({s.entry: s for s in sources}.values())  # plans with the same ops share one kernel

    def one(source: CompiledSource) -> str:
        try:
            cached_cubin_path(source, arch, trace, directory)
        except ExecutorError as e:
            return str(e)
        return ""

    if not unique:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(threads or os.cpu_count() or 1, len(unique)))) as pool:
        whys = list(pool.map(one, unique))
    return {s.entry: why for s, why in zip(unique, whys, strict=True) if why}


def store_cubin(directory: Path, path: Path, image: bytes) -> None:
    """Write ``image`` at ``path`` with its hash beside it, each atomically (temporary file, then rename)."""
    gpu_build.write_private(directory, path.with_name(path.name + ".sha256"), hashlib.sha256(image).hexdigest() + "\n")
    gpu_build.write_private(directory, path, image)


def load_kernel(source: CompiledSource, compute_capability: str, trace: bool = False):
    """The compiled kernel's driver function (a cupy RawKernel) for this compute capability (e.g. '90')."""
    path = cached_cubin_path(source, f"sm_{compute_capability}", trace)
    image = gpu_build.cached_cubin(path)  # checked again as it is read: what is loaded is what was hashed
    if image is None:
        raise ExecutorError(f"executor: kernel cache {path}: the cubin does not match its stored hash")
    return gpu_build.module_from_image(image, path, source.entry).get_function(source.entry)
