"""The fused all-reduce + residual add + RMSNorm on real GPUs (issue 23): eager, captured zero-copy, in place,
through the backend, under torch.compile, and the bad cases (fallback logged once, or a one-line refusal).

One job (a process per GPU) runs every scenario and writes each rank's results; the tests read them. The job runs
this file as a script: ``python tests/gpu/test_fused_norm.py RESULTS_DIR`` with RANK, WORLD_SIZE, ... set.
"""

from __future__ import annotations

import pytest
from conftest import nproc
from torch_job import LogLines, each, run_job, run_scenarios, start_rank, sums_to

HIDDEN, EPS = 8192, 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_job(__file__, "fused_norm", tmp_path_factory)


@pytest.mark.gpu
def test_one_launch_returns_the_sum_plus_residual_and_its_norm(results):
    for row in each(results, "eager"):
        for r in row.values():
            assert r["plan"] and r["slices_per_row"] > 1, r  # the fastest plan, its rows split over its blocks
            assert r["residual_wrong"] == 0 and r["fused_calls"] == 3 and r["unfused_logged"] == 0
            assert r["normed_off_by_more_than_one_ulp"] == 0 and r["normed_bitwise_fraction"] > 0.99
            assert r["vs_torch_rel_err"] < 8e-3


@pytest.mark.gpu
def test_rows_split_over_blocks_agree_with_rows_owned_whole(results):
    """Pinned plans: whole rows per block, and rows split into 2, 8 or 64 slices whose blocks exchange their sums
    of squares (kNormSlice); every one within an ulp of the definition, and the same bits as the whole-row plan
    but where the sum of squares, summed in another order, moves rstd (a few elements at most)."""
    if nproc() != 2:  # SPLIT's plans are the 2×H200 registry's, pinned by name
        pytest.skip("needs 2 ranks: the pinned plans are 2-rank plans")
    for row in each(results, "split"):
        for case, r in row.items():
            assert r["residual_wrong"] == 0 and r["off_by_more_than_one_ulp"] == 0, (case, r)
            assert r["same_as_whole_rows"] > 0.99 and r["slices_per_row"] == int(case.split("x")[-1]), (case, r)


@pytest.mark.gpu
def test_a_graph_of_split_rows_replays_without_help(results):
    if nproc() != 2:  # SPLIT's plans are the 2×H200 registry's, pinned by name
        pytest.skip("needs 2 ranks: the pinned plans are 2-rank plans")
    for row in each(results, "split_graph"):
        assert row["zero_copy"] == 1 and row["replays"] == 30 and row["wrong"] == 0 and row["slices_per_row"] == 8


@pytest.mark.gpu
def test_captured_graphs_run_the_fused_launch_on_the_captured_tensors(results):
    for row in each(results, "graph"):
        assert row["zero_copy"] == 1 and row["replays"] == 50 and row["wrong"] == 0


@pytest.mark.gpu
def test_the_fused_call_runs_compiled_where_the_registry_measured_its_plan_faster_so(results):
    """Each decode batch's fused call, its plan pinned in turn interpreted and compiled (Mode), gives the same bits
    both ways, on the GPU (none refused); and on 2 ranks selection runs it compiled, as the committed registry
    measured every decode batch's plan faster compiled (2xH200, ninth session)."""
    for row in each(results, "compiled"):
        for batch, r in row.items():
            assert r["refused"] == "" and r["residual_differ"] == 0 and r["normed_differ"] == 0, (batch, r)
            assert r["residual_wrong"] == 0 and r["off_by_more_than_one_ulp"] == 0, (batch, r)
            assert r["selected_compiled"] or nproc() != 2, (batch, r)


@pytest.mark.gpu
def test_the_in_place_form_writes_the_norm_and_the_new_residual(results):
    for row in each(results, "inplace"):
        assert row["normed_equal"] and row["residual_equal"]


@pytest.mark.gpu
def test_the_backend_fuses_in_graphs_it_prepared(results):
    for row in each(results, "backend"):
        assert row["should_fuse"] and row["prepared_in_capture"] and row["graph_wrong"] == 0


@pytest.mark.gpu
def test_torch_compile_traces_through_the_fused_op(results):
    for row in each(results, "compile"):
        assert row["ops_in_graph"] == 1 and row["wrong"] == 0


@pytest.mark.gpu
def test_a_hidden_size_no_plan_fits_runs_unfused_logged_once(results):
    for row in each(results, "no_rows"):
        assert row["wrong"] == 0 and row["logged"] == 1 and "no plan's rows fit" in row["reason"]


@pytest.mark.gpu
def test_a_non_contiguous_residual_runs_unfused_logged_once(results):
    for row in each(results, "non_contiguous"):
        assert row["wrong"] == 0 and row["logged"] == 1


