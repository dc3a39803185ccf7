"""A CPU test that skips for any reason but needing a GPU fails the suite (tests/skip_policy.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

TESTS = """
import pytest

def test_cannot_exist():
    pytest.skip("twoshot does not exist for scatter on dgx2")

@pytest.mark.skipif(True, reason="nvcc is not installed")
def test_tool_missing():
    pass

def test_needs_gpu():
    pytest.skip("needs a GPU: 2 CUDA GPUs with torch and CuPy")

@pytest.mark.gpu
def test_gpu_marked():
    pytest.skip("no committed registry for 3 ranks")
"""


def test_only_needing_a_gpu_excuses_a_skip(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\nfrom skip_policy import pytest_runtest_makereport  # noqa\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs GPUs\n")
    (tmp_path / "test_cases.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert "1 failed, 2 skipped, 1 error" in out  # a skipif mark skips in setup: there it is an error
    assert "FAILED test_cases.py::test_cannot_exist" in out and "ERROR test_cases.py::test_tool_missing" in out
    assert "twoshot does not exist for scatter on dgx2" in out
