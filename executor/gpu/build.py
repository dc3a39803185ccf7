"""Build the interpreter kernel for the device's architecture and cache the cubin on disk.

nvcc builds it when present (one cubin per source hash and architecture, written atomically); otherwise
CuPy's NVRTC path compiles the same sources (CuPy keeps its own disk cache).

The cache is trusted only as far as it is checked: its folder is created private to the user (0700), and each
cubin has the SHA-256 of its bytes beside it (``<cubin>.sha256``), compared before the cubin is loaded. A cubin
whose hash is missing or differs is built again, never loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from executor.errors import ExecutorError
from weftcore.jsonfile import check_output

SOURCES = (
    "contract.cuh",  # generated from the tables (executor.gpu.contract)
    "common.cuh",
    "semaphore.cuh",
    "packet.cuh",
    "reduce.cuh",
    "lamport.cuh",
    "channel.cuh",
    "norm.cuh",
    "ops.cuh",
    "interpreter.cu",
)
FLAGS = ("-O3", "-std=c++17")
DTYPE_SUFFIX = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


def source_dir() -> Path:
    return Path(__file__).parent / "cuda"


TRACE_FLAGS = ("-DWEFT_TRACE",)  # the diagnostic build that times each block's phases (executor/gpu/trace.py)


def source_hash(arch: str, flags: tuple[str, ...] = FLAGS) -> str:
    h = hashlib.sha256(arch.encode() + " ".join(flags).encode())
    for name in SOURCES:
        h.update((source_dir() / name).read_bytes())
    return h.hexdigest()[:16]


BATCHED_THREADS = 256  # blocks of at most this many threads run the kernel that batches packet polls


def kernel_name(dtype: str, vector_bytes: int, threads: int = 1024, lamport: bool = False) -> str:
    """The interpreter entry for a dtype, vector width and block size (interpreter.cu's WEFT_INTERPRETER list);
    ``lamport``: its twin that runs Lamport plans (executor.gpu.lamport)."""
    batched = "_b256" if threads <= BATCHED_THREADS else ""
    return f"weft_interpret_{DTYPE_SUFFIX[dtype]}_v{vector_bytes}{batched}{'_lamport' if lamport else ''}"


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


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def private_directory(directory: Path) -> Path:
    """``directory``, created 0700 where missing; one another user can write to is refused (it could swap a
    cubin and its hash together)."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.stat()
    except OSError as e:
        raise ExecutorError(f"executor: kernel cache {directory}: cannot create: {e.strerror or e}") from None
    if info.st_mode & 0o022 or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        raise ExecutorError(
            f"executor: kernel cache {directory}: writable by other users or owned by another; "
            "use a private folder (chmod 700, or set WEFT_KERNEL_CACHE)"
        )
    return directory


def cached_cubin(path: Path) -> bytes | None:
    """The cubin at ``path`` if the hash stored beside it matches its bytes, else None (build it again)."""
    try:
        data = path.read_bytes()
        expected = path.with_name(path.name + ".sha256").read_text().strip()
    except OSError:
        return None
    return data if _digest(data) == expected else None


def write_private(directory: Path, path: Path, data: bytes | str) -> None:
    check_output(path, "executor: kernel cache", ExecutorError)  # a node planted in the cache is never replaced
    fd, tmp = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def build_cubin(arch: str, directory: Path | None = None, trace: bool = False) -> Path:
    """The cached cubin for ``arch`` (e.g. sm_90), building it with nvcc if needed; ``trace``: the timed build.
    A cached cubin is used only where its stored hash matches (``cached_cubin``)."""
    flags = FLAGS + TRACE_FLAGS if trace else FLAGS
    directory = private_directory(directory or cache_dir())
    path = directory / f"interpreter-{arch}-{source_hash(arch, flags)}.cubin"
    if cached_cubin(path) is not None:
        return path
    fd, tmp = tempfile.mkstemp(suffix=".cubin", dir=directory)
    os.close(fd)
    done = subprocess.run(nvcc_command(arch, Path(tmp), flags), capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise ExecutorError(f"executor/gpu/cuda/interpreter.cu: nvcc failed for {arch}: {first}")
    data = Path(tmp).read_bytes()
    write_private(directory, path.with_name(path.name + ".sha256"), _digest(data) + "\n")
    check_output(path, "executor: kernel cache", ExecutorError)
    os.replace(tmp, path)
    return path


def load_module(compute_capability: str, trace: bool = False):
    """A cupy.RawModule holding every interpreter kernel for this compute capability (e.g. '90')."""
    import cupy

    arch = f"sm_{compute_capability}"
    if shutil.which("nvcc"):
        path = build_cubin(arch, trace=trace)
        image = cached_cubin(path)  # checked again as it is read: what is loaded is exactly what was hashed
        if image is None:
            raise ExecutorError(f"executor: kernel cache {path}: the cubin does not match its stored hash")
        return module_from_image(image, path, kernel_name("fp32", 16))
    code = (source_dir() / "interpreter.cu").read_text()
    return cupy.RawModule(
        code=code,
        backend="nvrtc",
        options=("-std=c++17", f"--gpu-architecture={arch}", f"-I{source_dir()}", *(TRACE_FLAGS if trace else ())),
    )


def module_from_image(image: bytes, path: Path, entry: str):
    """A RawModule from the checked bytes (written to a private temporary file: CuPy loads cubins by path), loaded
    now through one of its entries, while the checked copy exists."""
    import cupy

    with tempfile.TemporaryDirectory(prefix="weft-cubin-") as tmp:
        copy = Path(tmp) / path.name
        copy.write_bytes(image)
        module = cupy.RawModule(path=str(copy))
        module.get_function(entry)
    return module


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