@pytest.mark.gpu
def test_a_weight_of_the_wrong_shape_or_dtype_is_refused_in_one_line(results):
    for row in each(results, "bad_weight"):
        for message in (row["shape"], row["dtype"]):
            assert message.startswith("weft: all_reduce's rms_weight must be torch.bfloat16 of shape (8192,)")
            assert "\n" not in message


# ---------------------------------------------------------------------------------------------- the worker


def shared(device, *shape, seed, dtype=None):
    """The same values on every rank, as a residual stream or a norm weight."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, generator=gen, device=device, dtype=dtype or torch.bfloat16)


def norm_weight(device, seed=7):
    import torch

    return (1.0 + 0.1 * shared(device, HIDDEN, seed=seed, dtype=torch.float32)).to(torch.bfloat16)


def check_norm(normed, new_residual, weight) -> tuple[int, float]:
    """(elements more than one bf16 ulp from the epilogue's definition, fraction bit-equal to it): fp32 mean of
    squares, x * rstd, then * weight, rounded once (executor.reference.norm.rms_norm)."""
    import torch

    x = new_residual.float()
    rstd = 1.0 / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True).float() + EPS)
    want = ((x * rstd) * weight.float()).to(torch.bfloat16)
    ulp = torch.maximum(want.float().abs(), torch.tensor(2.0**-126, device=x.device)) * 2.0**-7
    off = int(((normed.float() - want.float()).abs() > ulp).sum())
    return off, float((normed == want).float().mean())


def scenario_eager(comm, log: LogLines, device) -> dict:
    import torch
    import torch.nn.functional as F

    from executor.reference.norm import RowNorm

    rows = {}
    w = norm_weight(device)
    for batch in (1, 4, 16):
        x, h = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, batch, HIDDEN, seed=3)
        before, fused_before = len(log.lines), comm.paths["staging"]
        for _ in range(3):
            normed, new_h = comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
        torch.cuda.synchronize()
        off, bitwise = check_norm(normed, new_h, w)
        ref = F.rms_norm(new_h, (HIDDEN,), w, EPS).float()
        plan = comm.norm_plan_for(x.numel() * 2, x.dtype, RowNorm(HIDDEN, EPS))
        rows[str(batch)] = {
            "plan": getattr(plan, "name", ""),
            "slices_per_row": slices_per_row(plan, x.numel() * 2),
            "residual_wrong": int(not sums_to(new_h, x, residual=h)),
            "fused_calls": comm.paths["staging"] - fused_before,
            "unfused_logged": sum("unfused" in line for line in log.lines[before:]),
            "normed_off_by_more_than_one_ulp": off,
            "normed_bitwise_fraction": bitwise,
            "vs_torch_rel_err": float((normed.float() - ref).norm() / ref.norm()),
        }
    return rows


def slices_per_row(plan, nbytes: int) -> int:
    """The blocks that complete each row's sum in ``plan`` at ``nbytes`` (1: whole rows per block)."""
    from executor.reference.norm import RowNorm, row_spans

    spans = row_spans(plan, nbytes, "bf16", RowNorm(HIDDEN, EPS))
    assert not isinstance(spans, str), spans  # a plan the fused norm refuses has no slices
    return max(span.slices for span in spans.values())


P = "direct-allreduce-hgx_h200:gpus=2-ll-"
SPLIT = {  # case "batch x slices" -> (the pinned plan, the plan that owns whole rows)
    "1x64": (P + "x64-t512-max8MB", P + "x32-t512-max8MB-rows1"),
    "16x8": (P + "x128-t512-max64MB", P + "x64-t512-max8MB-rows16"),
    "16x2": (P + "x64-t512-max8MB-rows32", P + "x64-t512-max8MB-rows16"),
}


def scenario_split(comm, device) -> dict:
    import torch

    from executor.reference.norm import RowNorm

    plans = {e.plan.name: e.plan for e in comm.choice.entries}
    rows, out = RowNorm(HIDDEN, EPS), {}
    w = norm_weight(device, seed=12)
    for case, (split, whole) in SPLIT.items():
        batch = int(case.split("x")[0])
        x, h = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, batch, HIDDEN, seed=13)
        got = {}
        for name in (whole, split):
            comm.pin_norm_plan(x.numel() * 2, x.dtype, rows, plans[name])
            got[name] = comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
        comm.pin_norm_plan(x.numel() * 2, x.dtype, rows, None)
        torch.cuda.synchronize()
        normed, new_h = got[split]
        out[case] = {
            "residual_wrong": int(not sums_to(new_h, x, residual=h)),
            "off_by_more_than_one_ulp": check_norm(normed, new_h, w)[0],
            "same_as_whole_rows": float((normed == got[whole][0]).float().mean()),
            "slices_per_row": slices_per_row(plans[split], x.numel() * 2),
        }
    return out


