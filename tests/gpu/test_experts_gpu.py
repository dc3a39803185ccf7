"""``comm.expert_exchange`` on real GPUs: the fused dispatch and combine (one kernel each way, executor.gpu.experts)
against the same layer's calls around NCCL's all_to_all_single (``PlainExperts``), on random data with dropped
claims, bit for bit: eager in bf16, fp16 and fp32, a CUDA graph of three layers replayed on new tokens and claims
fifty times, and a rank that never calls (the others' waits give up and ``check`` names the rank).

One job (a process per GPU) runs every scenario; the job runs this file as a script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch_job import communicator_job, each, run_job

HIDDEN = 4096
EXPERTS = 8
SHAPES = ((1, 1), (16, 3), (64, 16))  # (tokens a rank, capacity): 16 tokens at capacity 3 drop claims
GRAPH_TOKENS, GRAPH_CAPACITY, GRAPH_LAYERS, REPLAYS = 32, 6, 3, 50


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    from conftest import nproc

    folder = tmp_path_factory.mktemp("experts-registry")  # the exchange needs no plan: an empty registry
    env = {"WEFT_REGISTRY": str(folder), "WEFT_TOPOLOGY": f"hgx_h200:gpus={nproc()}"}
    return run_job(__file__, "experts", tmp_path_factory, env)


@pytest.mark.gpu
def test_one_host_gets_the_fused_exchange(results):
    for row in each(results, "path"):
        assert row["path"] == "fused"


@pytest.mark.gpu
def test_eager_dispatch_and_combine_match_the_nccl_path_bit_for_bit(results):
    for row in each(results, "eager"):
        assert row["cases"] == 3 * len(SHAPES) and row["dropped"] > 0
        assert row["received_wrong"] == 0 and row["output_wrong"] == 0, row


@pytest.mark.gpu
def test_a_graph_of_three_layers_matches_the_nccl_path_on_every_replay(results):
    for row in each(results, "graph"):
        assert row["replays"] == REPLAYS and row["wrong"] == 0


@pytest.mark.gpu
def test_a_rank_that_never_calls_makes_the_others_give_up_naming_it(results):
    for rank, row in enumerate(each(results, "absent")):
        if rank == 0:
            assert row["skipped"]
        else:
            assert "the rows of rank 0 did not arrive" in row["message"] and row["seconds"] < 20, row


# ---------------------------------------------------------------------------------------------- the job


def _claims(layout, device, seed: int):
    """Random tokens' claims, routed as the layer routes them (lean top-2, capacity, drops): (rows, gates)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import moe_routing as moe

    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(layout.tokens, layout.experts, generator=gen, device=device) * 3
    experts, gates = moe.route_topk(logits)
    return moe.assign_onehot(experts, layout.experts, layout.capacity), gates


def _experts(received):
    """A row-wise stand-in for the experts (each output row depends on its input row only, as a matmul's does)."""
    return (received.float() * 1.5 - 0.25).to(received.dtype)


def _written(layout, rows, rank: int):
    """This rank's receive-buffer rows that some rank's kept claim writes (the others keep what was there)."""
    import torch
    import torch.distributed as dist

    every = torch.empty(layout.ranks, *rows.shape, dtype=rows.dtype, device=rows.device)
    dist.all_gather_into_tensor(every, rows.contiguous())
    places = []
    for source, claims in enumerate(every.tolist()):
        for row in (r for token in claims for r in token if 0 <= r < layout.trash):
            dest, at = layout.received_row(source, row)
            if dest == rank:
                places.append(at)
    return places


def scenario_eager(comm, device, rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from executor.inference.experts import PlainExperts

    received_wrong = output_wrong = dropped = cases = 0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens, capacity in SHAPES:
            fused = comm.expert_exchange(tokens, EXPERTS, capacity, HIDDEN, dtype)
            plain = PlainExperts(fused.layout, dist.all_to_all_single, device)
            for step in range(3):  # back to back: the flags' epochs move on
                x = torch.randn(tokens, HIDDEN, device=device).to(dtype)
                rows, gates = _claims(fused.layout, device, 100 * step + rank)
                dropped += int((rows >= fused.layout.trash).sum())
                got, ref = fused.dispatch(x, rows), plain.dispatch(x, rows)
                places = _written(fused.layout, rows, rank)
                flat_got, flat_ref = got.reshape(-1, HIDDEN), ref.reshape(-1, HIDDEN)
                received_wrong += int(not torch.equal(flat_got[places], flat_ref[places]))
                out = fused.combine(_experts(got), rows, gates)
                output_wrong += int(not torch.equal(out, plain.combine(_experts(ref), rows, gates)))
            fused.check()
            cases += 1
    return {"cases": cases, "dropped": dropped, "received_wrong": received_wrong, "output_wrong": output_wrong}


def scenario_graph(comm, device, rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from executor.inference.experts import PlainExperts

    fused = comm.expert_exchange(GRAPH_TOKENS, EXPERTS, GRAPH_CAPACITY, HIDDEN)
    plain = PlainExperts(fused.layout, dist.all_to_all_single, device)
    x = torch.randn(GRAPH_TOKENS, HIDDEN, device=device).to(torch.bfloat16)
    rows, gates = _claims(fused.layout, device, rank)
    rows, gates = rows.contiguous(), gates.contiguous()

    def layers(experts):
        y = x
        for _ in range(GRAPH_LAYERS):
            y = experts.combine(_experts(experts.dispatch(y, rows)), rows, gates)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layers(fused)  # warm-up, as graph capture wants
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layers(fused)
    wrong = 0
    for replay in range(REPLAYS):
        x.copy_(torch.randn_like(x, dtype=torch.float32))
        new_rows, new_gates = _claims(fused.layout, device, 1000 * replay + rank)
        rows.copy_(new_rows)
        gates.copy_(new_gates)
        graph.replay()
        wrong += int(not torch.equal(out, layers(plain)))
    fused.check()
    return {"replays": REPLAYS, "wrong": wrong}


def scenario_path(comm, device, rank: int) -> dict:
    return {"path": comm.expert_exchange(4, EXPERTS, 1, HIDDEN).path}


def scenario_absent(comm, device, rank: int) -> dict:
    """Rank 0 makes the exchange and never calls it; the others' dispatch gives up after 2 s."""
    import time

    import torch
    import torch.distributed as dist

    from executor.errors import ExecutorTimeout

    fused = comm.expert_exchange(4, EXPERTS, 1, HIDDEN, timeout_s=2.0)
    row: dict = {"skipped": True}
    if rank != 0:
        x = torch.randn(4, HIDDEN, device=device).to(torch.bfloat16)
        rows, _ = _claims(fused.layout, device, rank)
        start = time.monotonic()
        fused.dispatch(x, rows)
        try:
            fused.check()
            row = {"message": "", "seconds": time.monotonic() - start}
        except ExecutorTimeout as e:
            row = {"message": str(e), "seconds": time.monotonic() - start}
    dist.barrier()  # rank 0 keeps its buffers, which the others write, until they gave up
    return row


def main() -> None:
    communicator_job(
        33,
        lambda comm, device, rank: {
            "path": lambda: scenario_path(comm, device, rank),
            "eager": lambda: scenario_eager(comm, device, rank),
            "graph": lambda: scenario_graph(comm, device, rank),
            "absent": lambda: scenario_absent(comm, device, rank),
        },
    )


if __name__ == "__main__":
    main()
