"""bench/gpu_shards.py, the GPU gate's file-by-file run (SHARDS, PART): its queue, its parts and its reading of
pytest's summary line, and a whole run on a suite of three files, one of them failing, on two "groups"."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

from _bench import bench_script

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "bench" / "gpu_shards.py"


def test_the_doctests_hold():
    assert doctest.testmod(bench_script("gpu_shards")).failed == 0


def test_the_parts_together_are_every_file_once_and_the_heavy_files_lead():
    shards = bench_script("gpu_shards")
    files = [f"tests/gpu/test_{i}.py" for i in range(7)] + ["tests/gpu/test_fused_norm.py"]
    queue = shards.ordered(files, {})
    assert queue[0] == "tests/gpu/test_fused_norm.py"
    parts = [shards.part(queue, f"{k}/3") for k in (1, 2, 3)]
    assert sorted(f for p in parts for f in p) == sorted(files)


def test_a_run_over_two_groups_reports_each_file_and_is_not_whole_when_one_fails(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text("")
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: a GPU test\n")
    body = (
        "import os, pytest\n\n@pytest.mark.gpu\ndef test_sees_its_group():\n"
        "    assert os.environ['CUDA_VISIBLE_DEVICES'] in ('0,1', '2,3')\n"
    )
    (suite / "test_a.py").write_text(body)
    (suite / "test_b.py").write_text(body + "\n@pytest.mark.gpu\ndef test_fails():\n    assert False\n")
    (suite / "test_c.py").write_text(body + "\ndef test_not_gpu():\n    pass\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--groups", "0,1", "2,3", "--nproc", "2", "--test-s", "0", "--out", str(out)],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads((out / "gpu_shards_x2.json").read_text())
    by_file = {row["file"]: row for row in doc["files"]}
    assert sorted(by_file) == ["test_a.py", "test_b.py", "test_c.py"]
    assert by_file["test_b.py"]["rc"] == 1 and by_file["test_b.py"]["counts"] == {"passed": 1, "failed": 1}
    assert by_file["test_c.py"]["counts"] == {"passed": 1, "deselected": 1}
    assert doc["total"]["passed"] == 3 and doc["total"]["failed"] == 1 and doc["whole"] is False
    assert {row["group"] for row in doc["files"]} <= {"0,1", "2,3"}
    assert "NOT whole" in done.stdout

    # the next call: test_b mended, --resume runs it alone and the summary covers all three files
    (suite / "test_b.py").write_text(body)
    (suite / "test_a.py").write_text(body + "\n@pytest.mark.gpu\ndef test_ran_again():\n    assert False\n")
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--groups", "0,1", "--nproc", "2", "--test-s", "0", "--out", str(out / "2")]
        + ["--resume", str(out / "gpu_shards_x2.json")],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    doc = json.loads((out / "2" / "gpu_shards_x2.json").read_text())
    by_file = {row["file"]: row for row in doc["files"]}
    assert sorted(by_file) == ["test_a.py", "test_b.py", "test_c.py"] and doc["whole"] is True
    assert [f for f, row in by_file.items() if not row.get("resumed")] == ["test_b.py"]


def test_apart_files_run_beside_the_groups_without_a_gpu_and_a_resume_knows_them(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: a GPU test\n")
    (suite / "test_gpu.py").write_text(
        "import os, pytest\n\n@pytest.mark.gpu\ndef test_on_its_group():\n"
        "    assert os.environ['CUDA_VISIBLE_DEVICES'] == '0,1'\n"
    )
    (suite / "test_nvcc.py").write_text(
        "import os, pytest\n\n@pytest.mark.gpu\ndef test_sees_no_gpu():\n"
        "    assert os.environ['CUDA_VISIBLE_DEVICES'] == ''\n"
    )
    command = [sys.executable, str(SCRIPT), "--groups", "0,1", "--test-s", "0", "--apart", "test_nvcc.py"]
    out = ["--out", str(tmp_path / "1")]
    done = subprocess.run(command + out, cwd=suite, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "1" / "gpu_shards_x2.json").read_text())
    assert {r["file"]: r["group"] for r in doc["files"]} == {"test_gpu.py": "0,1", "test_nvcc.py": "apart"}
    assert doc["whole"] is True and (tmp_path / "1" / "gpu_tests_x2_apart.txt").is_file()

    # resumed without --apart (a call with no nvcc beside it): the apart file passed, so it is not run again
    (suite / "test_nvcc.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_not_again():\n    assert False\n")
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--groups", "0,1", "--test-s", "0", "--out", str(tmp_path / "2")]
        + ["--resume", str(tmp_path / "1" / "gpu_shards_x2.json")],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    rows = json.loads((tmp_path / "2" / "gpu_shards_x2.json").read_text())["files"]
    assert all(r.get("resumed") for r in rows) and len(rows) == 2


def test_a_file_past_the_limit_is_cut_with_the_processes_it_started(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: a GPU test\n")
    pid_file = tmp_path / "child.pid"
    (suite / "test_slow.py").write_text(
        "import subprocess, time, pytest\n\n@pytest.mark.gpu\ndef test_waits_on_a_rank():\n"
        f"    child = subprocess.Popen(['sleep', '120'])\n    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(120)\n"
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--groups", "0", "--limit-s", "12", "--test-s", "0", "--out", str(out)],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    (row,) = json.loads((out / "gpu_shards_x2.json").read_text())["files"]
    assert row["rc"] == "cut" and row["counts"] == {} and row["seconds"] < 30
    child = int(pid_file.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_the_files_the_gate_leaves_out_without_solvers_hold_no_gpu_test():
    """bench/gpu_gate.sh leaves out the test files that import z3 or ortools as they are collected, where the device
    image lacks them; leaving one out that held a GPU test would drop that test from the gate unseen."""
    import re

    gate = (ROOT / "bench" / "gpu_gate.sh").read_text()
    apart = sorted(
        set(re.findall(r"--ignore=(tests/test_\w+\.py)", gate))
        - {"tests/test_cuda_compile.py", "tests/test_compiled.py"}
    )
    assert {"tests/test_smt.py", "tests/test_milp.py"} <= set(apart)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider", *apart],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 5, done.stdout[-2000:]  # every test deselected: none is a GPU test
    assert "deselected" in done.stdout