def scenario_split_graph(comm, device) -> dict:
    """A graph of the fused call on rows split over 8 blocks each (batch 16), replayed on new values."""
    import torch

    from executor.reference.norm import RowNorm

    plan = next(e.plan for e in comm.choice.entries if e.plan.name == SPLIT["16x8"][0])
    comm.pin_norm_plan(16 * HIDDEN * 2, torch.bfloat16, RowNorm(HIDDEN, EPS), plan)
    row = replayed_graph(comm, device, batch=16, replays=30, seeds=(14, 15, 5000))
    comm.pin_norm_plan(16 * HIDDEN * 2, torch.bfloat16, RowNorm(HIDDEN, EPS), None)
    return row | {"slices_per_row": slices_per_row(plan, 16 * HIDDEN * 2)}


def scenario_graph(comm, device) -> dict:
    return replayed_graph(comm, device, batch=4, replays=50, seeds=(7, 11, 1000))


def replayed_graph(comm, device, batch: int, replays: int, seeds: tuple) -> dict:
    """The fused call captured (after three warm-up calls) and replayed on new inputs and residuals, each replay
    checked against the definition. ``seeds``: the weight's, the residual's, the first replay's."""
    import torch

    w = norm_weight(device, seed=seeds[0])
    x, h = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, batch, HIDDEN, seed=seeds[1])
    for _ in range(3):
        comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
    before = comm.paths["zero_copy"]
    with comm.capture():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            normed, new_h = comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
    zero_copy = comm.paths["zero_copy"] - before
    wrong = 0
    for k in range(replays):
        x.copy_(torch.randn_like(x))
        h.copy_(shared(device, batch, HIDDEN, seed=seeds[2] + k))
        graph.replay()
        torch.cuda.synchronize()
        wrong += not sums_to(new_h, x, residual=h) or check_norm(normed, new_h, w)[0] > 0
    return {"zero_copy": zero_copy, "replays": replays, "wrong": wrong}


def scenario_compiled(comm, device) -> dict:
    """Per decode batch: the plan selection picks for the fused call, pinned interpreted then compiled (the same
    lines), on the same inputs; whether the two agree bit for bit, and whether selection runs it compiled."""
    import torch

    from executor.reference.norm import RowNorm
    from registry.index import Mode

    rows, out = RowNorm(HIDDEN, EPS), {}
    w = norm_weight(device, seed=21)
    for batch in (1, 4, 16):
        nbytes = batch * HIDDEN * 2
        x, h = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, batch, HIDDEN, seed=22)
        plan, mode = comm.norm_plan_for(nbytes, x.dtype, rows), comm.norm_mode_for(nbytes, x.dtype, rows)
        got = {}
        for compiled in (False, True):
            comm.pin_norm_plan(nbytes, x.dtype, rows, plan, Mode(lines=mode.lines, compiled=compiled))
            got[compiled] = [t.clone() for t in comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)]
        comm.pin_norm_plan(nbytes, x.dtype, rows, None)
        torch.cuda.synchronize()
        (normed, new_h), (interpreted, interpreted_h) = got[True], got[False]
        out[str(batch)] = {
            "plan": plan.name,
            "selected_compiled": mode.compiled,
            "refused": comm.engine.compiled_refused.get(plan.content_hash, ""),
            "normed_differ": int((normed.view(torch.int16) != interpreted.view(torch.int16)).sum()),
            "residual_differ": int((new_h.view(torch.int16) != interpreted_h.view(torch.int16)).sum()),
            "residual_wrong": int(not sums_to(new_h, x, residual=h)),
            "off_by_more_than_one_ulp": check_norm(normed, new_h, w)[0],
        }
    return out


def scenario_inplace(comm, device) -> dict:
    import torch

    w = norm_weight(device)
    x, h = torch.randn(4, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, 4, HIDDEN, seed=21)
    normed, new_h = comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
    comm.all_reduce_(x, residual=h, rms_weight=w, eps=EPS)
    return {"normed_equal": bool(torch.equal(x, normed)), "residual_equal": bool(torch.equal(h, new_h))}


