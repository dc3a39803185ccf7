"""Plan -> device tables for the GPU interpreter (pure numpy; no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.errors import ExecutorError
from executor.gpu.tables import (
    PACKET,
    SCRATCH,
    SIGNAL,
    TRANSFER,
    WAIT,
    build_tables,
    check_launch,
    lines_possible,
    pair_channels,
    vector_bytes,
)
from executor.reference.machine import chunk_elems, residual_sums, round_to
from executor.reference.norm import residual_refusal
from executor.reference.prove import run_reference
from schedules.plan.io import load_plan, parse_plan

ROOT = Path(__file__).parent
FIXTURES = ROOT / "fixtures" / "plans"
COMPILED = ROOT / "gpu" / "plans"


def test_simple_allreduce_lowers_to_transfers_and_channel_ops():
    t = build_tables(load_plan(FIXTURES / "allpairs_allreduce_2.json"), 0, 1024)
    assert list(t.ops["type"]) == [TRANSFER, SIGNAL, WAIT, TRANSFER, TRANSFER, SIGNAL, WAIT]
    put = t.ops[0]
    assert (put["nsrc"], put["ndst"], put["bytes"]) == (1, 1, 512)
    assert tuple(put["src"][0]) == (512, 0, 0)  # input chunk 1
    assert tuple(put["dst"][0]) == (0, 3, 0)  # remote_buffers[0]: rank 1's scratch
    reduce = t.ops[3]
    assert reduce["nsrc"] == 2 and [tuple(r) for r in reduce["src"][:2]] == [(0, 0, 0), (0, 2, 0)]
    assert t.remote_buffers == ((1, "s"), (1, "o")) and t.channel_peers == (1,)


def test_ll_plan_reads_and_writes_packets_in_double_buffered_scratch():
    t = build_tables(load_plan(FIXTURES / "allpairs_allreduce_2_ll.json"), 1, 1024)
    assert t.double_scratch and t.scratch_bytes == 2 * 2 * 512  # two packet chunks of 2 × 512 B
    flags = {(int(op["src"][k]["buffer"]), int(op["src"][k]["flags"])) for op in t.ops for k in range(op["nsrc"])}
    assert (2, PACKET | SCRATCH) in flags and (0, 0) in flags


@pytest.mark.parametrize(
    "name, uniform",
    [
        ("allreduce-direct-ll-x8.json", 2),  # every block: the same ops, so block b's start at b times their count
        ("allreduce-twoshot-simple-x8.json", 6),
        ("allgather-direct-simple-x16.json", 0),  # blocks of 1, 2 and 3 ops: each block's range says where
    ],
)
def test_uniform_ops_is_the_stride_of_every_blocks_ops_or_zero(name, uniform):
    t = build_tables(load_plan(COMPILED / name), 0, 65536)
    assert t.uniform_ops == uniform
    if uniform:
        assert t.tb_start.tolist() == [b * uniform for b in range(t.nthreadblocks + 1)]


def test_pws_is_puts_then_a_signal_on_the_same_channels():
    plan = load_plan(COMPILED / "allgather-direct-simple-x1.json")
    t = build_tables(plan, 0, 4096)
    ops = t.ops[t.tb_start[0] : t.tb_start[-1]]
    signals = [op for op in ops if op["type"] == SIGNAL]
    assert signals and all(op["nchannel"] == 1 for op in signals)
    i = list(ops["type"]).index(SIGNAL)
    assert ops[i - 1]["type"] == TRANSFER


def test_channels_pair_mth_with_mth():
    plan = load_plan(COMPILED / "allreduce-twoshot-simple-x8.json")
    pairs = pair_channels(plan)
    for (rank, cid), back in pairs.items():
        peer = plan.gpus[rank].memory_peers[cid]
        assert pairs[(peer, back)] == cid


def test_plan_for_another_world_size_is_refused():
    plan = load_plan(FIXTURES / "allpairs_allreduce_2.json")
    with pytest.raises(ExecutorError, match="written for 2 ranks, but the communicator has 4"):
        check_launch(plan, 4, 1024, "fp32")


def test_size_the_plan_does_not_accept_is_refused():
    plan = load_plan(COMPILED / "allreduce-direct-ll-x1.json")
    with pytest.raises(ExecutorError, match="size 4194304 B is not accepted"):
        check_launch(plan, 2, 4 << 20, "bf16")
    with pytest.raises(ExecutorError, match="not accepted"):
        check_launch(plan, 2, 1030, "bf16")


def test_dtype_the_plan_lacks_is_refused():
    doc = load_plan(FIXTURES / "allpairs_allreduce_2.json").content()
    doc["weft"] = {"dtypes": ["fp32"]}
    with pytest.raises(ExecutorError, match="dtype bf16 is not among the plan's dtypes"):
        check_launch(parse_plan(doc, "x.json"), 2, 1024, "bf16")
    with pytest.raises(ExecutorError, match="dtype 'int8' is not supported"):
        check_launch(parse_plan(doc, "x.json"), 2, 1024, "int8")


def test_packet_op_outside_an_ll_scratch_is_refused():
    doc = load_plan(FIXTURES / "allpairs_allreduce_2_ll.json").content()
    doc["protocol"] = "Simple"
    with pytest.raises(ExecutorError, match="live in the scratch buffer of an LL plan"):
        build_tables(parse_plan(doc, "x.json"), 0, 1024)


def test_vector_width_is_the_widest_dividing_everything():
    assert vector_bytes(1 << 20, 4096) == 16
    assert vector_bytes((3 << 20) + 24, 16) == 8
    assert vector_bytes(12) == 4
    with pytest.raises(ExecutorError):
        vector_bytes(6)


PLANS = sorted(COMPILED.glob("*.json"))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(PLANS), st.integers(1, 4096), st.sampled_from([0, 1]))
def test_every_transfer_stays_inside_its_buffers(path, units, rank):
    plan = load_plan(path)
    nbytes = units * plan.size_chunks * 4
    if not plan.accepts(nbytes):
        return
    t = build_tables(plan, rank, nbytes)
    local = {0: t.input_bytes, 1: t.output_bytes, 2: t.scratch_bytes}
    sizes = {3 + k: build_tables(plan, r, nbytes) for k, (r, _) in enumerate(t.remote_buffers)}
    for op in t.ops[t.ops["type"] == TRANSFER]:
        assert op["bytes"] % t.vector_bytes == 0
        for field, n in (("src", op["nsrc"]), ("dst", op["ndst"])):
            for ref in op[field][:n]:
                slot, span = int(ref["buffer"]), op["bytes"] * (2 if ref["flags"] & PACKET else 1)
                if slot < 3:
                    limit = local[slot]
                else:
                    peer = sizes[slot]
                    limit = {"i": peer.input_bytes, "o": peer.output_bytes, "s": peer.scratch_bytes}[
                        t.remote_buffers[slot - 3][1]
                    ]
                assert ref["offset"] % t.vector_bytes == 0 and ref["offset"] + span <= limit


def test_weft_run_refuses_a_bad_plan_file_before_starting_ranks(tmp_path, capsys):
    from weft.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}')
    assert main(["run", str(bad), "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0]


def test_weft_bench_record_needs_the_registry(capsys):
    from weft.cli import main

    assert main(["bench", "allreduce", "--plans", str(FIXTURES / "allpairs_allreduce_2.json"), "--record"]) == 2
    assert "--record needs --plans registry" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- residuals

ALLREDUCE_PLANS = sorted(COMPILED.glob("allreduce-*.json")) + sorted((COMPILED.parent / "plans4").glob("allreduce-*"))


def sources(op) -> list[tuple]:
    return [tuple(op["src"][k]) for k in range(op["nsrc"])]


def output_offsets(op, tables) -> set[int]:
    """Offsets of the op's destinations in an output buffer (this rank's, slot 1, or a peer's)."""
    outputs = {1} | {3 + k for k, (_, kind) in enumerate(tables.remote_buffers) if kind == "o"}
    return {int(op["dst"][k]["offset"]) for k in range(op["ndst"]) if op["dst"][k]["buffer"] in outputs}


