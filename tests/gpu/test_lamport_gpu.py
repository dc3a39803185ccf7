"""The interpreter's Lamport kernel (executor.gpu.lamport) on real GPUs, against NCCL: one-shot and two-shot
all-reduce plans compiled with ``--protocol lamport``, in fp32, fp16 and bf16, on random never-zero data that holds
-0.0 inputs (the sentinel a sender must map), over back-to-back calls and CUDA-graph replays, so that every one of
the three scratch copies is reset and reused at least twice; the fused call (the residual add and the RMSNorm
epilogue in the same launch) on the one-shot, rows whole and split over blocks, against NCCL's sum and the
epilogue's definition, with the two-shot's residual and its refusal of the norm; and the same plans chosen by the
Communicator from a registry that holds them alone: eager calls on its staging buffers (a padded size too), a
zero-copy CUDA graph captured in ``comm.capture()``, and the fused norm.

One job (a process per GPU, ``WEFT_GPU_NPROC`` of them: run it at 2 and at 4) runs every scenario. Its plans are
compiled and proven by the CPU reference here, before the job starts, for ``hgx_h200:gpus=N``, and committed to a
registry of their own with times that make the one-shot the choice up to 64 KB and the two-shot above.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch_job import each, replayed_before_registration, run_job, run_scenarios, start_rank, sums_to

METHODS = ("direct", "twoshot")  # one-shot and two-shot all-reduce
DTYPES = ("fp32", "fp16", "bf16")
SIZES = ("1KB", "64KB", "1MB", "3MB+48")
CALLS = 7  # back to back on one context: each of the 3 copies is used, reset and used again twice over
REPLAYS = 8  # graph replays of GRAPH_CALLS captured calls each
GRAPH_CALLS = 3
NEGATIVE_ZEROS = 0.1  # the share of each input's elements set to -0.0 (and one element -0.0 on every rank)
PLANS_ENV = "WEFT_TEST_LAMPORT_PLANS"
# the Communicator's scenario: bf16 elements a call (1026 B is no multiple of the plans' granule: it runs padded),
# and the largest size at which the registry's times make it choose the one-shot
COMM_SIZES = {"1KB": 512, "64KB": 32768, "1MB": 1 << 19, "padded": 513}
COMM_ONE_SHOT_MAX = 64 << 10
# the fused call (residual add + RMSNorm in the all-reduce's launch): rows of HIDDEN, tokens per call, the one-shot
# plans it runs (SPLIT: a one-shot of 2 instances, whose rows of one token are split over 2 blocks: kNormSlice)
HIDDEN, EPS = 1024, 1e-5
TOKENS = (1, 16)
SPLIT = "direct-x2"
FUSED_PLANS = ("direct", SPLIT)
# the epilogue's bound, relative: an ulp of fp16 and bf16 (as tests/gpu/test_fused_norm.py), and for fp32 the few
# dozen ulps by which the GPU's sum of squares in another order can move rstd (a wrong row is off by far more)
BOUNDS = {"fp32": 2.0**-18, "fp16": 2.0**-10, "bf16": 2.0**-7}


def case_ids() -> list[str]:
    return [f"{m}-{d}-{s}" for m in METHODS for d in DTYPES for s in SIZES]


def _plans(folder: Path, nranks: int) -> None:
    """The Lamport one-shot and two-shot plans for this many ranks, each proven by the CPU reference over every
    copy's reuse (``compile_and_verify``), written as ``<method>.json``."""
    from schedules.plan.io import dumps_plan
    from topologies.catalog import build
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    topology = build(f"hgx_h200:gpus={nranks}")
    for method in METHODS:
        plan = compile_and_verify(synthesize(topology, "allreduce", method), topology, protocol="lamport")
        (folder / f"{method}.json").write_text(dumps_plan(plan))
    split = compile_and_verify(synthesize(topology, "allreduce", "direct"), topology, instances=2, protocol="lamport")
    (folder / f"{SPLIT}.json").write_text(dumps_plan(split))  # its rows of one token split over 2 blocks
    _registry(folder, topology)