def scenario_backend(comm, device) -> dict:
    import torch

    from executor.inference.backend import WeftBackend

    backend = WeftBackend(comm)
    w = norm_weight(device, seed=8)
    x, h = torch.randn(2, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, 2, HIDDEN, seed=31)
    should = backend.should_fuse_norm(x, w, EPS)
    with backend.capture(sizes=[x.numel() * 2], rms_norm=(HIDDEN, EPS)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            prepared = backend.should_fuse_norm(x, w, EPS)
            normed, new_h = backend.fused_add_rms_norm(x, h, w, EPS)
    wrong = 0
    for k in range(20):
        x.copy_(torch.randn_like(x))
        h.copy_(shared(device, 2, HIDDEN, seed=3000 + k))
        graph.replay()
        torch.cuda.synchronize()
        wrong += not sums_to(new_h, x, residual=h) or check_norm(normed, new_h, w)[0] > 0
    return {"should_fuse": should, "prepared_in_capture": prepared, "graph_wrong": wrong}


def scenario_compile(comm, device) -> dict:
    import torch
    import torch._dynamo

    w = norm_weight(device, seed=9)

    def layer(y, h):
        return comm.all_reduce(y, residual=h, rms_weight=w, eps=EPS)

    traced = []

    def recording(gm, example_inputs):
        traced.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=recording)
    wrong = 0
    for k in range(3):
        y, h = torch.randn(4, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, 4, HIDDEN, seed=40 + k)
        normed, new_h = compiled(y, h)
        torch.cuda.synchronize()
        wrong += not sums_to(new_h, y, residual=h) or check_norm(normed, new_h, w)[0] > 0
    return {"ops_in_graph": sum("weft.all_reduce_rms_norm" in t for t in traced), "wrong": wrong}


def scenario_no_rows(comm, log: LogLines, device) -> dict:
    """An odd hidden size (8191): no plan accepts the size, so the call runs unfused (NCCL here), logged once."""
    import torch
    import torch.nn.functional as F

    from executor.reference.norm import RowNorm

    hidden = HIDDEN - 1
    w = (1.0 + 0.1 * shared(device, hidden, seed=5, dtype=torch.float32)).to(torch.bfloat16)
    x, h = torch.randn(1, hidden, device=device, dtype=torch.bfloat16), shared(device, 1, hidden, seed=6)
    before = len(log.lines)
    wrong = 0
    for _ in range(2):
        normed, new_h = comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
        wrong += not sums_to(new_h, x, residual=h) or not torch.equal(normed, F.rms_norm(new_h, (hidden,), w, EPS))
    return {
        "wrong": wrong,
        "logged": sum("unfused" in line for line in log.lines[before:]),
        "reason": comm.norm_reason(x.numel() * 2, x.dtype, RowNorm(hidden, EPS)),
    }


def scenario_non_contiguous(comm, log: LogLines, device) -> dict:
    import torch
    import torch.nn.functional as F

    w = norm_weight(device)
    x = torch.randn(4, HIDDEN, device=device, dtype=torch.bfloat16)
    h = shared(device, HIDDEN, 4, seed=51).t()  # (4, HIDDEN), not contiguous
    before = len(log.lines)
    wrong = 0
    for _ in range(2):
        normed, new_h = comm.all_reduce(x, residual=h, rms_weight=w, eps=EPS)
        wrong += not sums_to(new_h, x, residual=h) or not torch.equal(normed, F.rms_norm(new_h, (HIDDEN,), w, EPS))
    return {
        "wrong": wrong,
        "logged": sum("not contiguous" in line and "unfused" in line for line in log.lines[before:]),
    }


def scenario_bad_weight(comm, device) -> dict:
    import torch

    w = norm_weight(device)
    x, h = torch.randn(4, HIDDEN, device=device, dtype=torch.bfloat16), shared(device, 4, HIDDEN, seed=61)
    out = {}
    for name, bad in (("shape", w[:100]), ("dtype", w.float())):
        try:
            comm.all_reduce(x, residual=h, rms_weight=bad, eps=EPS)
            out[name] = ""
        except (ValueError, RuntimeError) as e:
            out[name] = str(e)
    return out


def main() -> None:
    import torch.distributed as dist

    from executor import Communicator

    rank, world, device, log, out_dir = start_rank(seed=4321)
    comm = Communicator.from_process_group()
    scenarios = {
        "eager": lambda: scenario_eager(comm, log, device),
        "graph": lambda: scenario_graph(comm, device),
        "split": lambda: scenario_split(comm, device),
        "split_graph": lambda: scenario_split_graph(comm, device),
        "compiled": lambda: scenario_compiled(comm, device),
        "inplace": lambda: scenario_inplace(comm, device),
        "backend": lambda: scenario_backend(comm, device),
        "compile": lambda: scenario_compile(comm, device),
        "no_rows": lambda: scenario_no_rows(comm, log, device),
        "non_contiguous": lambda: scenario_non_contiguous(comm, log, device),
        "bad_weight": lambda: scenario_bad_weight(comm, device),
    }
    run_scenarios(rank, out_dir, scenarios)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
