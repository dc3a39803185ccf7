"""Every CUDA source of the GPU executor compiles for sm_90, the Lamport kernels with the rest (compile only; skipped
where nvcc is absent)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from executor.gpu import build

# compiling for sm_90 is part of the GPU toolchain: nvcc comes with GPU machines, not with CPU CI
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,  # nvcc builds of the interpreter: about a minute on 2 cores
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs a GPU machine: nvcc is not installed"),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


def test_interpreter_builds_every_dtype_and_width_for_sm90(cache):
    image = build.build_cubin("sm_90", cache).read_bytes()
    for dtype in ("fp32", "fp16", "bf16"):
        for width in (16, 8, 4):
            for threads in (1024, 512, 256, 64):
                assert build.kernel_name(dtype, width, threads).encode() in image
                assert build.kernel_name(dtype, width, threads, lamport=True).encode() in image  # the Lamport twins
    assert build.kernel_name("bf16", 16, 256) != build.kernel_name("bf16", 16, 512)


def test_the_1024_thread_kernels_keep_everything_in_registers(tmp_path):
    """Large transfers run these: a spill would put local-memory traffic in the copy loop."""
    done = subprocess.run(
        [*build.nvcc_command("sm_90", tmp_path / "i.cubin"), "--resource-usage"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = done.stdout + done.stderr
    for dtype in ("fp32", "fp16", "bf16"):
        name = build.kernel_name(dtype, 16, 1024)
        section = report.split(f"'{name}'")[1].split("Compiling entry")[0]
        assert "0 bytes spill stores" in section, section


def test_the_interpreter_builds_for_gpus_without_programmatic_launch(cache):
    """A100 (sm_80) has no griddepcontrol: the kernel leaves it out there and launches run without PDL."""
    image = build.build_cubin("sm_80", cache).read_bytes()
    assert build.kernel_name("bf16", 16, 1024).encode() in image


def test_the_timed_build_is_a_separate_cubin_with_every_entry(cache):
    timed = build.build_cubin("sm_90", cache, trace=True)
    assert timed != build.build_cubin("sm_90", cache)
    assert build.kernel_name("fp16", 8, 256).encode() in timed.read_bytes()


def test_cached_cubin_is_reused(cache):
    first = build.build_cubin("sm_90", cache)
    stamp = first.stat().st_mtime_ns
    assert build.build_cubin("sm_90", cache) == first and first.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("header", [*(s for s in build.SOURCES if s.endswith(".cuh")), "compiled.cuh"])
def test_each_header_compiles_on_its_own(tmp_path, header):
    unit = tmp_path / "unit.cu"
    unit.write_text(f'#include "{header}"\n')
    done = subprocess.run(
        [
            "nvcc",
            "-c",
            "-arch=sm_90",
            "-std=c++17",
            f"-I{build.source_dir()}",
            "-o",
            str(tmp_path / "unit.o"),
            str(unit),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_the_expert_exchange_builds_every_entry_without_cuda_headers(tmp_path):
    """executor/gpu/cuda/experts.cu: NVRTC builds it at run time with no include path; nvcc checks the same text."""
    from executor.gpu.experts import SOURCE

    source = build.source_dir() / SOURCE
    assert "#include" not in source.read_text()
    cubin = tmp_path / "experts.cubin"
    done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", *build.FLAGS, "-o", str(cubin), str(source)], text=True)
    assert done.returncode == 0
    image = cubin.read_bytes()
    for entry in ("weft_experts_dispatch", *(f"weft_experts_combine_{d}" for d in ("bf16", "fp16", "fp32"))):
        assert entry.encode() in image