def _registry(folder: Path, topology) -> None:
    """The one-shot and two-shot committed to ``folder/registry``, the one-shot measured faster up to 64 KB and the
    two-shot above (made-up times: they only steer the Communicator's choice)."""
    from registry.store import Registry
    from schedules.plan.io import load_plan
    from weft import publish
    from weft.synthesis import synthesize

    location = str(folder / "registry")
    for method in METHODS:
        schedule = synthesize(topology, "allreduce", method)
        publish.commit(load_plan(folder / f"{method}.json"), topology, location, schedule)
    registry = Registry(location)
    ids = {e.plan.weft.solver: e.id for e in registry.entries()}
    for nbytes in (1 << 10, 64 << 10, 1 << 20, 4 << 20):
        small = nbytes <= COMM_ONE_SHOT_MAX
        registry.record_timing(ids["direct"], nbytes, 1.0 if small else 2.0)
        registry.record_timing(ids["twoshot"], nbytes, 2.0 if small else 1.0)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    from conftest import gpu_count, nproc

    if gpu_count() < nproc():
        pytest.skip(f"needs {nproc()} CUDA GPUs with torch and CuPy")
    folder = tmp_path_factory.mktemp("lamport-plans")
    _plans(folder, nproc())
    # no registry: the job runs its own plans through InterpreterEngine
    env = {
        PLANS_ENV: str(folder),
        "WEFT_REGISTRY": str(folder / "registry"),
        "WEFT_TOPOLOGY": f"hgx_h200:gpus={nproc()}",
        # the scenarios hand torch tensors to the engine itself, which shares them by CUDA IPC: memory from
        # expandable segments cannot be (only the Communicator stages such tensors)
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
    }
    return run_job(__file__, "lamport", tmp_path_factory, env)


@pytest.mark.gpu
@pytest.mark.parametrize("case", case_ids())
def test_lamport_all_reduce_matches_nccl_over_back_to_back_calls(results, case):
    for row in each(results, "eager"):
        r = row[case]
        assert r["calls"] == CALLS and r["wrong"] == [], r  # the calls (0-based) whose output was not NCCL's


@pytest.mark.gpu
@pytest.mark.parametrize("case", case_ids())
def test_lamport_all_reduce_matches_nccl_with_each_call_checked_before_the_next(results, case):
    for row in each(results, "checked"):
        r = row[case]
        assert r["calls"] == CALLS and r["wrong"] == [], r


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
def test_lamport_graph_replays_rotate_the_copies_on_the_device(results, method):
    for row in each(results, "graph"):
        r = row[method]
        assert r["replays"] == REPLAYS and r["calls"] == GRAPH_CALLS and r["wrong"] == 0, r


def fused_ids() -> list[str]:
    return [f"{p}-{d}-{t}" for p in FUSED_PLANS for d in DTYPES for t in TOKENS]


@pytest.mark.gpu
@pytest.mark.parametrize("case", fused_ids())
def test_the_fused_lamport_call_returns_the_residual_sum_and_its_norm_over_back_to_back_calls(results, case):
    """CALLS fused calls on one context (every copy reset and reused): each call's new residual is NCCL's sum plus
    the residual, and its normalized rows within BOUNDS of the epilogue's definition."""
    for row in each(results, "fused"):
        r = row[case]
        assert r["calls"] == CALLS and r["residual_wrong"] == [] and r["normed_off"] == [], r


@pytest.mark.gpu
def test_a_graph_of_fused_lamport_calls_replays_on_new_values(results):
    for row in each(results, "fused_graph"):
        assert row["replays"] == REPLAYS and row["calls"] == GRAPH_CALLS and row["wrong"] == 0, row


@pytest.mark.gpu
def test_the_lamport_two_shot_adds_the_residual_and_refuses_the_norm_in_one_line(results):
    for row in each(results, "twoshot_residual"):
        assert row["calls"] == CALLS and row["residual_wrong"] == [], row
        assert "writes an output other than by its rank's own sum" in row["norm_refused"], row
        assert "\n" not in row["norm_refused"]


@pytest.mark.gpu
@pytest.mark.parametrize("size", list(COMM_SIZES))
def test_the_communicator_chooses_the_lamport_plans_and_its_back_to_back_calls_match_nccl(results, size):
    for row in each(results, "communicator"):
        r = row[size]
        want = "direct" if 2 * COMM_SIZES[size] <= COMM_ONE_SHOT_MAX else "twoshot"
        assert r["protocol"] == "Lamport" and r["plan"].startswith(want), r
        assert r["calls"] == CALLS and r["wrong"] == [], r


