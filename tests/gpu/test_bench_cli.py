"""``weft bench`` end to end on GPUs: NCCL, symmetric memory and weft timed in one job, every result checked.

With ``--ll128`` each LL plan is timed twice, with its LL16 packets and with LL128 lines (named PLAN+ll128), and
the row keeps both sets of times apart, as ``--record`` stores them. With ``--compiled`` each plan is timed
interpreted and as its own kernel (PLAN+compiled): weft's time is the faster that gave NCCL's result, and the row
keeps the interpreter's fastest apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scenarios
from conftest import gpu_count, nproc

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).parent.parent.parent


def _bench(tmp_path, plans: list[Path], *options: str, collective: str = "allreduce") -> tuple[dict, str]:
    out = tmp_path / f"bench_{collective}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("RANK", None)
    argv = ["bench", collective, "--nproc", str(nproc()), "--plans", *map(str, plans), *options, "-o", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", "from weft.cli import run; run()", *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text()), done.stdout


def test_bench_with_compiled_kernels_counts_the_faster_way_to_run_each_plan(tmp_path):
    n = nproc()
    if gpu_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs with torch and CuPy")
    names = ("allreduce-direct-ll-x1", "allreduce-twoshot-simple-x8")
    plans = [scenarios.plans_dir(n) / f"{name}.json" for name in names]
    options = ("--sizes", "64KB,1MB", "--compiled", "--samples", "3", "--calls", "5", "--timeout", "10")
    doc, _ = _bench(tmp_path, plans, *options)
    for row in doc["rows"]:
        assert row["wrong"] == row["interpreted_wrong"] == row["compiled_wrong"] == 0, row
        assert row["compiled_refused"] == {} and len(row["plans_compiled_us"]) == 2
        assert row["weft_us"] == min(row["interpreted_us"], row["compiled_us"])
        assert row["compiled"] == row["plan"].endswith("+compiled") == (row["compiled_us"] < row["interpreted_us"])
        assert not row["interpreted_plan"].endswith("+compiled")


def test_bench_times_ll_plans_with_and_without_lines(tmp_path):
    n = nproc()
    if gpu_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs with torch and CuPy")
    ll, simple = (
        scenarios.plans_dir(n) / name for name in ("allreduce-direct-ll-x1.json", "allreduce-twoshot-simple-x8.json")
    )
    options = ("--sizes", "64KB,1MB", "--ll128", "--samples", "3", "--calls", "5", "--timeout", "10")
    doc, stdout = _bench(tmp_path, [ll, simple], *options)
    assert doc["method"]["ll128"] is True and len(doc["rows"]) == 2
    assert "Williams design" in doc["method"]["order"]  # the implementations' order changes from round to round
    ll_name = json.loads(ll.read_text())["name"]
    for row in doc["rows"]:
        assert row["wrong"] == 0 and row["weft_us"] > 0 and row["nccl_us"] > 0
        timed = set(row["median_us"])
        assert {f"weft:{ll_name}", f"weft:{ll_name}+ll128"} <= timed
        assert len(row["plans_us"]) == 2 and len(row["plans_ll128_us"]) == 1  # Simple has no lines
        assert row["lines"] == row["plan"].endswith("+ll128")
        assert row["weft_us"] == min(v for k, v in row["median_us"].items() if k.startswith("weft:"))
    assert "# weft bench allreduce" in stdout


@pytest.mark.parametrize("collective", ["reducescatter", "allgather"])
def test_bench_times_symmetric_memory_beside_reduce_scatter_and_all_gather(tmp_path, collective):
    """torch symmetric memory's own reduce-scatter and all-gather run beside NCCL and weft, each result checked
    against NCCL's (an op a torch lacks, or that will not run in a graph, is named in ``peers_refused``)."""
    n = nproc()
    if gpu_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs with torch and CuPy")
    plans = [scenarios.plans_dir(n) / f"{collective}-direct-simple-x1.json"]
    options = ("--sizes", "64KB,1MB", "--samples", "3", "--calls", "5", "--timeout", "10")
    doc, _ = _bench(tmp_path, plans, *options, collective=collective)
    for row in doc["rows"]:
        assert row["wrong"] == 0 and row["weft_us"] > 0, row
        symm = {k: v for k, v in row["median_us"].items() if k.startswith("symm:")}
        assert symm, row["peers_refused"]
        assert row["symm_us"] == (min(symm.values()) if symm else None)
        assert all(row["peers_wrong"][k] == 0 for k in symm), row["peers_wrong"]
        assert row["best_peer_us"] == min(v for k, v in row["median_us"].items() if not k.startswith("weft:"))
