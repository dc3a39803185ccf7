"""Lamport two-shot all-reduce past 4 MB on real GPUs (issue 33's mid sizes): the shapes the traffic model puts
fastest of weft's at 1-16 MB (bench/results/traffic_predictions_midsize_4xh200.json), made by `weft tune
--lamport-max-bytes 16MB` and benched by `bench/peers_run.sh 4 midsize`, checked against NCCL at 8 and 16 MB in
bf16 over back-to-back calls (each of the three scratch copies used, reset and used again twice over).

One job (a process per GPU, ``WEFT_GPU_NPROC`` of them) runs this file as a script;
its plans are compiled and proven by the CPU reference here first. Written without a GPU: not run yet.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_lamport_gpu import CALLS, back_to_back
from torch_job import each, run_job, run_scenarios, start_rank

SHAPES = {"x16": (16, False), "x128-mp": (128, True)}  # (instances, multipeer): per-peer blocks; one block, all peers
SIZES = {"8MB": 8 << 20, "16MB": 16 << 20}
PLANS_ENV = "WEFT_TEST_LAMPORT_MIDSIZE_PLANS"


def case_ids() -> list[str]:
    return [f"{shape}-{size}" for shape in SHAPES for size in SIZES]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    from conftest import gpu_count, nproc

    if gpu_count() < nproc():
        pytest.skip(f"needs {nproc()} CUDA GPUs with torch and CuPy")
    from schedules.plan.io import dumps_plan
    from topologies.catalog import build
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    folder = tmp_path_factory.mktemp("lamport-midsize-plans")
    topology = build(f"hgx_h200:gpus={nproc()}")
    schedule = synthesize(topology, "allreduce", "twoshot")
    for shape, (instances, multipeer) in SHAPES.items():
        plan = compile_and_verify(
            schedule, topology, instances, "lamport", multipeer=multipeer, lamport_max_bytes=16 << 20
        )
        (folder / f"{shape}.json").write_text(dumps_plan(plan))
    env = {
        PLANS_ENV: str(folder),
        "WEFT_REGISTRY": str(folder),
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",  # the engine shares these tensors by CUDA IPC
    }
    return run_job(__file__, "lamport_midsize", tmp_path_factory, env)


@pytest.mark.gpu
@pytest.mark.parametrize("case", case_ids())
def test_a_lamport_two_shot_past_4mb_matches_nccl_over_back_to_back_calls(results, case):
    # every rank ran every call; "wrong" lists the calls (0-based) whose output was not NCCL's
    ranks = [row[case] for row in each(results, "eager")]
    assert ranks and all(r == {"calls": CALLS, "wrong": []} for r in ranks), ranks


# ------------------------------------------------------------------------------------------ the job (each rank)


def scenario_eager(comm, folder: Path, rank: int, device) -> dict:
    """CALLS calls on one input buffer with no host synchronization between them."""
    from schedules.plan.io import load_plan

    rows = {}
    for shape in SHAPES:
        plan = load_plan(folder / f"{shape}.json")
        for size, nbytes in SIZES.items():
            rows[f"{shape}-{size}"] = {"calls": CALLS, "wrong": back_to_back(comm, plan, nbytes, "bf16", rank, device)}
    return rows


def main() -> None:
    import torch.distributed as dist

    from executor.gpu.engine import InterpreterEngine

    rank, _, device, _, out_dir = start_rank(seed=33)
    folder = Path(os.environ[PLANS_ENV])
    comm = InterpreterEngine.from_process_group(timeout_s=float(os.environ.get("WEFT_TEST_TIMEOUT", "30")))
    run_scenarios(rank, out_dir, {"eager": lambda: scenario_eager(comm, folder, rank, device)})
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