@pytest.mark.gpu
def test_a_zero_copy_graph_of_lamport_calls_replays_on_new_values(results):
    for row in each(results, "communicator"):
        r = row["capture"]
        assert r["paths"] == {"zero_copy": GRAPH_CALLS, "staging": 0, "nccl": 0}, r
        assert r["replays"] == REPLAYS and r["wrong"] == 0, r


@pytest.mark.gpu
def test_a_lamport_graph_replayed_before_registration_leaves_the_copies_in_step(results):
    for row in each(results, "communicator"):
        r = row["early_replay"]
        assert "before their buffers were registered" in r["raised"], r
        assert r["replays"] == REPLAYS and r["wrong_after"] == 0, r


@pytest.mark.gpu
def test_the_communicators_fused_norm_runs_on_the_lamport_one_shot(results):
    for row in each(results, "communicator"):
        r = row["fused"]
        assert r["protocol"] == "Lamport" and r["calls"] == CALLS, r
        assert r["residual_wrong"] == [] and r["normed_off"] == [], r


# ------------------------------------------------------------------------------------------ the job (each rank)


def _input(n: int, dtype: str, device, rank: int, call: int):
    """Random non-zero data with about NEGATIVE_ZEROS of it -0.0, and element 0 -0.0 on every rank (its sum is a
    zero whose every contribution is the sentinel). Every rank allocates alike (contexts are cached by address)."""
    import torch

    types = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    gen = torch.Generator(device=device).manual_seed(1000 * call + rank)
    x = torch.randn(n, generator=gen, device=device, dtype=torch.float32)
    x = torch.where(x == 0, 1.0, x)
    negative = torch.rand(n, generator=gen, device=device) < NEGATIVE_ZEROS
    negative[0] = True
    x = torch.where(negative, torch.full_like(x, -0.0), x).to(types[dtype])
    return x


def _elements(plan, nbytes: int, dtype: str, rank: int) -> int:
    return plan.gpus[rank].input_chunks * plan.chunk_bytes(nbytes) // (4 if dtype == "fp32" else 2)


def _cases(folder: Path):
    from schedules.plan.io import load_plan
    from weft.units import parse_bytes

    for method in METHODS:
        plan = load_plan(folder / f"{method}.json")
        for dtype in DTYPES:
            for size in SIZES:
                nbytes = parse_bytes(size)
                assert plan.accepts(nbytes) and plan.chunk_bytes(nbytes) % (4 if dtype == "fp32" else 2) == 0
                yield f"{method}-{dtype}-{size}", plan, nbytes, dtype


def scenario_eager(comm, folder: Path, rank: int, device) -> dict:
    """CALLS calls on one input buffer with no host synchronization between them: each call's input is copied in
    and its output copied out on the stream, so peers run as far ahead as the plan lets them."""
    rows = {}
    for case, plan, nbytes, dtype in _cases(folder):
        rows[case] = {"calls": CALLS, "wrong": back_to_back(comm, plan, nbytes, dtype, rank, device)}
    return rows


def back_to_back(comm, plan, nbytes: int, dtype: str, rank: int, device) -> list[int]:
    """The calls (0-based) of CALLS back to back on one input buffer whose output was not the sum."""
    n = _elements(plan, nbytes, dtype, rank)
    inputs = [_input(n, dtype, device, rank, call) for call in range(CALLS)]
    x = inputs[0].clone()
    comm.execute(plan, x)  # the context (scratch filled with the sentinel) and its first call
    comm.synchronize()
    outs = []
    for call in range(CALLS):
        x.copy_(inputs[call])
        outs.append(comm.execute(plan, x).clone())
    comm.synchronize()
    return [call for call in range(CALLS) if not sums_to(outs[call], inputs[call])]


def scenario_checked(comm, folder: Path, rank: int, device) -> dict:
    """CALLS calls on one input buffer, each output checked against NCCL before the next call."""
    rows = {}
    for case, plan, nbytes, dtype in _cases(folder):
        n = _elements(plan, nbytes, dtype, rank)
        x = _input(n, dtype, device, rank, 0)
        wrong = []
        for call in range(CALLS):
            x.copy_(_input(n, dtype, device, rank, 100 + call))
            out = comm.execute(plan, x)
            comm.synchronize()
            if not sums_to(out, x):
                wrong.append(call)
        rows[case] = {"calls": CALLS, "wrong": wrong}
    return rows


