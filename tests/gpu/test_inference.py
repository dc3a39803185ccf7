"""The torch-facing Communicator on real GPUs, against NCCL: process groups, graphs, fallbacks, compile, determinism.

One job (a process per GPU) runs every scenario and writes each rank's results; the tests read them. The job
runs this file as a script: ``python tests/gpu/test_inference.py RESULTS_DIR`` with RANK, WORLD_SIZE, ... set.
Plans come from the committed registry for this rank count (bench/registry_h200x<N>).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from torch_job import (
    LogLines,
    each,
    run_job,
    run_scenarios,
    start_rank,
    sums_to,
    three_collectives_wrong,
)

HIDDEN = 8192


# ---------------------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_job(__file__, "inference", tmp_path_factory)


@pytest.mark.gpu
def test_from_process_group_runs_weft_plans_over_an_existing_nccl_group(results):
    for row in each(results, "process_group"):
        assert row["enabled"] and row["topology"] == row["expected_topology"]
        assert row["plans"]["allreduce"] and row["plans"]["allgather"] and row["plans"]["reducescatter"]
        assert row["wrong"] == {
            "all_reduce": 0,
            "all_reduce_": 0,
            "all_gather_into_tensor": 0,
            "reduce_scatter_tensor": 0,
        }


@pytest.mark.gpu
def test_graph_capture_replays_100_times_on_fresh_inputs(results):
    for row in each(results, "graph"):
        assert row["plan"] and row["replays"] == 100 and row["wrong"] == 0


@pytest.mark.gpu
def test_a_size_first_seen_inside_capture_runs_on_nccl_and_is_correct(results):
    for row in each(results, "graph"):
        assert row["unprepared_wrong"] == 0 and row["unprepared_logged"] == 1


@pytest.mark.gpu
def test_capture_prepares_sizes_so_the_graph_runs_weft(results):
    for row in each(results, "backend"):
        assert row["prepared_in_capture"] and row["graph_wrong"] == 0


@pytest.mark.gpu
def test_a_size_with_no_plan_falls_back_to_nccl_logged_once(results):
    for row in each(results, "no_plan"):
        assert row["plan"] is None and row["wrong"] == 0 and row["logged"] == 1


@pytest.mark.gpu
def test_an_allocation_ipc_cannot_share_runs_through_staging(results):
    for row in each(results, "unshareable"):
        assert row["export_refused"], row
        assert row["plan"] and row["wrong"] == 0


@pytest.mark.gpu
def test_torch_compile_traces_through_all_reduce(results):
    for row in each(results, "compile"):
        assert row["ops_in_graph"] == 1 and row["wrong"] == 0


@pytest.mark.gpu
def test_deterministic_mode_is_bitwise_identical_on_every_rank_and_run(results):
    rows = each(results, "deterministic")
    for row in rows:
        assert row["plans"] and all(row["plans"].values())
        assert row["run1"] == row["run2"]
    assert len({json.dumps(r["run1"], sort_keys=True) for r in rows}) == 1


@pytest.mark.gpu
def test_all_reduce_with_a_residual_adds_it_in_the_launch_eager_and_in_graphs(results):
    rows = each(results, "residual")
    for row in rows:
        assert row["fused"] and row["eager_wrong"] == 0 and row["eager_bitwise"]
        assert row["graph_wrong"] == 0 and row["replays"] == 100 and row["zero_copy"] >= 1
        assert row["backend_graph_wrong"] == 0 and row["prepared"]
        assert row["nccl_path_wrong"] == 0 and row["bad_shape"].startswith("weft: all_reduce's residual must be")
    # every rank got the same bits, where the plan sums in one order on every rank (a one-shot plan of more than
    # two ranks sums in each rank's own order: executor.inference.plans.fixed_reduction_order; deterministic=True)
    if all(r["fixed_order"] for r in rows):
        assert len({r["graph_hash"] for r in rows}) == 1


@pytest.mark.gpu
def test_backend_should_use_only_what_weft_runs(results):
    for row in each(results, "backend"):
        assert row["should_use"] == {"bf16_64KB": True, "int32": False, "bf16_64MB": False}


# ---------------------------------------------------------------------------------------------- the worker


def scenario_process_group(comm, world, device) -> dict:
    import torch

    from topologies.catalog import build

    x = torch.randn(32 * HIDDEN, device=device, dtype=torch.bfloat16)
    wrong = three_collectives_wrong(comm, x, world)
    y = x.clone()
    comm.all_reduce_(y)
    wrong["all_reduce_"] = int(not sums_to(y, x))
    nbytes = x.numel() * x.element_size()
    plans = {
        c: getattr(comm.plan_for(c, nbytes if c != "allgather" else world * nbytes, x.dtype), "name", None)
        for c in ("allreduce", "allgather", "reducescatter")
    }
    return {
        "enabled": comm.enabled,
        "topology": comm.topology.fingerprint,
        "expected_topology": build(f"hgx_h200:gpus={world}").fingerprint,
        "plans": plans,
        "wrong": wrong,
    }


def scenario_graph(comm, log: LogLines, world, device) -> dict:
    import torch

    x = torch.randn(16, HIDDEN, device=device, dtype=torch.bfloat16)
    for _ in range(3):  # eager warm-up, as engines do before capture: it makes the size's context
        comm.all_reduce(x)
    odd = torch.randn(3, HIDDEN, device=device, dtype=torch.bfloat16)  # never seen before the capture
    torch.cuda.synchronize()
    before = len(log.lines)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = comm.all_reduce(x)
        twice = comm.all_reduce(out)
        odd_out = comm.all_reduce(odd)
    logged = sum("first seen inside graph capture" in line for line in log.lines[before:])
    wrong = unprepared_wrong = 0
    for _ in range(100):
        x.copy_(torch.randn_like(x))
        odd.copy_(torch.randn_like(odd))
        graph.replay()
        wrong += not (sums_to(out, x) and sums_to(twice, out))
        unprepared_wrong += not sums_to(odd_out, odd)
    plan = comm.plan_for("allreduce", x.numel() * 2, x.dtype)
    return {
        "plan": getattr(plan, "name", None),
        "replays": 100,
        "wrong": wrong,
        "unprepared_wrong": unprepared_wrong,
        "unprepared_logged": logged,
    }


def scenario_no_plan(rank, world, device, log: LogLines, registry: Path, tmp: Path) -> dict:
    """A registry holding only the LL plans that accept up to 1 MB: 4 MB has no plan."""
    import shutil

    import torch

    from executor import Communicator

    only_ll = tmp / "registry-ll-only"
    (only_ll / "entries").mkdir(parents=True, exist_ok=True)
    for f in (registry / "entries").glob("*.json"):
        plan = json.loads(f.read_text())["plan"]
        if plan["protocol"] == "LL" and plan["max_message_size"] <= 1 << 20:
            shutil.copy(f, only_ll / "entries" / f.name)
    comm = Communicator.from_process_group(registry=str(only_ll))
    x = torch.randn(2 << 20, device=device, dtype=torch.bfloat16)  # 4 MB
    before = len(log.lines)
    wrong = sum(not sums_to(comm.all_reduce(x), x) for _ in range(3))
    logged = sum("runs on NCCL: no plan" in line for line in log.lines[before:])
    plan = comm.plan_for("allreduce", x.numel() * 2, x.dtype)
    comm.close()
    return {"plan": getattr(plan, "name", None), "wrong": wrong, "logged": logged}


def scenario_unshareable(comm, device) -> dict:
    """The job runs with expandable segments (virtual memory): CUDA IPC refuses torch's allocations, weft stages."""
    import torch

    from executor.gpu import ipc

    x = torch.randn(8, HIDDEN, device=device, dtype=torch.bfloat16)
    try:
        ipc.export(x.data_ptr())
        refused = False
    except Exception:
        refused = True
    wrong = sum(not sums_to(comm.all_reduce(x), x) for _ in range(3))
    plan = comm.plan_for("allreduce", x.numel() * 2, x.dtype)
    return {"export_refused": refused, "plan": getattr(plan, "name", None), "wrong": wrong}


