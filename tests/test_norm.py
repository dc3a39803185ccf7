"""The fused all-reduce + residual add + RMSNorm without a GPU: row-owning plans, the epilogue on the reference
executor against numpy's definition, the device tables, the plan choice, and the refusals (issue 23)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from codegen.protocol import CodegenError
from codegen.rows import own_rows
from executor.gpu import tables as gpu_tables
from executor.reference import machine as reference
from executor.reference.norm import (
    Epilogue,
    RowNorm,
    best_norm_plan,
    fused_refusal,
    norm_candidates,
    norm_mode,
    norm_ranges,
    output_ranges,
    plan_refusal,
    ranked_norm_plans,
    rms_norm,
    row_base,
    row_spans,
    rows_refusal,
    run_fused,
)
from registry.index import Mode
from registry.store import Registry
from schedules.plan.io import load_plan
from schedules.plan.types import BufferRef, PlanError
from topologies.catalog import build
from weft.publish import verify
from weftcore.errors import CheckFailed

ROOT = Path(__file__).parent.parent
PLANS = ROOT / "tests" / "fixtures" / "plans"


@pytest.fixture(scope="module")
def one_shot():
    """A one-shot LL all-reduce of 2 ranks, 4 instances: 4 reducing thread blocks of 2 chunks each per rank."""
    return load_plan(PLANS / "direct_ll_x4_2.json")


@pytest.fixture(scope="module")
def committed():
    """The committed 2-rank registry's plans for this machine, as the inference Communicator sees them."""
    fp = build("hgx_h200:gpus=2").fingerprints  # the fingerprint the committed registry was recorded under too
    return fp, [e for e in Registry(str(ROOT / "bench" / "registry_h200x2")).entries(topology=fp) if e.key.nranks == 2]