def scenario_graph(comm, folder: Path, rank: int, device) -> dict:
    """GRAPH_CALLS calls captured in one CUDA graph (sharing one context's scratch and device epochs), replayed
    REPLAYS times on fresh inputs: the copy each call uses comes from the epoch on the device, not the frozen
    kernel arguments."""

    from schedules.plan.io import load_plan
    from weft.units import parse_bytes

    rows = {}
    for method in METHODS:
        plan = load_plan(folder / f"{method}.json")
        n = _elements(plan, parse_bytes("64KB"), "bf16", rank)
        options: list[dict] = [{} for _ in range(GRAPH_CALLS)]
        wrong = replayed(comm, plan, n, rank, device, 200, options, lambda out, x, k: sums_to(out, x))
        rows[method] = {"replays": REPLAYS, "calls": GRAPH_CALLS, "wrong": wrong}
    return rows


def replayed(comm, plan, n: int, rank: int, device, seed: int, options: list[dict], right) -> int:
    """GRAPH_CALLS bf16 calls of ``plan`` (call k with ``options[k]``: a residual, a norm) captured in one CUDA graph
    after a call each outside it (their contexts), replayed REPLAYS times on fresh inputs (from ``seed``); the calls
    whose output ``right(out, x, k)`` refused, over every replay."""
    import torch

    inputs = [_input(n, "bf16", device, rank, call) for call in range(GRAPH_CALLS)]
    for x, o in zip(inputs, options, strict=True):  # the contexts, outside the capture
        comm.execute(plan, x, **o)
    comm.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        outs = [comm.execute(plan, x, **o) for x, o in zip(inputs, options, strict=True)]
    wrong = 0
    for replay in range(REPLAYS):
        for k, x in enumerate(inputs):
            x.copy_(_input(n, "bf16", device, rank, seed + GRAPH_CALLS * replay + k))
        torch.cuda.synchronize()
        graph.replay()
        comm.synchronize()
        wrong += sum(not right(out, x, k) for k, (out, x) in enumerate(zip(outs, inputs, strict=True)))
    return wrong


def _shared(n: int, dtype: str, device, seed: int):
    """The same values on every rank (a residual stream, a norm weight)."""
    import torch

    types = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(types[dtype])


def normed_off(normed, new_residual, weight, dtype: str) -> int:
    """Elements of ``normed`` further from the epilogue's definition (``executor.reference.norm.rms_norm``: fp32
    mean of squares, x * rstd, then * weight, rounded once) than the dtype's bound (``BOUNDS``, relative)."""
    import torch

    x = new_residual.float().view(-1, HIDDEN)
    rstd = 1.0 / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True).float() + EPS)
    want = ((x * rstd) * weight.float()).to(normed.dtype).float().view(-1)
    bound = torch.clamp(want.abs(), min=2.0**-14) * BOUNDS[dtype]
    return int(((normed.float() - want).abs() > bound).sum())


def fused_calls(comm, plan, tokens: int, dtype: str, rank: int, device, norm: bool = True) -> dict:
    """CALLS fused calls back to back on one input buffer (no host synchronization between them), each with its
    own input, one residual and weight; the calls (0-based) whose new residual or normalized rows were wrong."""
    import torch

    from executor.gpu.engine import NormCall
    from executor.reference.norm import RowNorm

    n = tokens * HIDDEN
    h = _shared(n, dtype, device, seed=3)
    weight = (1.0 + 0.1 * _shared(HIDDEN, "fp32", device, seed=7)).to(h.dtype)
    call = NormCall(RowNorm(HIDDEN, EPS), weight, torch.empty_like(h)) if norm else None
    inputs = [_input(n, dtype, device, rank, 300 + k) for k in range(CALLS)]
    x = inputs[0].clone()
    comm.execute(plan, x, residual=h, norm=call)  # the context (scratch filled with the sentinel) and its first call
    comm.synchronize()
    outs, normed = [], []
    for k in range(CALLS):
        x.copy_(inputs[k])
        outs.append(comm.execute(plan, x, residual=h, norm=call).clone())
        if call is not None:
            normed.append(call.normed.clone())
    comm.synchronize()
    return {
        "calls": CALLS,
        "residual_wrong": [k for k in range(CALLS) if not sums_to(outs[k], inputs[k], residual=h)],
        "normed_off": [k for k in range(len(normed)) if normed_off(normed[k], outs[k], weight, dtype)],
    }