@pytest.mark.parametrize("path", ALLREDUCE_PLANS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_completed_sums_written_to_outputs_add_the_residual_last_and_nothing_else_changes(path):
    plan = load_plan(path)
    assert residual_refusal(plan) == ""
    nbytes = plan.size_chunks * 4 * 64
    for rank in range(plan.nranks):
        for lines in (False, True) if lines_possible(plan, nbytes) else (False,):
            plain = build_tables(plan, rank, nbytes, lines=lines)
            fused = build_tables(plan, rank, nbytes, lines=lines, residual=True)
            slot = 3 + len(plain.remote_buffers)
            assert fused.residual and fused.nslots == plain.nslots + 1 == slot + 1
            assert len(fused.ops) == len(plain.ops) and (fused.tb_start == plain.tb_start).all()
            added = 0
            for a, b in zip(plain.ops, fused.ops, strict=True):
                if a.tobytes() == b.tobytes():
                    continue
                added += 1
                *same, extra = sources(b)
                assert same == sources(a) and extra[1:] == (slot, 0)
                assert a["nsrc"] > 1 and output_offsets(a, plain) == {extra[0]}
                b["nsrc"], b["src"][a["nsrc"]] = a["nsrc"], (0, 0, 0)
                assert a.tobytes() == b.tobytes()  # the one extra source is the only change
            # one per completed sum written to an output (partial sums that pass through outputs add nothing)
            assert added == sum(k[0] == rank for k in residual_sums(plan)) > 0


def test_the_reference_adds_each_ranks_residual_after_the_sum_rounding_as_the_gpu():
    plan = load_plan(FIXTURES / "allpairs_allreduce_2.json")
    rng = np.random.default_rng(3)
    elems = chunk_elems(plan, 1024, "bf16")
    inputs = [round_to(rng.standard_normal(2 * elems) * 100, "bf16") for _ in range(2)]
    residual = round_to(rng.standard_normal(2 * elems) * 1000, "bf16")
    outputs = run_reference(plan, inputs, 1024, "bf16", [residual, residual])
    want = round_to(round_to(inputs[0] + inputs[1], "bf16") + residual, "bf16")
    assert all(np.array_equal(out, want) for out in outputs)


def sum_into_scratch_then_copy() -> dict:
    """allpairs_allreduce_2 with each sum written to scratch and copied to the output: no reduction writes it."""
    doc = json.loads((FIXTURES / "allpairs_allreduce_2.json").read_text())
    doc["name"] = "sum-into-scratch"
    for gpu in doc["gpus"]:
        ops = gpu["threadblocks"][0]["ops"]
        reduce = next(op for op in ops if op["name"] == "re")
        target = reduce["dst_buff"][0]
        reduce["dst_buff"] = [{"type": "s", "index": 0, "size": 1}]
        ops.insert(
            ops.index(reduce) + 1,
            {"name": "copy", "src_buff": [{"type": "s", "index": 0, "size": 1}], "dst_buff": [target]},
        )
    return doc


def test_plans_that_cannot_add_a_residual_exactly_once_are_refused_with_the_reason():
    assert "runs allgather" in residual_refusal(load_plan(COMPILED / "allgather-direct-ll-x1.json"))
    plan = parse_plan(sum_into_scratch_then_copy(), "sum-into-scratch")
    run_reference(plan, [np.ones(2 * 128, np.float32)] * 2, 1024, "fp32")  # a correct all-reduce without one
    assert "would not hold the sum plus the residual exactly once" in residual_refusal(plan)


def test_a_ring_adds_the_residual_only_where_a_sum_completes_not_where_partial_sums_pass_through_outputs():
    plan = load_plan(COMPILED.parent / "plans4" / "allreduce-ring-simple-x1.json")
    at = residual_sums(plan)
    partial_into_output = [
        (r, t, i)
        for r, g in enumerate(plan.gpus)
        for t, tb in enumerate(g.threadblocks)
        for i, op in enumerate(tb.ops)
        if op.name == "res" and (r, t, i) not in at
    ]
    assert partial_into_output and len(at) == plan.nranks  # each rank completes one chunk's sum
    assert residual_refusal(plan) == ""
