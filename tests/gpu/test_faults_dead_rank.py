"""A rank that dies makes the others fail with a clear error (PeerLost naming it), not hang.

Each test starts its own two rank processes, running this file as a script (a TCPStore on rank 0, no NCCL):
    python tests/gpu/test_faults_dead_rank.py SCENARIO VICTIM RESULTS_DIR
Both ranks build a InterpreterEngine with a 3 s timeout. In "kernel" both run allreduce-direct-simple-x1 correctly,
then the victim (rank 1, or rank 0, which hosts the TCPStore) exits with os._exit(3) and the survivor runs the
plan again on the same buffers: its kernel's wait times out and the error names the victim. In "bootstrap" rank 1
exits before the first execution, so rank 0's context creation (the IPC handle exchange) fails. Every rank
writes RESULTS_DIR/rank<r>.json; the victim writes before it exits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weftcore.rendezvous import rendezvous_port

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent
PLAN = HERE / "plans" / "allreduce-direct-simple-x1.json"
TIMEOUT_S = 3.0
ELEMENTS = 1 << 16
VICTIM_EXIT = 3


# ---------------------------------------------------------------- the rank processes


def _input(rank: int, device=None):
    import torch

    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(ELEMENTS, generator=g, dtype=torch.float32).to(device or "cpu")


def _meet(store, rank: int, victim: int) -> None:
    """Both ranks get here; the victim leaves only after the survivor has left (the Store may die with it)."""
    from datetime import timedelta

    store.set(f"test/here/{rank}", "1")
    store.wait([f"test/here/{1 - rank}"], timedelta(seconds=120))
    if rank == victim:
        store.wait(["test/survivor-left"], timedelta(seconds=120))
        time.sleep(0.5)  # the survivor is now waiting on this rank: in its kernel, or in its context's exchange
    else:
        store.set("test/survivor-left", "1")


def _survive(comm, plan, x) -> dict:
    """Execute again after the victim died; what was raised, and how long it took."""
    from executor.errors import ExecutorTimeout, PeerLost

    start = time.monotonic()
    try:
        comm.execute(plan, x)
        comm.synchronize()
        raised = None
    except ExecutorTimeout as e:
        raised = {
            "type": type(e).__name__,
            "message": str(e),
            "rank": e.rank,
            "threadblock": e.threadblock,
            "op": e.op,
            "lost": list(e.lost) if isinstance(e, PeerLost) else None,
        }
    return {"raised": raised, "elapsed_s": time.monotonic() - start}


def rank_main(scenario: str, victim: int, out: Path) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from executor.gpu.engine import InterpreterEngine
    from schedules.plan.io import load_plan

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0, timedelta(seconds=120))
    comm = InterpreterEngine(rank, world, store, timeout_s=TIMEOUT_S)
    plan = load_plan(PLAN)
    x = _input(rank, "cuda")
    result: dict = {"pid": os.getpid(), "host": socket.gethostname()}
    if scenario == "kernel":
        out_tensor = comm.execute(plan, x)
        comm.synchronize()
        expected = sum(_input(r) for r in range(world))
        result["first_ok"] = bool(torch.allclose(out_tensor.cpu(), expected, rtol=1e-5, atol=1e-5))
    _meet(store, rank, victim)
    if rank == victim:
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        os._exit(VICTIM_EXIT)
    result.update(_survive(comm, plan, x))
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # the victim's store or mappings may be gone: skip teardown


# ---------------------------------------------------------------- the tests


def _run_ranks(scenario: str, victim: int, out: Path) -> tuple[list[int], list[dict]]:
    from conftest import gpu_count, job_env

    if gpu_count() < 2:
        pytest.skip("needs 2 CUDA GPUs with torch and CuPy")
    port = str(rendezvous_port())
    procs = []
    for rank in range(2):
        env = job_env(rank, 2, port)
        procs.append(subprocess.Popen([sys.executable, __file__, scenario, str(victim), str(out)], env=env))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:  # no hang: a rank still there after its bound is killed, and the test fails
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert all(p.poll() is not None for p in procs)
    results = [json.loads(f.read_text()) if (f := out / f"rank{r}.json").exists() else {} for r in range(2)]
    return codes, results


@pytest.mark.parametrize("victim", [1, 0], ids=["peer-dies", "store-host-dies"])
def test_a_kernel_waiting_on_a_dead_rank_raises_peer_lost_naming_it(tmp_path, victim):
    codes, results = _run_ranks("kernel", victim, tmp_path)
    survivor = 1 - victim
    assert codes[victim] == VICTIM_EXIT and codes[survivor] == 0, f"exit codes {codes}; results {results}"
    assert all(r.get("first_ok") for r in results), results
    dead, r = results[victim], results[survivor]
    assert r["raised"] and r["raised"]["type"] == "PeerLost", r
    assert r["raised"]["message"].startswith(
        f"executor: rank {victim} (pid {dead['pid']} on host {dead['host']}) exited while rank {survivor} waited at "
    ), r
    assert r["raised"]["lost"] == [victim] and r["raised"]["rank"] == survivor
    assert r["elapsed_s"] < TIMEOUT_S + 5, r


def test_a_rank_that_dies_before_the_handle_exchange_fails_context_creation(tmp_path):
    codes, results = _run_ranks("bootstrap", 1, tmp_path)
    assert codes == [0, VICTIM_EXIT], f"exit codes {codes}; results {results}"
    dead, r = results[1], results[0]
    assert r["raised"] and r["raised"]["type"] == "PeerLost", r
    assert r["raised"]["message"].startswith(
        f"executor: rank 1 (pid {dead['pid']} on host {dead['host']}) exited while rank 0 waited at bootstrap exchange "
    ), r
    assert r["raised"]["lost"] == [1] and (r["raised"]["threadblock"], r["raised"]["op"]) == (-1, -1)
    assert r["elapsed_s"] < TIMEOUT_S + 5, r


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