def scenario_fused(comm, folder: Path, rank: int, device) -> dict:
    from schedules.plan.io import load_plan

    rows = {}
    for name in FUSED_PLANS:
        plan = load_plan(folder / f"{name}.json")
        for dtype in DTYPES:
            for tokens in TOKENS:
                rows[f"{name}-{dtype}-{tokens}"] = fused_calls(comm, plan, tokens, dtype, rank, device)
    return rows


def scenario_fused_graph(comm, folder: Path, rank: int, device) -> dict:
    """GRAPH_CALLS fused calls (bf16, 4 tokens) captured in one graph, replayed REPLAYS times on new inputs."""
    import torch

    from executor.gpu.engine import NormCall
    from executor.reference.norm import RowNorm
    from schedules.plan.io import load_plan

    plan = load_plan(folder / "direct.json")
    n = 4 * HIDDEN
    h = _shared(n, "bf16", device, seed=5)
    weight = (1.0 + 0.1 * _shared(HIDDEN, "fp32", device, seed=9)).to(h.dtype)
    calls = [NormCall(RowNorm(HIDDEN, EPS), weight, torch.empty_like(h)) for _ in range(GRAPH_CALLS)]

    def right(out, x, k: int) -> bool:
        return sums_to(out, x, residual=h) and normed_off(calls[k].normed, out, weight, "bf16") == 0

    options = [{"residual": h, "norm": c} for c in calls]
    return {
        "replays": REPLAYS,
        "calls": GRAPH_CALLS,
        "wrong": replayed(comm, plan, n, rank, device, 400, options, right),
    }


def scenario_twoshot_residual(comm, folder: Path, rank: int, device) -> dict:
    """The two-shot with the residual alone, back to back; and its refusal of the norm (its rows arrive as
    copies), as the engine words it."""
    from executor.errors import ExecutorError
    from schedules.plan.io import load_plan

    plan = load_plan(folder / "twoshot.json")
    row = fused_calls(comm, plan, 16, "bf16", rank, device, norm=False)
    try:
        fused_calls(comm, plan, 16, "bf16", rank, device)
        row["norm_refused"] = ""
    except ExecutorError as e:
        row["norm_refused"] = str(e)
    return row


def scenario_communicator(comm, rank: int, device) -> dict:
    """The Communicator over the job's registry (the Lamport plans alone): CALLS eager calls back to back at each of
    COMM_SIZES (staging; the padded size staged at its padded place), GRAPH_CALLS calls captured zero-copy and
    replayed REPLAYS times on new values, and CALLS fused calls (residual add and RMSNorm, 4 tokens)."""
    import torch

    rows: dict = {}
    for label, numel in COMM_SIZES.items():
        plan = comm.plan_for("allreduce", 2 * numel, torch.bfloat16)
        inputs = [_input(numel, "bf16", device, rank, 500 + k) for k in range(CALLS)]
        outs = [comm.all_reduce(x) for x in inputs]  # no host synchronization between them
        torch.cuda.synchronize()
        rows[label] = {
            "plan": getattr(plan, "name", None),
            "protocol": getattr(plan, "protocol", None),
            "calls": CALLS,
            "wrong": [k for k in range(CALLS) if not sums_to(outs[k], inputs[k])],
        }
    numel = COMM_SIZES["64KB"]
    xs = [_input(numel, "bf16", device, rank, 600 + k) for k in range(GRAPH_CALLS)]
    comm.all_reduce(xs[0])  # the size's context, on the staging buffers
    torch.cuda.synchronize()
    before = dict(comm.paths)
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        outs = [comm.all_reduce(x) for x in xs]
    paths = {k: comm.paths[k] - before[k] for k in comm.paths}
    wrong = 0
    for replay in range(REPLAYS):
        for k, x in enumerate(xs):
            x.copy_(_input(numel, "bf16", device, rank, 700 + GRAPH_CALLS * replay + k))
        graph.replay()
        wrong += sum(not sums_to(o, x) for o, x in zip(outs, xs, strict=True))
    rows["capture"] = {"paths": paths, "replays": REPLAYS, "wrong": wrong}
    rows["early_replay"] = early_replay(comm, rank, device)
    rows["fused"] = communicator_fused(comm, 4, rank, device)
    return rows


