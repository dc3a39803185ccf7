"""GPU tests run one worker job (one process per GPU) for the whole session; each test reads its results.

They skip themselves without CUDA GPUs, torch or CuPy. ``WEFT_GPU_NPROC`` picks the rank count (default 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weftcore.rendezvous import rank_env, rendezvous_port

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


SLOW_S = 5.0


@pytest.hookimpl(tryfirst=True)  # before -m deselects: pytest's own hook reads the marks this one adds
def pytest_collection_modifyitems(config, items):
    """Every test in this folder is a ``gpu`` test, so that ``pytest -m gpu`` on the GPU machines runs it. Some need
    torch but no GPU (gloo on the CPU, one CPU rank): CI has no torch and skips them, and unmarked, the GPU
    machines' ``-m gpu`` left them out too, so they ran nowhere (three failed unseen for a session)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing GPU test's error, and any phase of a test that took over SLOW_S, written as the test ends: a device
    job cut off by its time limit never reaches pytest's summary (nor --durations), and its log had kept only the
    word FAILED."""
    outcome = yield
    report = outcome.get_result()
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and report.duration > SLOW_S:
        terminal.write_line(f"\n--- {item.nodeid}: {report.when} took {report.duration:.1f} s")
    if report.failed and terminal is not None:
        lines = report.longreprtext.splitlines()
        terminal.write_line(f"\n--- {item.nodeid} failed ({report.when}):")
        for line in lines[-25:]:
            terminal.write_line(f"    {line[:400]}")


def gpu_count() -> int:
    try:
        import cupy  # noqa: F401
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def nproc() -> int:
    return int(os.environ.get("WEFT_GPU_NPROC", "2"))


JOB_S = 600  # one job's whole time: past it every rank is killed
ROOT = HERE.parent.parent


def job_env(rank: int, n: int, port: str, local_rank: int | None = None) -> dict[str, str]:
    """A test job's rank environment: this process's, the rank's rendezvous (``weftcore.rendezvous.rank_env``,
    multicast off) and the tree first on PYTHONPATH."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, **rank_env(rank, n, port, local_rank), "PYTHONPATH": path}


def wait_all(procs: list[subprocess.Popen], limit_s: float) -> list[int | None]:
    """Every rank's exit code. A rank that fails ends the job: the others would wait for it in a collective until
    NCCL's own timeout, so they are killed (their code is then the signal's, negative). Past ``limit_s`` all are."""
    deadline = time.monotonic() + limit_s
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline or any(p.returncode not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    return [p.wait() for p in procs]


@pytest.fixture(scope="session")
def gpu_results(tmp_path_factory) -> list[dict]:
    """Every rank's results from one run of tests/gpu/worker.py."""
    n = nproc()
    if gpu_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs with torch and CuPy")
    out = tmp_path_factory.mktemp("gpu")
    port = str(rendezvous_port())
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "worker.py"), str(out)], env=job_env(rank, n, port))
        for rank in range(n)
    ]
    codes = wait_all(procs, 900)
    assert codes == [0] * n, f"GPU worker exit codes {codes}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
