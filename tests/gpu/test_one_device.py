"""Every rank of the test plans as a process on ONE GPU (tests/gpu/one_device.py): the executor's kernels against
numpy's collective, bit for bit, on small integers. It needs one GPU, so it runs where the NCCL-backed job cannot
(a single-GPU machine) and, with ``WEFT_GPU_NPROC=4``, checks the 4-rank plans without four GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import gpu_count, nproc

HERE = Path(__file__).parent
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    if gpu_count() < 1:
        pytest.skip("needs a CUDA GPU with torch and CuPy")
    out = tmp_path_factory.mktemp("one_device") / "one.json"
    # it took 42 s at 2 ranks and 22 s at 4 on an H100: tight bounds, so that a stall cannot eat a GPU job's time
    subprocess.run(
        [
            sys.executable,
            str(HERE / "one_device.py"),
            str(out),
            "--nproc",
            str(nproc()),
            "--sizes",
            "1KB,64KB,1MB",
            "--wait",
            "180",
            "--timeout",
            "20",
        ],
        timeout=210,
        check=False,
    )
    return json.loads(out.read_text())


def test_every_rank_ran_to_the_end(job):
    assert job["exit_codes"] == [0] * nproc()
    assert len(job["ranks"]) == nproc() and job["cases"] > 50


def test_every_output_equals_numpy_bit_for_bit(job):
    assert job["failed"] == []


def test_lines_were_among_the_cases(job):
    """LL plans ran with their packets as LL128 lines too, not only as LL16 packets."""
    assert any(name.endswith("+ll128") for name in job["ranks"]["0"])
