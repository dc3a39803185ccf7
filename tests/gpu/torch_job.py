"""The harness of the GPU test files that run torch scenarios: one job (a process per GPU) runs a test file as a
script, every scenario in it, and writes each rank's results as JSON; the tests then read them.

Used by tests/gpu/test_inference.py and tests/gpu/test_zero_copy.py, run with expandable segments and the
committed registry for the job's rank count (bench/registry_h200x<N>).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from weftcore.rendezvous import rendezvous_port

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def registry_for(nranks: int) -> Path:
    return ROOT / "bench" / f"registry_h200x{nranks}"


def run_job(script: str, label: str, tmp_path_factory, env: dict[str, str] | None = None) -> list[dict]:
    """Every rank's results from one run of ``script`` (skips without the GPUs or the registry). ``env`` adds to
    or overrides the ranks' environment (a job's own WEFT_REGISTRY and WEFT_TOPOLOGY)."""
    from conftest import JOB_S, gpu_count, job_env, nproc, wait_all

    n = nproc()
    if gpu_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs with torch and CuPy")
    if not registry_for(n).is_dir() and "WEFT_REGISTRY" not in (env or {}):
        pytest.skip(f"no committed registry {registry_for(n)}")
    out = tmp_path_factory.mktemp(label)
    port = str(rendezvous_port())
    procs = []
    for rank in range(n):
        rank_env = {
            **job_env(rank, n, port),
            "WEFT_REGISTRY": str(registry_for(n)),
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            **(env or {}),
        }
        procs.append(subprocess.Popen([sys.executable, script, str(out)], env=rank_env))
    codes = wait_all(procs, JOB_S)
    assert codes == [0] * n, f"{label} worker exit codes {codes}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def each(results: list[dict], scenario: str) -> list[dict]:
    """Every rank's row of ``scenario``, failing with the rank's traceback where the scenario raised."""
    rows = [r[scenario] for r in results]
    for rank, row in enumerate(rows):
        assert "error" not in row, f"rank {rank}: {row.get('trace', row['error'])}"
    return rows


class LogLines(logging.Handler):
    """The messages logged while a scenario runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def sums_to(out, x, residual=None, scatter: bool = False) -> bool:
    """Whether ``out`` is NCCL's all-reduce (with ``scatter``, reduce-scatter) of every rank's ``x``, plus
    ``residual``, up to the rounding two correct sums may differ by (``executor.gpu.bench.within_rounding``)."""
    import torch
    import torch.distributed as dist

    from executor.gpu.bench import nccl_result, within_rounding

    collective, world = ("reducescatter" if scatter else "allreduce"), dist.get_world_size()
    ref, magnitude = nccl_result(collective, x, world), nccl_result(collective, x.float().abs(), world)
    if residual is not None:
        ref, magnitude = ref + residual, magnitude + residual.float().abs()
    dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[x.dtype]
    return within_rounding(out, ref, magnitude, dtype, world + (residual is not None))


def three_collectives_wrong(comm, x, world: int) -> dict[str, int]:
    """Run ``comm``'s all-reduce, all-gather and reduce-scatter on ``x``; 1 for each whose result is not NCCL's."""
    import torch
    import torch.distributed as dist

    wrong = {"all_reduce": int(not sums_to(comm.all_reduce(x), x))}
    gathered, ref = (torch.empty(world * x.numel(), device=x.device, dtype=x.dtype) for _ in range(2))
    comm.all_gather_into_tensor(gathered, x)
    dist.all_gather_into_tensor(ref, x)
    wrong["all_gather_into_tensor"] = int(not torch.equal(gathered, ref))
    scattered = torch.empty(x.numel() // world, device=x.device, dtype=x.dtype)
    comm.reduce_scatter_tensor(scattered, x)
    wrong["reduce_scatter_tensor"] = int(not sums_to(scattered, x, scatter=True))
    return wrong


def replayed_before_registration(comm, x) -> tuple[Any, Any, str]:
    """One ``comm.all_reduce(x)`` captured in a CUDA graph inside ``comm.capture()`` and replayed there, before its
    buffers are registered (a disarmed record: no plan op runs, and leaving the block raises): the graph, its output
    tensor and the error's text ('' where nothing was raised). The size's context is made first, outside."""
    import torch

    from executor.errors import ExecutorError

    comm.all_reduce(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    raised = ""
    try:
        with comm.capture():
            with torch.cuda.graph(graph):
                out = comm.all_reduce(x)
            graph.replay()
            torch.cuda.synchronize()
    except ExecutorError as e:
        raised = str(e)
    return graph, out, raised


def start_rank(seed: int):
    """This process as one rank of the job: (rank, world, device, the weft.inference log, results directory)."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(seed + rank)
    log = LogLines()
    logging.getLogger("weft.inference").addHandler(log)
    return rank, world, device, log, Path(sys.argv[1])


def run_scenarios(rank: int, out_dir: Path, scenarios: dict[str, Callable[[], dict]]) -> None:
    """Run each scenario, recording an exception as its result so that one failure does not hide the others.
    Where WEFT_TEST_TIMINGS names a file (bench/gpu_gate.sh sets it), rank 0 appends each scenario's seconds to it as
    a JSON line: a passing job's log shows no times, and these jobs are most of the GPU suite's minutes. A scenario
    whose result holds ``phases_s`` (phase: seconds) has them in its line too."""
    results = {}
    timings = os.environ.get("WEFT_TEST_TIMINGS") if rank == 0 else None
    for name, run in scenarios.items():
        start = time.monotonic()
        try:
            results[name] = run()
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        seconds = round(time.monotonic() - start, 2)
        print(f"rank {rank}: {name} ({seconds} s): {json.dumps(results[name])[:600]}", flush=True)
        if timings:
            row = {"job": Path(sys.argv[0]).name, "scenario": name, "world": os.environ.get("WORLD_SIZE")}
            with open(timings, "a") as f:
                phases = results[name].get("phases_s") if isinstance(results[name], dict) else None
                f.write(json.dumps({**row, "seconds": seconds, **({"phases_s": phases} if phases else {})}) + "\n")
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1))


def communicator_job(seed: int, scenarios: Callable[[Any, Any, int], dict[str, Callable[[], dict]]]) -> None:
    """This process as one rank of a job over ``Communicator.from_process_group()``: run every scenario of
    ``scenarios(comm, device, rank)`` (``run_scenarios``), then close the communicator and the process group."""
    import torch.distributed as dist

    from executor import Communicator

    rank, _, device, _, out_dir = start_rank(seed)
    comm = Communicator.from_process_group()
    run_scenarios(rank, out_dir, scenarios(comm, device, rank))
    comm.close()
    dist.destroy_process_group()
