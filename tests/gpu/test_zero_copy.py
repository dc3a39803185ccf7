"""Zero-copy CUDA graphs on real GPUs: captured collectives read and write the captured tensors, against NCCL.

One job (a process per GPU) runs every scenario and writes each rank's results; the tests read them. The job
runs with expandable segments (torch's tensors cannot be shared by CUDA IPC) and the committed registry for its
rank count, as tests/gpu/test_inference.py does. It runs this file as a script:
``python tests/gpu/test_zero_copy.py RESULTS_DIR`` with RANK, WORLD_SIZE, ... set.
"""

from __future__ import annotations

import pytest
from torch_job import (
    LogLines,
    each,
    registry_for,
    replayed_before_registration,
    run_job,
    run_scenarios,
    start_rank,
    sums_to,
)

HIDDEN = 8192
REPLAYS = 100
PEER_BYTES = 64 << 10  # each execution of the peer-buffer scenario


# ---------------------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_job(__file__, "zero-copy", tmp_path_factory)


@pytest.mark.gpu
def test_ten_captured_all_reduces_and_a_view_replay_100_times_against_nccl(results):
    for row in each(results, "ten_calls"):
        assert row["plan"] and row["replays"] == REPLAYS
        assert row["calls"] == 12 and row["view_offset_bytes"] > 0
        assert row["wrong"] == {"out_of_place": 0, "view": 0, "in_place": 0}


@pytest.mark.gpu
def test_captured_calls_bind_the_tensors_and_never_touch_staging(results):
    for row in each(results, "ten_calls"):
        assert row["paths"] == {"zero_copy": 12, "staging": 0, "nccl": 0}
        assert row["staging_untouched"], "a replay wrote the staging buffers"


@pytest.mark.gpu
def test_expandable_segment_tensors_bind_since_no_peer_maps_them(results):
    for row in each(results, "ten_calls"):
        assert row["export_refused"], "the job's tensors were shareable: expandable segments were not in use"
        assert row["paths"]["zero_copy"] == 12


@pytest.mark.gpu
def test_a_view_misaligned_for_the_plan_stages_inside_the_graph(results):
    for row in each(results, "misaligned"):
        assert row["paths"] == {"zero_copy": 0, "staging": 1, "nccl": 0}
        assert row["logged"] == 1 and row["wrong"] == 0 and row["replays"] == 20


@pytest.mark.gpu
def test_a_replay_before_registration_raises_and_the_registered_graph_is_correct(results):
    for row in each(results, "early_replay"):
        assert row["raised"] and "before their buffers were registered" in row["raised"]
        assert row["wrong_after"] == 0


@pytest.mark.gpu
def test_peers_buffers_exchanged_after_capture_replay_100_times(results):
    rows = each(results, "peer_buffers")
    if rows[0].get("skipped"):
        pytest.skip(rows[0]["skipped"])
    for row in rows:
        assert row["maps_peers"] and row["bound"] == 10 and row["replays"] == REPLAYS and row["wrong"] == 0


@pytest.mark.gpu
def test_a_tensor_ipc_cannot_share_is_refused_on_every_rank_in_capture(results):
    rows = each(results, "peer_buffers")
    if rows[0].get("skipped"):
        pytest.skip(rows[0]["skipped"])
    for row in rows:
        assert row["export_refused"] and "CUDA IPC" in row["refused"]
    assert len({row["refused"] for row in rows}) == 1  # the same verdict, from the same rank, everywhere


# ---------------------------------------------------------------------------------------------- the worker


def _exportable(tensor) -> bool:
    from executor.gpu import ipc

    try:
        ipc.export(tensor.data_ptr())
    except Exception:  # CUDA's own error types: expandable segments refuse cudaIpcGetMemHandle
        return False
    return True


def _paths_since(comm, before: dict) -> dict:
    return {k: comm.paths[k] - before[k] for k in comm.paths}


def scenario_ten_calls(comm, device) -> dict:
    """10 out-of-place all-reduces on distinct tensors, one on a view into a larger allocation, one in place."""
    import torch

    rows = 16
    n = rows * HIDDEN
    xs = [torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16) for _ in range(10)]
    arena = torch.randn(3 * n + 64, device=device, dtype=torch.bfloat16)
    view = arena[64 + n : 64 + 2 * n].view(rows, HIDDEN)  # 128 B + one tensor into the allocation
    y = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16)
    comm.all_reduce(xs[0])  # eager warm-up: the size's context, on the staging buffers
    sentinel_in = comm.staging_input(n, torch.bfloat16)
    sentinel_out = comm.staging.output[: 2 * n].view(torch.bfloat16)
    for t in (sentinel_in, sentinel_out):
        t.fill_(-7.0)
    torch.cuda.synchronize()
    before = dict(comm.paths)
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        outs = [comm.all_reduce(x) for x in xs]
        view_out = comm.all_reduce(view)
        comm.all_reduce_(y)
    paths = _paths_since(comm, before)
    wrong = {"out_of_place": 0, "view": 0, "in_place": 0}
    for _ in range(REPLAYS):
        for x in xs:
            x.normal_()
        view.normal_()
        y_in = torch.randn_like(y)
        y.copy_(y_in)
        graph.replay()
        wrong["out_of_place"] += sum(not sums_to(o, x) for x, o in zip(xs, outs, strict=True))
        wrong["view"] += not sums_to(view_out, view)
        wrong["in_place"] += not sums_to(y, y_in)
    torch.cuda.synchronize()
    untouched = bool((sentinel_in == -7.0).all() and (sentinel_out == -7.0).all())
    plan = comm.plan_for("allreduce", n * 2, torch.bfloat16)
    return {
        "plan": getattr(plan, "name", None),
        "replays": REPLAYS,
        "calls": sum(paths.values()),
        "paths": paths,
        "wrong": wrong,
        "staging_untouched": untouched,
        "export_refused": not _exportable(xs[0]),
        "view_offset_bytes": view.data_ptr() - arena.data_ptr(),
    }


