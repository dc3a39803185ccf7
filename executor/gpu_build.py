"""Build the interpreter kernel for the device's architecture and cache the cubin on disk.

nvcc builds it when present (one cubin per source hash and architecture, written atomically); otherwise
CuPy's NVRTC path compiles the same sources (CuPy keeps its own disk cache).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from executor.errors import ExecutorError

SOURCES = ("common.cuh", "semaphore.cuh", "packet.cuh", "reduce.cuh", "channel.cuh", "interpreter.cu")
FLAGS = ("-O3", "-std=c++17")
DTYPE_SUFFIX = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


def source_dir() -> Path:
    return Path(__file__).parent / "cuda"


TRACE_FLAGS = ("-DWEFT_TRACE",)  # the diagnostic build that times each block's phases (executor/gpu_trace.py)


def source_hash(arch: str, flags: tuple[str, ...] = FLAGS) -> str:
    h = hashlib.sha256(arch.encode() + " ".join(flags).encode())
    for name in SOURCES:
        h.update((source_dir() / name).read_bytes())
    return h.hexdigest()[:16]


BATCHED_THREADS = 256  # blocks of at most this many threads run the kernel that batches packet polls


def kernel_name(dtype: str, vector_bytes: int, threads: int = 1024) -> str:
    """The interpreter entry for a dtype, vector width and block size (interpreter.cu's WEFT_INTERPRETER list)."""
    batched = "_b256" if threads <= BATCHED_THREADS else ""
    return f"weft_interpret_{DTYPE_SUFFIX[dtype]}_v{vector_bytes}{batched}"


def cache_dir() -> Path:
    if os.environ.get("WEFT_KERNEL_CACHE"):
        return Path(os.environ["WEFT_KERNEL_CACHE"])
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("weft")) / "kernels"
    except ImportError:
        return Path.home() / ".cache" / "weft" / "kernels"


def nvcc_command(arch: str, output: Path, flags: tuple[str, ...] = FLAGS) -> list[str]:
    """The nvcc line that builds the interpreter cubin (also what the CPU compile test runs)."""
    return ["nvcc", "-cubin", f"-arch={arch}", *flags, "-o", str(output), str(source_dir() / "interpreter.cu")]


def build_cubin(arch: str, directory: Path | None = None, trace: bool = False) -> Path:
    """The cached cubin for ``arch`` (e.g. sm_90), building it with nvcc if needed; ``trace``: the timed build."""
    flags = FLAGS + TRACE_FLAGS if trace else FLAGS
    directory = directory or cache_dir()
    path = directory / f"interpreter-{arch}-{source_hash(arch, flags)}.cubin"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".cubin", dir=directory)
    os.close(fd)
    done = subprocess.run(nvcc_command(arch, Path(tmp), flags), capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise ExecutorError(f"executor/cuda/interpreter.cu: nvcc failed for {arch}: {first}")
    os.replace(tmp, path)
    return path


def load_module(compute_capability: str, trace: bool = False):
    """A cupy.RawModule holding every interpreter kernel for this compute capability (e.g. '90')."""
    import cupy

    arch = f"sm_{compute_capability}"
    if shutil.which("nvcc"):
        return cupy.RawModule(path=str(build_cubin(arch, trace=trace)))
    code = (source_dir() / "interpreter.cu").read_text()
    return cupy.RawModule(code=code, backend="nvrtc",
                          options=("-std=c++17", f"--gpu-architecture={arch}", f"-I{source_dir()}",
                                   *(TRACE_FLAGS if trace else ())))


def resident_blocks(kernel, threads: int, device: int) -> int:
    """How many thread blocks of ``threads`` threads of ``kernel`` the device holds at once.

    The interpreter's blocks wait on each other, so a plan whose thread blocks do not all fit at once could
    deadlock; the executor refuses such a launch instead.
    """
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    function = getattr(kernel, "kernel", kernel)  # a RawKernel wraps the driver function
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, threads, 0)
    return int(per_sm) * int(props["multiProcessorCount"])
