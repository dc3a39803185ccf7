"""``comm.all_to_all_single(output, input)`` on real GPUs, against NCCL's all_to_all_single on random bf16 data:
eager, captured in CUDA graphs (zero-copy inside ``comm.capture``), a size first seen in a capture, a size past the
staging buffers (NCCL), and a malformed split.

One job (a process per GPU) runs every scenario; the job runs this file as a script. Its registry is made here, on
the CPU, before the job starts: the direct all-to-all tuned as LL (to 1 MB) and Simple, for ``hgx_h200:gpus=N``
(``WEFT_TOPOLOGY``), so the test needs no committed all-to-all registry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch_job import communicator_job, each, run_job

HIDDEN = 4096
EAGER_BYTES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)  # each rank's whole input; 32 MB is past the staging buffers
GRAPH_BYTES = (64 << 10, 2 << 20)
STREAM_BYTES, STREAM_ROUNDS = 512 << 10, 20  # the MoE layer's all-to-all at EP=4, 32 tokens per rank


def _registry(folder: Path, nranks: int) -> str:
    from topologies.catalog import build
    from weft import publish
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    topology = build(f"hgx_h200:gpus={nranks}")
    schedule = synthesize(topology, "alltoall", "direct")
    for protocol, instances in (("ll", 1), ("simple", 4)):
        publish.commit(
            compile_and_verify(schedule, topology, protocol=protocol, instances=instances),
            topology,
            str(folder),
            schedule,
        )
    return f"hgx_h200:gpus={nranks}"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    from conftest import nproc

    folder = tmp_path_factory.mktemp("alltoall-registry")
    spec = _registry(folder, nproc())
    return run_job(__file__, "alltoall", tmp_path_factory, {"WEFT_REGISTRY": str(folder), "WEFT_TOPOLOGY": spec})


@pytest.mark.gpu
def test_eager_all_to_all_matches_nccl_bit_for_bit(results):
    for row in each(results, "eager"):
        assert row["wrong"] == {str(n): 0 for n in EAGER_BYTES}
        assert row["plans"][str(4 << 10)] and row["plans"][str(4 << 20)]  # LL, then Simple


@pytest.mark.gpu
def test_sizes_past_the_staging_buffers_run_on_nccl(results):
    for row in each(results, "eager"):
        assert row["plans"][str(32 << 20)] is None and row["nccl_calls"] >= 1


@pytest.mark.gpu
def test_captured_all_to_all_runs_zero_copy_and_matches_nccl_on_every_replay(results):
    for row in each(results, "graph"):
        # the LL plan writes peers only in their scratch: always zero-copy; the Simple plan writes peers' outputs,
        # so it binds only where the captured tensor can be shared by IPC (else it stages, said in the log)
        assert row["zero_copy"] >= 1 and row["zero_copy"] + row["staging"] == len(GRAPH_BYTES)
        assert row["replays"] == 50 and row["wrong"] == 0


@pytest.mark.gpu
def test_a_size_first_seen_in_a_capture_runs_on_nccl_and_is_correct(results):
    for row in each(results, "unprepared"):
        assert row["nccl"] == 1 and row["wrong"] == 0


@pytest.mark.gpu
def test_calls_on_a_side_stream_right_after_prepare_are_ordered_and_correct(results):
    for row in each(results, "streams"):
        assert row["wrong"] == 0 and row["waits"] >= 2 * STREAM_ROUNDS - 1  # side after current, current after side


@pytest.mark.gpu
def test_a_split_that_is_not_equal_is_refused_in_one_line(results):
    for row in each(results, "bad_split"):
        assert "must split into" in row["error_text"]


# ---------------------------------------------------------------------------------------------- the job


def _nccl(x):
    import torch
    import torch.distributed as dist

    ref = torch.empty_like(x)
    dist.all_to_all_single(ref, x)
    return ref


def scenario_eager(comm, device) -> dict:
    import torch

    wrong, plans = {}, {}
    before = comm.paths["nccl"]
    for nbytes in EAGER_BYTES:
        rows = nbytes // (2 * HIDDEN) if nbytes >= 2 * HIDDEN * comm.world_size else comm.world_size
        x = torch.randn(rows, nbytes // (2 * rows), device=device).to(torch.bfloat16)
        out = torch.empty_like(x)
        comm.all_to_all_single(out, x)
        wrong[str(nbytes)] = int(not torch.equal(out, _nccl(x)))
        plans[str(nbytes)] = getattr(comm.plan_for("alltoall", nbytes, x.dtype), "name", None)
    return {"wrong": wrong, "plans": plans, "nccl_calls": comm.paths["nccl"] - before}


def scenario_graph(comm, device) -> dict:
    import torch

    xs = [torch.randn(nbytes // (2 * HIDDEN), HIDDEN, device=device).to(torch.bfloat16) for nbytes in GRAPH_BYTES]
    outs = [torch.empty_like(x) for x in xs]
    with comm.capture(alltoall_sizes=GRAPH_BYTES):  # prepares each size's context eagerly (staging calls)
        before = dict(comm.paths)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for x, out in zip(xs, outs, strict=True):
                comm.all_to_all_single(out, x)
    zero_copy, staging = (comm.paths[k] - before[k] for k in ("zero_copy", "staging"))
    wrong = 0
    for _ in range(50):
        for x in xs:
            x.copy_(torch.randn_like(x, dtype=torch.float32))
        graph.replay()
        wrong += sum(not torch.equal(out, _nccl(x)) for x, out in zip(xs, outs, strict=True))
    return {"zero_copy": zero_copy, "staging": staging, "replays": 50, "wrong": wrong}


def scenario_unprepared(comm, device) -> dict:
    import torch

    x = torch.randn(3 * comm.world_size, HIDDEN, device=device).to(torch.bfloat16)  # a size used nowhere else
    out = torch.empty_like(x)
    before = comm.paths["nccl"]
    with comm.capture():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            comm.all_to_all_single(out, x)
    nccl = comm.paths["nccl"] - before
    x.copy_(torch.randn_like(x, dtype=torch.float32))
    graph.replay()
    return {"nccl": nccl, "wrong": int(not torch.equal(out, _nccl(x)))}


def scenario_streams(comm, device) -> dict:
    """examples/moe_layer.py's all-to-all graph warm-up (issue 36), eagerly: ``prepare`` on the current stream,
    then at once three calls on a side stream, rank 0 a few milliseconds late each round (as a store exchange's
    polling leaves it). Unordered, two executions of one staging context ran at once on a GPU and a peer waited
    30 s for packets the later one overwrote; the communicator orders the side stream after the current one."""
    import time

    import torch

    side = torch.cuda.Stream()
    x = torch.randn(STREAM_BYTES // (2 * HIDDEN), HIDDEN, device=device).to(torch.bfloat16)
    outs = [torch.empty_like(x) for _ in range(3)]
    waits, wrong = comm.streams.waits, 0
    for _ in range(STREAM_ROUNDS):
        x.copy_(torch.randn_like(x, dtype=torch.float32))
        if comm.rank == 0:
            time.sleep(0.003)
        comm.prepare("alltoall", x.numel() * x.element_size(), x.dtype)
        with torch.cuda.stream(side):
            for out in outs:
                comm.all_to_all_single(out, x)
        torch.cuda.current_stream().wait_stream(side)
        ref = _nccl(x)
        wrong += sum(not torch.equal(out, ref) for out in outs)
    return {"wrong": wrong, "waits": comm.streams.waits - waits}


def scenario_bad_split(comm, device) -> dict:
    import torch

    x = torch.zeros(comm.world_size + 1, 8, device=device, dtype=torch.bfloat16)
    try:
        comm.all_to_all_single(torch.empty_like(x), x)
        return {"error_text": ""}
    except (ValueError, RuntimeError) as e:
        return {"error_text": str(e)}


def main() -> None:
    communicator_job(
        36,
        lambda comm, device, rank: {
            "eager": lambda: scenario_eager(comm, device),
            "graph": lambda: scenario_graph(comm, device),
            "unprepared": lambda: scenario_unprepared(comm, device),
            "streams": lambda: scenario_streams(comm, device),
            "bad_split": lambda: scenario_bad_split(comm, device),
        },
    )


if __name__ == "__main__":
    main()