def _random_rows(plan, nbytes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    elems = reference.chunk_elems(plan, nbytes, dtype)
    inputs = [reference.round_to(rng.normal(0, 1, g.input_chunks * elems), dtype) for g in plan.gpus]
    residual = reference.round_to(rng.normal(0, 4, plan.gpus[0].output_chunks * elems), dtype)
    return inputs, residual


# ---------------------------------------------------------------------------------------------- codegen.rows


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_own_rows_gives_each_group_one_block_with_one_contiguous_reduction(one_shot, groups):
    plan = own_rows(one_shot, groups)
    chunks = plan.gpus[0].output_chunks
    for rank in range(plan.nranks):
        ranges = sorted((first, size) for (r, _, _), (first, size) in output_ranges(plan).items() if r == rank)
        assert ranges == [(g * chunks // groups, chunks // groups) for g in range(groups)]
        senders = [tb.ops for tb in plan.gpus[rank].threadblocks if tb.ops[0].name == "ppkt"]
        assert senders == [tb.ops for tb in one_shot.gpus[rank].threadblocks if tb.ops[0].name == "ppkt"]
    assert verify(plan)["ok"]


def test_own_rows_refuses_a_plan_whose_rows_arrive_as_copies():
    with pytest.raises(CodegenError, match="allpairs_allreduce_2_ll.*cannot be regrouped"):
        own_rows(load_plan(PLANS / "allpairs_allreduce_2_ll.json"), 1)


def test_own_rows_refuses_groups_that_do_not_split_the_output(one_shot):
    with pytest.raises(CodegenError, match="8 output chunks do not split into 3 row groups"):
        own_rows(one_shot, 3)


# ---------------------------------------------------------------------------------------------- numpy and the reference


def test_rms_norm_is_x_over_its_root_mean_square_times_the_weight():
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    w = np.array([1.0, 0.5, 2.0, 1.0], np.float32)
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5) * w
    assert np.allclose(rms_norm(x, w, 1e-5, "fp32"), want, rtol=1e-6)
    assert np.array_equal(rms_norm(x, w, 1e-5, "bf16"), reference.round_to(_definition(x, w, 1e-5), "bf16"))


def _definition(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The test's own statement of the formula: float64 mean of squares, float32 rstd, float32 products."""
    mean = (np.sum(x.astype(np.float64) ** 2, axis=-1) / x.shape[-1]).astype(np.float32)
    rstd = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x.astype(np.float32) * rstd[..., None]) * w.astype(np.float32)


@pytest.mark.parametrize("groups,rows", [(1, 1), (2, 2), (4, 4), (4, 8), (2, 1), (4, 1), (4, 2), (0, 1), (0, 2)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_reference_epilogue_equals_numpys_definition_bit_for_bit(one_shot, groups, rows, dtype):
    """Rows owned whole, and rows split into slices over blocks (groups > rows; 0: the plain plan, 4 blocks)."""
    plan = own_rows(one_shot, groups) if groups else one_shot
    hidden = 64
    nbytes = rows * hidden * reference.DTYPES[dtype]
    inputs, residual = _random_rows(plan, nbytes, dtype)
    weight = reference.round_to(np.random.default_rng(1).normal(1, 0.2, hidden), dtype)
    normed, outputs = run_fused(plan, inputs, nbytes, dtype, residual, weight, RowNorm(hidden, 1e-5))
    new_residual = reference.round_to(reference.round_to(inputs[0] + inputs[1], dtype) + residual, dtype)
    want = reference.round_to(_definition(new_residual.reshape(rows, hidden), weight, 1e-5), dtype).reshape(-1)
    for rank in range(plan.nranks):
        assert np.array_equal(outputs[rank], new_residual)
        assert np.array_equal(normed[rank], want)


def test_the_epilogue_runs_after_the_complete_sum_once_per_element(one_shot):
    """Every reduction it follows adds the residual, so its rows hold the whole sum; a second write is caught."""
    plan = own_rows(one_shot, 2)
    assert norm_ranges(plan) == output_ranges(plan)
    elems = reference.chunk_elems(plan, 2 * 64 * 2, "bf16")
    epilogue = Epilogue(plan, elems, "bf16", RowNorm(64, 1e-5), np.ones(64, np.float32))
    for key, (first, size) in norm_ranges(plan).items():
        epilogue(key, first, np.ones(size * elems, np.float32))
    epilogue.check_once()
    epilogue(key, first, np.ones(size * elems, np.float32))
    with pytest.raises(CheckFailed, match=f"element {first * elems} summed 2 times, not once"):
        epilogue.check_once()


def test_a_row_split_over_blocks_is_normalized_once_after_its_last_slice(one_shot):
    """Two reductions each complete half of one row: nothing is normalized after the first, the whole row (with
    the first half's sum and the second's) after the second."""
    plan = own_rows(one_shot, 2)
    elems = reference.chunk_elems(plan, 64 * 2, "bf16")
    epilogue = Epilogue(plan, elems, "bf16", RowNorm(64, 1e-5), np.ones(64, np.float32))
    (k0, (f0, s0)), (k1, (f1, s1)) = sorted(norm_ranges(plan).items(), key=lambda kv: (kv[0][0], kv[1]))[:2]
    assert (f0, f1) == (0, s0) and (s0 + s1) * elems == 64
    first, second = np.arange(1, s0 * elems + 1, dtype=np.float32), -np.arange(1, s1 * elems + 1, dtype=np.float32)
    epilogue(k0, f0, first)
    assert not epilogue.writes[0].any() and not epilogue.normed[0].any()
    epilogue(k1, f1, second)
    row = np.concatenate([first, second])[None]
    assert np.array_equal(epilogue.normed[0], rms_norm(row, np.ones(64, np.float32), 1e-5, "bf16").reshape(-1))
    assert (epilogue.writes[0] == 1).all()


def test_the_epilogue_refuses_a_range_that_is_not_whole_rows(one_shot):
    plan = own_rows(one_shot, 4)
    elems = reference.chunk_elems(plan, 4096, "bf16")
    epilogue = Epilogue(plan, elems, "bf16", RowNorm(3 * elems, 0.0), np.ones(3 * elems, np.float32))
    key, (first, size) = next(iter(norm_ranges(plan).items()))
    with pytest.raises(PlanError, match="not whole rows"):
        epilogue(key, first, np.ones(size * elems, np.float32))


def test_a_plan_passes_the_proof_only_where_every_output_is_its_ranks_own_sum(one_shot):
    assert fused_refusal(one_shot) == "" and fused_refusal(own_rows(one_shot, 1)) == ""
    why = plan_refusal(load_plan(PLANS / "allpairs_allreduce_2_ll.json"))
    assert "allpairs_allreduce_2_ll" in why and "writes an output other than by its rank's own sum" in why


# ---------------------------------------------------------------------------------------------- rows that fit


def test_rows_fit_where_each_blocks_share_is_whole_rows(one_shot):
    rows4, norm = own_rows(one_shot, 4), RowNorm(8192, 1e-5)
    assert rows_refusal(rows4, 4 * 16384, "bf16", norm) == ""
    assert rows_refusal(rows4, 8 * 16384, "bf16", norm) == ""
    why = rows_refusal(rows4, 3 * 16384, "bf16", norm)
    assert "sums bytes 0..12288, neither whole rows of 16384 B nor an aligned fraction of one" in why
    assert rows_refusal(own_rows(one_shot, 1), 16384, "bf16", norm) == ""


def test_a_block_may_complete_an_aligned_equal_slice_of_a_row(one_shot):
    """Four blocks, two rows: each row split over two blocks (the kernel's kNormSlice), slots in row order."""
    rows4, norm = own_rows(one_shot, 4), RowNorm(8192, 1e-5)
    spans = row_spans(rows4, 2 * 16384, "bf16", norm)
    mine = sorted(
        (span.first, span.nbytes, span.slices, span.index, span.row) for (r, _, _), span in spans.items() if r == 0
    )
    assert mine == [(0, 8192, 2, 0, 0), (8192, 8192, 2, 1, 0), (16384, 8192, 2, 0, 1), (24576, 8192, 2, 1, 1)]
    assert {span.slices for span in row_spans(rows4, 16384, "bf16", norm).values()} == {4}


def test_a_slice_that_is_not_its_blocks_last_op_or_is_uneven_is_refused(one_shot):
    """A block that waits for its row's other slices must have nothing left that another block could wait for."""
    from dataclasses import replace

    rows2 = own_rows(one_shot, 2)
    gpu = rows2.gpus[0]
    tbs = tuple(
        replace(
            t,
            ops=(
                *t.ops,
                replace(t.ops[0], name="copy", src_buff=(BufferRef(0, 1, "i"),), dst_buff=(BufferRef(0, 1, "s"),)),
            ),
        )
        if t.ops[0].spec.reduces
        else t
        for t in gpu.threadblocks
    )
    later = replace(rows2, gpus=(replace(gpu, threadblocks=tbs), *rows2.gpus[1:]))
    norm = RowNorm(8192, 1e-5)
    assert isinstance(row_spans(later, 2 * 16384, "bf16", norm), dict)  # whole rows per block: no wait
    why = row_spans(later, 16384, "bf16", norm)
    assert "sums a slice of a row, so it waits for the row's other slices: that must be its last op" in why
    unaligned = row_spans(own_rows(one_shot, 4), 3 * 16384, "bf16", norm)
    assert "neither whole rows of 16384 B nor an aligned fraction of one" in unaligned


def test_a_row_split_into_slices_of_unequal_sizes_is_refused(one_shot, monkeypatch):
    # halves and quarters of one row, each aligned: its blocks would expect different slice counts and wait forever
    import executor.reference.norm as norm_module

    ranges = {(r, tb, 0): rng for r in (0, 1) for tb, rng in ((0, (0, 4)), (4, (4, 2)), (6, (6, 2)))}
    monkeypatch.setattr(norm_module, "output_ranges", lambda plan: ranges)
    why = row_spans(one_shot, 16384, "bf16", RowNorm(8192, 1e-5))
    assert why == f"plan {one_shot.name}: at 16384 B row 0 of rank 0 is split into slices of unequal sizes"


def test_a_hidden_size_no_plan_fits_is_refused_with_the_reason(committed):
    fp, entries = committed
    nbytes = 8191 * 2  # an odd hidden size: no plan accepts 16382 B
    candidates = [(e.plan, 0.0) for e in entries if e.serves(fp, "allreduce", 2, nbytes)]
    plan, why = best_norm_plan(candidates, nbytes, "bf16", RowNorm(8191, 1e-5))
    assert plan is None and "no plan's rows fit 16382 B in rows of 8191 bf16" in why


@pytest.mark.parametrize(
    "batch,base,mode,slices",
    [
        (1, "ll-x32-t512-max8MB", Mode(lines=True, compiled=True), 32),
        (4, "ll-x32-t512-max8MB", Mode(lines=True, compiled=True), 8),
        (16, "ll-x128-t512-max64MB", Mode(lines=True, compiled=True), 8),
        (64, "ll-x128-t512-max8MB", Mode(lines=True, compiled=True), 2),
    ],
)
def test_the_committed_registry_has_a_plan_per_decode_batch(committed, batch, base, mode, slices):
    """As the interpreter's Communicator ranks them (LL128 lines and compiled kernels counted): the fastest measured
    plan (a row-owning plan estimated by the plan it was regrouped from), then the most blocks completing sums: the
    plain one-shot plan, each row split over ``slices`` of its reducing blocks, run the way it measured fastest
    (2xH200, ninth session: compiled at every decode batch; twelfth: the Lamport one-shot at 64 and 256 KB, where
    it measured fastest; thirteenth: LL128 lines again at 256 KB, where that session's job measured them fastest;
    seventeenth, every plan of the registry at 1 KB-16 MB in one job: LL128 lines at 16 KB, the 256-thread Lamport
    one-shot at 64 KB, the 8 MB-capped LL one-shot at 256 KB; eighteenth, the same at 1 KB-256 MB at the bench's own
    30 samples of 20 calls: LL128 lines at every decode batch, the 8 MB-capped x32 one-shot at 64 KB, the 64 MB-capped
    x128 at 256 KB and the 8 MB-capped x128 at 1 MB)."""
    fp, entries = committed
    nbytes = batch * 8192 * 2
    serving = [e for e in entries if e.serves(fp, "allreduce", 2, nbytes)]
    plan, why = best_norm_plan(norm_candidates(serving, nbytes, True, True), nbytes, "bf16", RowNorm(8192, 1e-5))
    assert why == "" and plan.name == f"direct-allreduce-hgx_h200:gpus=2-{base}"
    assert norm_mode(serving, plan, nbytes, True, True) == mode
    spans = row_spans(plan, nbytes, "bf16", RowNorm(8192, 1e-5))
    assert {span.slices for span in spans.values()} == {slices} and len(spans) == 2 * batch * slices
    record = next(e for e in serving if e.plan.name == plan.name).provenance["verification"]  # its own proof
    assert record["ok"] and record["plan_hash"] == plan.content_hash


def test_ranked_norm_plans_keep_best_norm_plans_order_among_those_whose_rows_fit(committed):
    fp, entries = committed
    nbytes, shape = 16 * 8192 * 2, RowNorm(8192, 1e-5)
    candidates = norm_candidates([e for e in entries if e.serves(fp, "allreduce", 2, nbytes)], nbytes, True, True)
    ranked = ranked_norm_plans(candidates, nbytes, "bf16", shape)
    assert ranked[0][0] == best_norm_plan(candidates, nbytes, "bf16", shape)[0]
    assert [t for _, t in ranked] == sorted(t for _, t in ranked)
    assert all(not rows_refusal(p, nbytes, "bf16", shape) for p, _ in ranked) and len(ranked) < len(candidates)


def test_a_row_owning_plan_runs_the_way_its_base_plan_measured_fastest(committed):
    """norm_candidates and norm_mode read a regrouped plan (``BASE-rowsG``, never benched alone) by its base plan's
    times; an engine that compiles nothing (compiled=False) never gets a compiled mode; a plan of no entry runs
    plainly."""
    fp, entries = committed
    nbytes = 8192 * 2
    serving = [e for e in entries if e.serves(fp, "allreduce", 2, nbytes)]
    base = next(e for e in serving if e.plan.name == "direct-allreduce-hgx_h200:gpus=2-ll-x32-t512-max8MB")
    regrouped = own_rows(base.plan, 4)
    unmeasured = ("none", None, Mode())
    twin = SimpleNamespace(plan=regrouped, estimate_us=lambda *a: unmeasured[:2], estimate=lambda *a: unmeasured)
    (_, base_us), (plan, twin_us) = norm_candidates([base, twin], nbytes, True, True)
    assert plan is regrouped and twin_us == base_us == base.estimate_us(nbytes, True, True)[1]
    fastest = base.estimate(nbytes, True, True)[2]
    assert fastest.compiled and norm_mode([base, twin], regrouped, nbytes, True, True) == fastest
    uncompiled = base.estimate(nbytes, True, False)[2]
    assert not uncompiled.compiled and norm_mode([base, twin], regrouped, nbytes, True, False) == uncompiled
    assert norm_mode([twin], base.plan, nbytes, True, True) == Mode()


# ---------------------------------------------------------------------------------------------- device tables


def test_tables_follow_each_residual_sum_with_the_epilogue_and_pad_blocks_to_one_count(one_shot):
    plan = own_rows(one_shot, 2)
    t = gpu_tables.build_tables(plan, 0, 2 * 16384, residual=True, norm=RowNorm(8192, 1e-5))
    residual_slot = 3 + len(plan.gpus[0].remote_buffers)
    assert t.norm and t.nslots == residual_slot + 3 and t.uniform_ops == 3
    prefetches = [op for op in t.ops if op["type"] == gpu_tables.NORM_PREFETCH]
    assert [
        int(t.tb_start[b]) for b in range(t.nthreadblocks) if t.ops[t.tb_start[b]]["type"] == gpu_tables.NORM_PREFETCH
    ] == [0, 6]  # the two reducing blocks, first thing
    assert all(op["src"][0]["buffer"] == residual_slot + 1 and op["barrier_id"] == 16384 for op in prefetches)
    norms = [op for op in t.ops if op["type"] == gpu_tables.NORM_ROWS]
    assert [(int(op["src"][0]["offset"]), int(op["bytes"])) for op in norms] == [(0, 16384), (16384, 16384)]
    for op in norms:
        assert op["barrier_id"] == 16384 and np.int32(op["channel"][0]).view(np.float32) == np.float32(1e-5)
        assert (op["src"][0]["buffer"], op["src"][1]["buffer"], op["dst"][0]["buffer"]) == (
            gpu_tables.SLOTS["o"],
            residual_slot + 1,
            residual_slot + 2,
        )
        assert op["dst"][0]["offset"] == op["src"][0]["offset"]
    before = [t.ops[k - 1] for k in range(len(t.ops)) if t.ops[k]["type"] == gpu_tables.NORM_ROWS]
    assert all(
        op["type"] == gpu_tables.TRANSFER and op["src"][op["nsrc"] - 1]["buffer"] == residual_slot for op in before
    )


def test_tables_split_a_row_over_blocks_that_exchange_their_sums_of_squares(one_shot):
    """The plain plan at one row: its 4 reducing blocks each normalize a quarter of it (kNormSlice), the row's 4
    slots past both scratch halves, each block's prefetch of its quarter of the weight."""
    t = gpu_tables.build_tables(one_shot, 0, 16384, residual=True, norm=RowNorm(8192, 1e-5))
    residual_slot = 3 + len(one_shot.gpus[0].remote_buffers)
    halves = t.scratch_bytes * 2
    assert t.double_scratch and t.norm_slots == 4 * 8 and t.scratch_alloc == halves + 32
    slices = [op for op in t.ops if op["type"] == gpu_tables.NORM_SLICE]
    assert sorted(
        (int(op["src"][0]["offset"]), int(op["bytes"]), int(op["barrier_id"]), int(op["barrier_count"]))
        for op in slices
    ) == [(k * 4096, 4096, k, 4) for k in range(4)]
    for op in slices:
        assert op["nsrc"] == 3 and op["ndst"] == 1 and np.int32(op["channel"][0]).view(np.float32) == np.float32(1e-5)
        assert (op["src"][1]["buffer"], int(op["src"][1]["offset"])) == (residual_slot + 1, op["src"][0]["offset"])
        assert (op["src"][2]["buffer"], int(op["src"][2]["offset"])) == (gpu_tables.SLOTS["s"], halves)
        assert (op["dst"][0]["buffer"], op["dst"][0]["offset"]) == (residual_slot + 2, op["src"][0]["offset"])
    prefetches = sorted(
        (int(op["src"][0]["offset"]), int(op["barrier_id"])) for op in t.ops if op["type"] == gpu_tables.NORM_PREFETCH
    )
    assert prefetches == [(k * 4096, 4096) for k in range(4)]
    two_rows = gpu_tables.build_tables(one_shot, 0, 2 * 16384, residual=True, norm=RowNorm(8192, 1e-5))
    second = sorted(int(op["src"][2]["offset"]) for op in two_rows.ops if op["type"] == gpu_tables.NORM_SLICE)
    at = two_rows.scratch_bytes * 2  # past its own (larger) scratch
    assert second == [at] * 2 + [at + 16] * 2 and two_rows.norm_slots == 2 * 2 * 8  # row 1's slots next
    plain = gpu_tables.build_tables(one_shot, 0, 16384, residual=True)
    assert plain.norm_slots == 0 and plain.scratch_alloc == plain.scratch_bytes * 2


def test_tables_refuse_the_epilogue_without_the_residual(one_shot):
    with pytest.raises(Exception, match="needs the residual"):
        gpu_tables.build_tables(own_rows(one_shot, 1), 0, 16384, norm=RowNorm(8192, 1e-5))


def test_a_row_owning_plan_names_the_plan_it_was_regrouped_from(one_shot):
    assert row_base(own_rows(one_shot, 4).name) == one_shot.name
    assert row_base(one_shot.name) == one_shot.name and row_base("x-rowsy") == "x-rowsy"