def scenario_misaligned(comm, log: LogLines, device) -> dict:
    """A view 2 bytes into its allocation cannot feed 16-byte vectors: that call stages, inside the graph."""
    import torch

    rows = 4
    n = rows * HIDDEN
    arena = torch.randn(n + 8, device=device, dtype=torch.bfloat16)
    x = arena[1 : 1 + n].view(rows, HIDDEN)
    comm.all_reduce(torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16))  # the size's context
    torch.cuda.synchronize()
    before, lines = dict(comm.paths), len(log.lines)
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        out = comm.all_reduce(x)
    paths = _paths_since(comm, before)
    logged = sum("through the staging buffer in this graph" in line for line in log.lines[lines:])
    wrong = 0
    for _ in range(20):
        x.normal_()
        graph.replay()
        wrong += not sums_to(out, x)
    return {"paths": paths, "logged": logged, "wrong": wrong, "replays": 20}


def scenario_early_replay(comm, device) -> dict:
    """A graph replayed inside capture(), before registration: leaving the block raises; then the graph works."""
    import torch

    x = torch.randn(2, HIDDEN, device=device, dtype=torch.bfloat16)
    graph, out, raised = replayed_before_registration(comm, x)
    wrong = 0
    for _ in range(10):
        x.normal_()
        graph.replay()
        wrong += not sums_to(out, x)
    return {"raised": raised, "wrong_after": wrong}


def _peer_mapping_plan(world: int):
    """A registry all-reduce whose peers read or write this rank's input or output (so captured buffers must be
    exchanged): one not proven safe back to back first (2 ranks: a two-shot), else a proven one (4 ranks, whose
    registry holds only those), of the fewest blocks."""
    from executor.inference.plans import safe_back_to_back
    from registry.store import Registry

    maps = [
        e.plan
        for e in Registry(str(registry_for(world))).entries()
        if e.plan.collective == "allreduce"
        and e.plan.nranks == world
        and e.plan.runs(PEER_BYTES)
        and any(b.type in "io" for g in e.plan.gpus for b in g.remote_buffers)
    ]
    unproven = [p for p in maps if not safe_back_to_back(p)]
    ranked = unproven or sorted(maps, key=lambda p: (len(p.gpus[0].threadblocks), p.name))
    return ranked[0] if ranked else None


def scenario_peer_buffers(rank, world, device) -> dict:
    """The executor's API: 10 executions whose peers map their outputs, on CuPy (cudaMalloc) buffers; the handles
    are exchanged when capture() closes. A torch tensor from expandable segments is refused on every rank."""
    import cupy
    import torch
    import torch.distributed as dist

    from executor.gpu.engine import InterpreterEngine

    plan = _peer_mapping_plan(world)
    if plan is None:
        return {"skipped": f"no all-reduce in {registry_for(world)} whose peers map buffers"}
    comm = InterpreterEngine(rank, world, dist.distributed_c10d._get_default_store())
    n = PEER_BYTES // 4  # fp32
    with cupy.cuda.Device(device.index):
        xs = [cupy.random.standard_normal(n, dtype=cupy.float32) for _ in range(10)]
        outs = [cupy.empty(n, cupy.float32) for _ in range(10)]
        comm.execute(plan, cupy.zeros(n, cupy.float32), cupy.empty(n, cupy.float32))  # the context
        comm.synchronize()
    unshareable = [torch.randn(n, device=device, dtype=torch.float32) for _ in range(2)]  # expandable segments
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        stream = torch.cuda.current_stream()
        bound = sum(comm.execute_captured(plan, x, o, stream=stream) == "" for x, o in zip(xs, outs, strict=True))
        refused = comm.execute_captured(plan, unshareable[0], unshareable[1], stream=stream)
    maps_peers = any(c.peers.collective for c in comm._templates.values())
    wrong = 0
    for _ in range(REPLAYS):
        for x in xs:
            x[...] = cupy.random.standard_normal(n, dtype=cupy.float32)
        cupy.cuda.runtime.deviceSynchronize()
        graph.replay()
        torch.cuda.synchronize()
        for x, o in zip(xs, outs, strict=True):
            wrong += not sums_to(torch.from_dlpack(o), torch.from_dlpack(x))
    comm.close()
    return {
        "plan": plan.name,
        "maps_peers": maps_peers,
        "bound": bound,
        "refused": refused,
        "export_refused": not _exportable(unshareable[1]),
        "replays": REPLAYS,
        "wrong": wrong,
    }


def main() -> None:
    import torch.distributed as dist

    from executor import Communicator

    rank, world, device, log, out_dir = start_rank(seed=4321)
    comm = Communicator.from_process_group()
    scenarios = {
        "ten_calls": lambda: scenario_ten_calls(comm, device),
        "misaligned": lambda: scenario_misaligned(comm, log, device),
        "early_replay": lambda: scenario_early_replay(comm, device),
        "peer_buffers": lambda: scenario_peer_buffers(rank, world, device),
    }
    run_scenarios(rank, out_dir, scenarios)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