def early_replay(comm, rank: int, device) -> dict:
    """A graph of one Lamport call replayed inside ``capture()`` before its buffers are registered (its record
    disarmed: no plan op runs, and leaving the block raises), then replayed armed REPLAYS times on new values. The
    disarmed launch must leave the plan's epochs where they were: a Lamport call resets a scratch copy by epoch, and
    an epoch taken with no reset run would leave a copy that a later call reads as arrived."""
    numel = COMM_SIZES["64KB"]
    x = _input(numel, "bf16", device, rank, 900)
    graph, out, raised = replayed_before_registration(comm, x)
    wrong = 0
    for replay in range(REPLAYS):
        x.copy_(_input(numel, "bf16", device, rank, 910 + replay))
        graph.replay()
        wrong += not sums_to(out, x)
    return {"raised": raised, "replays": REPLAYS, "wrong_after": wrong}


def communicator_fused(comm, tokens: int, rank: int, device) -> dict:
    """CALLS calls of ``comm.all_reduce(x, residual=h, rms_weight=w)`` back to back: the new residual against NCCL's
    sum plus ``h``, the normalized rows against the epilogue's definition."""
    import torch

    from executor.reference.norm import RowNorm

    n = tokens * HIDDEN
    h = _shared(n, "bf16", device, seed=11).view(tokens, HIDDEN)
    weight = (1.0 + 0.1 * _shared(HIDDEN, "fp32", device, seed=13)).to(torch.bfloat16)
    plan = comm.norm_plan_for(2 * n, torch.bfloat16, RowNorm(HIDDEN, EPS))
    inputs = [_input(n, "bf16", device, rank, 800 + k).view(tokens, HIDDEN) for k in range(CALLS)]
    results = [comm.all_reduce(x, residual=h, rms_weight=weight, eps=EPS) for x in inputs]
    torch.cuda.synchronize()
    return {
        "protocol": getattr(plan, "protocol", None),
        "calls": CALLS,
        "residual_wrong": [k for k in range(CALLS) if not sums_to(results[k][1], inputs[k], residual=h)],
        "normed_off": [
            k for k in range(CALLS) if normed_off(results[k][0].view(-1), results[k][1].view(-1), weight, "bf16")
        ],
    }


def main() -> None:
    import torch.distributed as dist

    from executor.gpu.engine import InterpreterEngine

    rank, _, device, _, out_dir = start_rank(seed=33)
    folder = Path(os.environ[PLANS_ENV])
    timeout = float(os.environ.get("WEFT_TEST_TIMEOUT", "30"))
    from executor import Communicator

    communicator = Communicator.from_process_group(timeout_s=timeout)  # the job's registry: the Lamport plans alone
    comm = InterpreterEngine.from_process_group(timeout_s=timeout)
    checked = InterpreterEngine.from_process_group(timeout_s=timeout)  # contexts of its own (cached by address)
    graphs = InterpreterEngine.from_process_group(timeout_s=timeout)
    fused = InterpreterEngine.from_process_group(timeout_s=timeout)
    run_scenarios(
        rank,
        out_dir,
        {
            "eager": lambda: scenario_eager(comm, folder, rank, device),
            "checked": lambda: scenario_checked(checked, folder, rank, device),
            "graph": lambda: scenario_graph(graphs, folder, rank, device),
            "fused": lambda: scenario_fused(fused, folder, rank, device),
            "fused_graph": lambda: scenario_fused_graph(fused, folder, rank, device),
            "twoshot_residual": lambda: scenario_twoshot_residual(fused, folder, rank, device),
            "communicator": lambda: scenario_communicator(communicator, rank, device),
        },
    )
    communicator.close()
    for c in (comm, checked, graphs, fused):
        c.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
