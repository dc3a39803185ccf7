"""Plans compiled to kernels (executor.gpu.compiled) on real GPUs: every plan of tests/gpu/plans (2 ranks) or plans4
(``WEFT_GPU_NPROC=4``), in fp32, fp16 and bf16, on random non-zero data, compiled and interpreted on one context in
turn: the compiled kernel's output must equal the interpreter's bit for bit (both sum in the plan's order), and
all-reduce's must match NCCL's. The engine's ``precompile`` builds every one of those kernels first, NVRTC builds side
by side, and the calls then build none; then zero-copy CUDA graphs of compiled all-reduces, replayed on fresh inputs.

The Lamport plans (the protocol whose data is its own flag) are made here before the job starts, in the shapes
whose kernels differ: a multi-peer one-shot of 128 threads (the batch kernel, its peers' units fetched together), one
of 512 (the 1024-thread bounds), a two-shot of 512, and a per-peer one-shot of 1024; each runs at its granule x 4
and at a size where every thread moves several groups of units.

Last, the torch-facing ``Communicator`` made with ``compiled=True`` over the committed registry serves all-reduce,
all-gather and reduce-scatter through compiled kernels; and one made without it, on a copy of that registry where
one size was measured faster compiled (``measured_compiled_us``), runs that size's plan compiled (selection, not a
switch), eager and in a zero-copy graph, and the other sizes interpreted. One job (a process per GPU) runs every
scenario; it needs CuPy with NVRTC (the kernels are built at run time).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from torch_job import each, registry_for, run_job, run_scenarios, start_rank, sums_to, three_collectives_wrong

HERE = Path(__file__).parent
DTYPES = ("fp32", "fp16", "bf16")
GRAPH_PLANS = ("allreduce-direct-ll-x8", "allreduce-twoshot-simple-x8", "allreduce-direct-ll-x4-mp")
REPLAYS = 4
LAMPORT_ENV = "WEFT_TEST_COMPILED_LAMPORT"  # the folder of the Lamport plans made for the job (``results``)
# (method, instances, options) of those plans, and the sizes each runs at, in granules
LAMPORT_SHAPES: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("direct", 8, {"threads": 128, "multipeer": True}),
    ("direct", 8, {"threads": 512, "multipeer": True}),
    ("twoshot", 8, {"threads": 512}),
    ("direct", 4, {}),
)
LAMPORT_GRANULES = (4, 2048)


def plan_folder(nranks: int) -> Path:
    return HERE / ("plans" if nranks == 2 else f"plans{nranks}")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    from conftest import nproc

    env = {"WEFT_REGISTRY": str(plan_folder(nproc())), "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    env[LAMPORT_ENV] = str(_lamport_plans(tmp_path_factory.mktemp("compiled-lamport"), nproc()))
    return run_job(__file__, "compiled", tmp_path_factory, env)


def _lamport_plans(folder: Path, nranks: int) -> Path:
    """LAMPORT_SHAPES for ``hgx_h200:gpus=<nranks>``, each proven by the CPU reference, written as plan files."""
    from schedules.plan.io import save_plan_file
    from topologies.catalog import build
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    topology = build(f"hgx_h200:gpus={nranks}")
    for method, instances, options in LAMPORT_SHAPES:
        plan = compile_and_verify(
            synthesize(topology, "allreduce", method), topology, instances, protocol="lamport", **options
        )
        save_plan_file(plan, folder / f"{plan.name.replace(':', '_')}.json")
    return folder


@pytest.mark.gpu
def test_compiled_kernels_equal_the_interpreter_bit_for_bit(results):
    for row in each(results, "eager"):
        assert row["cases"] > 0
        assert row["differ"] == [], row["differ"]  # (plan, dtype) whose compiled output was not the interpreter's
        assert row["refused"] == {}, row["refused"]  # every test plan is compiled (none falls back)


@pytest.mark.gpu
def test_compiled_ll128_lines_equal_the_interpreters_and_nccl(results):
    from conftest import nproc

    for row in each(results, "eager"):
        assert row["lines_cases"] > 0 and row["lines_differ"] == [] and row["lines_not_nccl"] == [], row
        assert row["lines_refused"] == {}, row  # every case ran its own kernel, none fell back to the interpreter
        if nproc() > 2:  # a one-shot's sum of four sources: the grouped polls ran
            assert row["lines_grouped_plans"] > 0, row


@pytest.mark.gpu
def test_the_lamport_plans_ran_compiled_in_every_shape(results):
    for row in each(results, "eager"):
        assert row["lamport_cases"] == len(LAMPORT_SHAPES) * len(DTYPES) * len(LAMPORT_GRANULES), row


@pytest.mark.gpu
def test_precompile_builds_every_kernel_before_the_first_call(results):
    for row in each(results, "eager"):
        assert row["precompile_refused"] == {}, row["precompile_refused"]
        assert row["built_after"] == [], row["built_after"]  # the calls found every kernel built


@pytest.mark.gpu
def test_compiled_all_reduce_matches_nccl(results):
    for row in each(results, "eager"):
        assert row["not_nccl"] == [], row["not_nccl"]


@pytest.mark.gpu
def test_compiled_kernels_replay_in_zero_copy_graphs(results):
    for row in each(results, "graph"):
        assert row["replays"] > 0 and row["wrong"] == [], row


@pytest.mark.gpu
def test_the_communicator_serves_calls_through_compiled_kernels(results):
    for row in each(results, "communicator"):
        assert row["wrong"] == {"all_reduce": 0, "all_gather_into_tensor": 0, "reduce_scatter_tensor": 0}, row
        assert row["weft_calls"] > 0 and row["refused"] == {}, row


@pytest.mark.gpu
def test_selection_runs_a_plan_compiled_only_where_it_was_measured_faster_so(results):
    for row in each(results, "selected"):
        assert row["compiled_at"] == {"selected": True, "other": False}, row
        assert row["kernels"] > 0 and row["refused"] == {}, row  # the selected size built (or loaded) its kernel
        assert row["wrong"] == {"eager": 0, "graph": 0} and row["zero_copy"] == 1, row


# ------------------------------------------------------------------------------------------ the job (each rank)


def _types():
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _input(n: int, dtype: str, device, rank: int, seed: int):
    import torch

    gen = torch.Generator(device=device).manual_seed(1000 * seed + rank)
    x = torch.randn(n, generator=gen, device=device, dtype=torch.float32)
    return torch.where(x == 0, 1.0, x).to(_types()[dtype])


def _elements(plan, nbytes: int, dtype: str, rank: int) -> int:
    return plan.gpus[rank].input_chunks * plan.chunk_bytes(nbytes) // (4 if dtype == "fp32" else 2)


def _bits(t):
    import torch

    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def scenario_eager(comm, folder: Path, rank: int, device) -> dict:
    from executor.gpu.compiled import build
    from schedules.plan.io import load_plan

    plans = [p for p in (load_plan(path) for path in sorted(folder.glob("*.json"))) if not p.inplace]
    sized = [(plan, plan.granule * 4) for plan in plans]
    lamport = sorted(Path(os.environ[LAMPORT_ENV]).glob("*.json")) if LAMPORT_ENV in os.environ else []
    sized += [(plan, plan.granule * g) for plan in map(load_plan, lamport) for g in LAMPORT_GRANULES]
    calls = [(plan, nbytes, dtype) for plan, nbytes in sized for dtype in DTYPES if dtype in plan.weft.dtypes]
    start = time.perf_counter()
    precompile_refused = comm.precompile(calls, lines=True)  # every kernel below, lines too, side by side
    precompile_s = time.perf_counter() - start
    built_after: list[str] = []  # kernels the calls below had to build: none, once precompile built them
    nvrtc = build.nvrtc_cubin

    def counted(source, *args, **kwargs):
        built_after.append(source.entry)
        return nvrtc(source, *args, **kwargs)

    build.nvrtc_cubin = counted
    try:
        row = _eager_cases(comm, sized, rank, device)
        row |= _lines_cases(comm, sized, rank, device)  # kernels of their own, which precompile built as well
    finally:
        build.nvrtc_cubin = nvrtc
    return {**row, "precompile_refused": precompile_refused, "precompile_s": precompile_s, "built_after": built_after}


def _lines_cases(comm, sized: list, rank: int, device) -> dict:
    """Each LL plan of ``sized`` with its packets as LL128 lines, in every dtype it runs: interpreted, then compiled
    (a compiled op of more than two sources polls them together, line by line: channel.cuh's load_line_group)."""
    from executor.gpu.tables import build_tables, lines_possible

    lined = [(plan, nbytes) for plan, nbytes in sized if lines_possible(plan, nbytes)]
    grouped = 0
    for plan, nbytes in lined:
        tables = build_tables(plan, rank, nbytes, lines=True)
        grouped += bool(((tables.ops["nsrc"] > 2) & (tables.ops["line_chunk"] > 0)).any())
    row = _eager_cases(comm, lined, rank, device, lines=True)
    return {f"lines_{key}": row[key] for key in ("cases", "differ", "not_nccl", "refused")} | {
        "lines_grouped_plans": grouped
    }


def _eager_cases(comm, sized: list, rank: int, device, lines: bool = False) -> dict:
    """Each (plan, bytes) of ``sized`` in every dtype it runs: interpreted, then compiled, on one context (with
    ``lines``, an LL plan's packets as LL128 lines both times)."""
    import torch

    differ, not_nccl, refused, cases, lamport = [], [], {}, 0, 0
    for plan, nbytes in sized:
        for k, dtype in enumerate(DTYPES):
            if dtype not in plan.weft.dtypes:
                continue
            x = _input(_elements(plan, nbytes, dtype, rank), dtype, device, rank, k + (20 if lines else 0))
            mode = {"lines": True} if lines else {}  # without: the engine's own default, as before
            interpreted = comm.execute(plan, x, compiled=False, **mode).clone()
            compiled = comm.execute(plan, x, compiled=True, **mode).clone()
            comm.synchronize()
            cases += 1
            lamport += plan.protocol == "Lamport"
            label = f"{plan.name}{'+ll128' if lines else ''}-{nbytes}B-{dtype}"
            why = comm.compiled_refused.get(plan.content_hash)
            if why:
                refused[label] = why
            if not torch.equal(_bits(interpreted), _bits(compiled)):
                differ.append(label)
            if plan.collective == "allreduce" and not sums_to(compiled, x):
                not_nccl.append(label)
    return {"cases": cases, "differ": differ, "not_nccl": not_nccl, "refused": refused, "lamport_cases": lamport}


def scenario_graph(comm, folder: Path, rank: int, device) -> dict:
    """Each plan compiled, captured zero-copy on buffers of the graph's own and replayed on fresh inputs."""
    import torch

    from schedules.plan.io import load_plan

    wrong, replays = [], 0
    for name in GRAPH_PLANS:
        path = folder / f"{name}.json"
        if not path.exists():
            continue
        plan = load_plan(path)
        n = _elements(plan, plan.granule * 4, "bf16", rank)
        comm.execute(plan, _input(n, "bf16", device, rank, 7), compiled=True)  # the context and its kernel
        comm.synchronize()
        x = _input(n, "bf16", device, rank, 8)
        out = torch.empty_like(x)
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with comm.capture(), torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            why = comm.execute_captured(plan, x, out, compiled=True)
        if why:
            wrong.append(f"{name}: not captured: {why}")
            continue
        for replay in range(REPLAYS):
            x.copy_(_input(n, "bf16", device, rank, 20 + replay))
            torch.cuda.synchronize()
            graph.replay()
            comm.synchronize()
            replays += 1
            if not sums_to(out, x):
                wrong.append(f"{name}: replay {replay}")
    return {"replays": replays, "wrong": wrong}


def scenario_communicator(world: int, device) -> dict:
    """``Communicator.from_process_group(compiled=True)`` on the committed registry and its topology: the calls it
    serves with plans run compiled (none refused), with NCCL's results."""
    import torch

    from executor import Communicator

    comm = Communicator.from_process_group(
        registry=str(registry_for(world)), topology=f"hgx_h200:gpus={world}", compiled=True
    )
    try:
        wrong = three_collectives_wrong(comm, torch.randn(32 * 1024, device=device, dtype=torch.bfloat16), world)
        refused = dict(comm.engine.compiled_refused) if comm.engine is not None else {"engine": "did not start"}
        weft_calls = sum(n for path, n in comm.paths.items() if path != "nccl")
        return {"wrong": wrong, "refused": refused, "weft_calls": weft_calls}
    finally:
        comm.close()


SELECTED_BYTES = 64 << 10  # the size recorded faster compiled in scenario_selected's registry


def scenario_selected(world: int, device, rank: int, out_dir: Path) -> dict:
    """A Communicator on the interpreter (no ``compiled`` switch) over a copy of the committed registry, its compiled
    times taken out, where every all-reduce plan measured at SELECTED_BYTES was then measured compiled, at half its
    time: that size runs compiled (``mode_for``; the engine gets its kernel), eager and captured zero-copy, with
    NCCL's sums; 1 MB, with no compiled time, stays interpreted."""
    import shutil

    import torch

    from executor import Communicator
    from executor.gpu import compiled
    from registry.store import Registry

    copy = out_dir / f"registry-selected-{rank}"  # each rank its own copy, the same times: the same choice
    shutil.copytree(registry_for(world), copy)
    for path in (copy / "entries").glob("*.json"):  # the committed registry's compiled times out: this one's only
        doc = json.loads(path.read_text())
        for table in ("measured_compiled_us", "measured_ll128_compiled_us"):
            doc.get("timings", {}).pop(table, None)
        path.write_text(json.dumps(doc))
    registry = Registry(str(copy))
    registry.rebuild_index()
    for entry in registry.entries(collective="allreduce"):
        if SELECTED_BYTES in entry.measured_us:
            registry.record_timing(entry.id, SELECTED_BYTES, entry.measured_us[SELECTED_BYTES] / 2, compiled=True)
    kernels = []
    kernel_for = compiled.kernel_for

    def counted(*args, **kwargs):
        kernels.append(1)
        return kernel_for(*args, **kwargs)

    compiled.kernel_for = counted
    comm = Communicator.from_process_group(registry=str(copy), topology=f"hgx_h200:gpus={world}")
    try:
        compiled_at = {
            name: comm.mode_for("allreduce", nbytes, torch.bfloat16).compiled
            for name, nbytes in (("selected", SELECTED_BYTES), ("other", 1 << 20))
        }
        x = torch.randn(SELECTED_BYTES // 2, device=device, dtype=torch.bfloat16)
        wrong = {"eager": int(not sums_to(comm.all_reduce(x.clone()), x))}
        before = comm.paths["zero_copy"]
        with comm.capture():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = comm.all_reduce(x)
        zero_copy = comm.paths["zero_copy"] - before
        bad = 0
        for k in range(4):
            x.copy_(torch.randn(x.numel(), generator=torch.Generator(device=device).manual_seed(50 + k), device=device))
            graph.replay()
            bad += not sums_to(out, x)
        torch.cuda.synchronize()
        wrong["graph"] = bad
        refused = dict(comm.engine.compiled_refused) if comm.engine is not None else {"engine": "did not start"}
        row = {"compiled_at": compiled_at, "kernels": len(kernels), "refused": refused, "wrong": wrong}
        return {**row, "zero_copy": zero_copy}
    finally:
        compiled.kernel_for = kernel_for
        comm.close()


def main() -> None:
    import torch.distributed as dist

    from executor.gpu.engine import InterpreterEngine

    rank, world, device, _, out_dir = start_rank(seed=34)
    folder = plan_folder(world)
    timeout = float(os.environ.get("WEFT_TEST_TIMEOUT", "30"))
    comm = InterpreterEngine.from_process_group(timeout_s=timeout)
    graphs = InterpreterEngine.from_process_group(timeout_s=timeout)
    run_scenarios(
        rank,
        out_dir,
        {
            "eager": lambda: scenario_eager(comm, folder, rank, device),
            "graph": lambda: scenario_graph(graphs, folder, rank, device),
            "communicator": lambda: scenario_communicator(world, device),
            "selected": lambda: scenario_selected(world, device, rank, out_dir),
        },
    )
    for c in (comm, graphs):
        c.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
