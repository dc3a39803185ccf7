"""Every rank of the test plans as a process on ONE GPU (tests/gpu/one_device.py): the executor's kernels against
numpy's collective, bit for bit, on small integers. It needs one GPU, so it runs where the NCCL-backed job cannot
(a single-GPU machine) and, with ``WEFT_GPU_NPROC=4``, checks the 4-rank plans without four GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import scenarios
from conftest import gpu_count, nproc

HERE = Path(__file__).parent
pytestmark = pytest.mark.gpu


def _one_device(tmp_path_factory, *options: str, plans: tuple[Path, ...] = (), wait_s: int = 180) -> dict:
    if gpu_count() < 1:
        pytest.skip("needs a CUDA GPU with torch and CuPy")
    out = tmp_path_factory.mktemp("one_device") / "one.json"
    subprocess.run(
        [sys.executable, str(HERE / "one_device.py"), str(out), *map(str, plans), "--nproc", str(nproc()), *options]
        + ["--wait", str(wait_s), "--timeout", "20"],
        timeout=wait_s + 30,
        check=False,
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    # it took 42 s at 2 ranks and 22 s at 4 on an H100: tight bounds, so that a stall cannot eat a GPU job's time
    return _one_device(tmp_path_factory, "--sizes", "1KB,64KB,1MB")


# the summing LL plans: at 4 ranks their reductions take more than two sources, which compiled LL128 lines poll
# together, line by line (channel.cuh, load_line_group)
SUMMING_LL = ("allreduce-direct-ll-", "allreduce-twoshot-ll-", "reducescatter-direct-ll-")


@pytest.fixture(scope="module")
def compiled_job(tmp_path_factory) -> dict:
    plans = tuple(p for p in sorted(scenarios.plans_dir(nproc()).glob("*.json")) if p.name.startswith(SUMMING_LL))
    return _one_device(tmp_path_factory, "--sizes", "64KB", "--compiled", plans=plans, wait_s=240)


@pytest.fixture(scope="module")
def clustered_job(tmp_path_factory) -> dict:
    return _one_device(tmp_path_factory, "--sizes", "64KB", "--cluster", "2", "--gemm-tail", wait_s=120)


def _hopper() -> bool:
    import torch

    return torch.cuda.get_device_capability(0)[0] >= 9


def test_launches_take_clusters_only_when_asked_and_the_outputs_stay_numpys(job, clustered_job):
    """The engine's ``cluster``: by default (1) no launch takes a cluster; with 2, on Hopper, launches of an even
    grid take clusters of 2 blocks, and every output is still numpy's, bit for bit, with an empty clustered launch
    after each (``gemm_tail``) too."""
    assert clustered_job["failed"] == [] and clustered_job["cases"] > 20
    assert all(set(c) == {"1"} for c in job["launch_clusters"].values())
    assert len(clustered_job["launch_clusters"]) == nproc()
    for clusters in clustered_job["launch_clusters"].values():
        assert set(clusters) <= {"1", "2"}
        if _hopper():
            assert clusters.get("2", 0) > 0


def test_every_rank_ran_to_the_end(job):
    assert job["exit_codes"] == [0] * nproc()
    assert len(job["ranks"]) == nproc() and job["cases"] > 50


def test_every_output_equals_numpy_bit_for_bit(job):
    assert job["failed"] == []


def test_lines_were_among_the_cases(job):
    """LL plans ran with their packets as LL128 lines too, not only as LL16 packets."""
    assert any(name.endswith("+ll128") for name in job["ranks"]["0"])


def test_compiled_kernels_equal_numpy_bit_for_bit_in_packets_and_lines(compiled_job):
    """The summing LL plans as kernels of their own, in LL16 packets and in LL128 lines, fp32 and bf16."""
    assert compiled_job["exit_codes"] == [0] * nproc() and compiled_job["failed"] == []
    names = set(compiled_job["ranks"]["0"])
    assert all(name.endswith("+compiled") for name in names)
    assert any(name.endswith("+ll128+compiled") for name in names) and len(names) >= 8