def scenario_compile(comm, device) -> dict:
    """torch.compile(fullgraph=True) refuses any graph break; a recording backend shows the op in the graph."""
    import torch
    import torch._dynamo

    def layer(h, w):
        return comm.all_reduce(h @ w) + h

    traced = []

    def recording(gm, example_inputs):
        traced.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    h = torch.randn(4, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, 256, device=device, dtype=torch.bfloat16) * 0.05
    torch.compile(layer, fullgraph=True, backend=recording)(h, w)
    compiled = torch.compile(layer, fullgraph=True)
    wrong = 0
    for _ in range(5):
        h = torch.randn(4, 256, device=device, dtype=torch.bfloat16)
        w = torch.randn(256, 256, device=device, dtype=torch.bfloat16) * 0.05
        wrong += not sums_to(compiled(h, w), h @ w, residual=h)
    return {"ops_in_graph": sum("weft.all_reduce" in t for t in traced), "wrong": wrong}


def scenario_deterministic(rank, world, device) -> dict:
    """Two communicators (two sets of contexts) on the same inputs; every result's hash must agree."""
    import torch

    from executor import Communicator

    runs = []
    plans = {}
    phases: dict[str, float] = {}  # where its minutes go (87 of test_inference's 145 s at 4 ranks, 2026-11-28)
    for run in range(2):
        start = time.monotonic()
        comm = Communicator.from_process_group(deterministic=True)
        phases[f"run{run}_communicator"] = round(time.monotonic() - start, 2)
        hashes = {}
        for dtype, rows in ((torch.bfloat16, 4), (torch.float32, 16), (torch.float16, 64)):
            gen = torch.Generator(device=device).manual_seed(100 + rank)
            x = torch.randn(rows, HIDDEN, generator=gen, device=device, dtype=dtype) * 1000
            start = time.monotonic()
            out = comm.all_reduce(x)
            torch.cuda.synchronize()
            name = f"{str(dtype)[6:]}_{rows}"
            phases[f"run{run}_{name}"] = round(time.monotonic() - start, 2)
            hashes[name] = hashlib.sha256(out.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
            plans[name] = getattr(comm.plan_for("allreduce", x.numel() * x.element_size(), dtype), "name", None)
        comm.close()
        runs.append(hashes)
    return {"run1": runs[0], "run2": runs[1], "plans": plans, "phases_s": phases}


def scenario_backend(comm, device) -> dict:
    import torch

    from executor.inference.backend import WeftBackend

    backend = WeftBackend(comm)
    should = {
        "bf16_64KB": backend.should_use(torch.empty(4, HIDDEN, device=device, dtype=torch.bfloat16)),
        "int32": backend.should_use(torch.empty(4, HIDDEN, device=device, dtype=torch.int32)),
        "bf16_64MB": backend.should_use(torch.empty(4096, HIDDEN, device=device, dtype=torch.bfloat16)),
    }
    x = torch.randn(5, HIDDEN, device=device, dtype=torch.bfloat16)  # a size used nowhere else
    with backend.capture(sizes=[x.numel() * 2]):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            prepared = backend.should_use(x)
            out = backend.all_reduce(x)
    wrong = 0
    for _ in range(20):
        x.copy_(torch.randn_like(x))
        graph.replay()
        wrong += not sums_to(out, x)
    return {"should_use": should, "prepared_in_capture": prepared, "graph_wrong": wrong}


def scenario_residual(comm, device) -> dict:
    """``all_reduce(y, residual=h)``: h (the same on every rank) added in the launch; eager, captured zero-copy
    (100 replays on fresh data), through the backend, on NCCL for a size past the staging buffers, and refused
    with one line for a residual of another shape."""
    import torch

    from executor.inference.backend import WeftBackend
    from executor.inference.plans import fixed_reduction_order

    def shared(*shape, seed):  # the same values on every rank, as a residual stream
        gen = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)

    x, h = torch.randn(4, HIDDEN, device=device, dtype=torch.bfloat16), shared(4, HIDDEN, seed=3)
    plan = comm.plan_for("allreduce", x.numel() * 2, x.dtype)
    eager = comm.all_reduce(x, residual=h)
    joined = comm.all_reduce(x) + h  # the same plan's sum, then torch's add
    row = {
        "fused": comm.fuses(plan),
        "eager_wrong": int(not sums_to(eager, x, residual=h)),
        "eager_bitwise": bool(torch.equal(eager, joined)),
    }
    for _ in range(3):
        comm.all_reduce(x, residual=h)  # warm-up: the size's context with a residual
    before = comm.paths["zero_copy"]
    with comm.capture():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = comm.all_reduce(x, residual=h)
    row["zero_copy"] = comm.paths["zero_copy"] - before
    wrong = 0
    for k in range(100):
        x.copy_(torch.randn_like(x))
        h.copy_(shared(4, HIDDEN, seed=1000 + k))
        graph.replay()
        wrong += not sums_to(out, x, residual=h)
    torch.cuda.synchronize()
    row.update(
        graph_wrong=wrong,
        replays=100,
        fixed_order=fixed_reduction_order(plan),
        graph_hash=hashlib.sha256(out.cpu().view(torch.uint8).numpy().tobytes()).hexdigest(),
    )
    backend = WeftBackend(comm)
    y, r = torch.randn(6, HIDDEN, device=device, dtype=torch.bfloat16), shared(6, HIDDEN, seed=5)
    with backend.capture(sizes=[y.numel() * 2], residual=True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            row["prepared"] = backend.should_use(y, residual=True)
            summed = backend.all_reduce(y, residual=r)
    row["backend_graph_wrong"] = 0
    for k in range(20):
        y.copy_(torch.randn_like(y))
        r.copy_(shared(6, HIDDEN, seed=2000 + k))
        graph.replay()
        row["backend_graph_wrong"] += not sums_to(summed, y, residual=r)
    big, big_h = torch.randn(640, HIDDEN, device=device, dtype=torch.bfloat16), shared(640, HIDDEN, seed=9)
    row["nccl_path_wrong"] = int(not sums_to(comm.all_reduce(big, residual=big_h), big, residual=big_h))
    try:
        comm.all_reduce(x, residual=h[:2])
        row["bad_shape"] = ""
    except (ValueError, RuntimeError) as e:  # the op's body raises ValueError
        row["bad_shape"] = str(e)
    return row


def main() -> None:
    import torch.distributed as dist

    from executor import Communicator

    rank, world, device, log, out_dir = start_rank(seed=1234)
    registry = Path(os.environ["WEFT_REGISTRY"])
    comm = Communicator.from_process_group()
    scenarios = {
        "process_group": lambda: scenario_process_group(comm, world, device),
        "graph": lambda: scenario_graph(comm, log, world, device),
        "no_plan": lambda: scenario_no_plan(rank, world, device, log, registry, out_dir / f"tmp{rank}"),
        "unshareable": lambda: scenario_unshareable(comm, device),
        "compile": lambda: scenario_compile(comm, device),
        "deterministic": lambda: scenario_deterministic(rank, world, device),
        "backend": lambda: scenario_backend(comm, device),
        "residual": lambda: scenario_residual(comm, device),
    }
    run_scenarios(rank, out_dir, scenarios)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
