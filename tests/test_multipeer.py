"""Multi-peer plans (codegen ``multipeer``, ``codegen.peers``): one thread block per instance serves every peer, each
phase one op over N-1 channels, proven on the reference executor at 4 and 8 ranks (launches back to back)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codegen import compile_schedule
from codegen.ir import Channel, Draft, Loc
from codegen.peers import gather_peers
from executor.gpu.tables import PAIRS, SIGNAL, TRANSFER, build_tables
from topologies import resolve
from weft import pipeline
from weft.synthesis import synthesize

# (collective, method, codegen options): the shapes weft tune makes for 4 and 8 ranks
SHAPES = [
    ("allreduce", "twoshot", dict(protocol="simple")),
    ("allreduce", "twoshot", dict(protocol="simple", double_scratch=True, instances=4, pipeline=2)),
    ("allreduce", "twoshot", dict(protocol="ll")),
    ("allreduce", "twoshot", dict(protocol="simple", pull=True)),
    ("allreduce", "direct", dict(protocol="simple", double_scratch=True)),
    ("allreduce", "direct", dict(protocol="ll", instances=2)),
    ("allreduce", "ring", dict(protocol="simple")),
    ("reducescatter", "direct", dict(protocol="simple", double_scratch=True)),
    ("reducescatter", "direct", dict(protocol="ll")),
    ("allgather", "direct", dict(protocol="simple", instances=2)),
    ("allgather", "direct", dict(protocol="ll")),
]


def plan_for(nranks: int, collective: str, method: str, **options):
    topology = resolve(f"hgx_h200:gpus={nranks}")
    return pipeline.compile_and_verify(synthesize(topology, collective, method), topology, multipeer=True, **options)


@pytest.mark.parametrize("nranks", [4, 8])
@pytest.mark.parametrize("collective,method,options", SHAPES)
def test_every_multipeer_shape_is_proven_with_one_thread_block_per_instance(nranks, collective, method, options):
    plan = plan_for(nranks, collective, method, **options)
    assert plan.weft.verification["ok"] and plan.name.endswith("-mp")
    instances = options.get("instances", 1)
    assert all(len(g.threadblocks) == instances for g in plan.gpus)


@pytest.mark.parametrize("nranks", [4, 8])
def test_two_shot_is_six_ops_each_over_every_peer(nranks):
    plan = plan_for(nranks, "allreduce", "twoshot", protocol="simple")
    ops = plan.gpus[0].threadblocks[0].ops
    assert [op.name for op in ops] == ["put", "signal", "wait", "res", "signal", "wait"]
    assert all(len(op.channel_ids) == nranks - 1 for op in ops)
    res = ops[3]
    assert len(res.src_buff) == nranks and sum(d.remote for d in res.dst_buff) == nranks - 1


def test_today_the_four_rank_two_shot_takes_five_thread_blocks_per_instance():
    topology = resolve("hgx_h200:gpus=4")
    plan = compile_schedule(synthesize(topology, "allreduce", "twoshot"), topology, protocol="simple")
    assert len(plan.gpus[0].threadblocks) == 5


def test_a_multipeer_put_runs_its_pairs_side_by_side_on_the_gpu():
    plan = plan_for(4, "allreduce", "twoshot", protocol="simple")
    t = build_tables(plan, 0, 4 * 4096)
    assert list(t.ops["type"][:2]) == [PAIRS, SIGNAL]
    put = t.ops[0]
    assert (put["nsrc"], put["ndst"], put["bytes"]) == (3, 3, 4096)
    peers = [t.remote_buffers[int(b) - 3] for b in put["dst"]["buffer"][:3]]
    assert sorted(peers) == [(1, "s"), (2, "s"), (3, "s")]  # every peer's scratch
    assert t.ops[2]["nchannel"] == 3  # one wait on every peer


def test_packet_pairs_of_different_sources_stay_one_transfer_per_pair():
    plan = plan_for(4, "reducescatter", "direct", protocol="ll")
    assert len(set(plan.gpus[0].threadblocks[0].ops[0].src_buff)) == 3
    ops = build_tables(plan, 0, plan.size_chunks * 1024).ops
    assert PAIRS not in ops["type"] and list(ops["type"][:3]) == [TRANSFER] * 3
    assert [(int(op["nsrc"]), int(op["ndst"])) for op in ops[:3]] == [(1, 1)] * 3


@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_packets_of_one_source_to_every_peer_are_one_transfer(collective):
    plan = plan_for(4, collective, "direct", protocol="ll")
    t = build_tables(plan, 0, plan.size_chunks * 1024)
    put = t.ops[0]
    assert (int(put["type"]), int(put["nsrc"]), int(put["ndst"])) == (TRANSFER, 1, 3)  # the input read once
    peers = [t.remote_buffers[int(b) - 3] for b in put["dst"]["buffer"][:3]]
    assert sorted(rank for rank, _ in peers) == [1, 2, 3]


def test_signals_move_behind_puts_and_gather_with_them():
    c1, c2 = Channel(1, 0), Channel(2, 0)
    ops = [
        Draft("put", (Loc(0, "i", 1),), (Loc(1, "s", 0),), (c1,)),
        Draft("signal", channels=(c1,)),
        Draft("put", (Loc(0, "i", 2),), (Loc(2, "s", 0),), (c2,)),
        Draft("signal", channels=(c2,)),
        Draft("wait", channels=(c1,)),
        Draft("wait", channels=(c2,)),
    ]
    out = gather_peers(ops)
    assert [(op.name, op.channels) for op in out] == [("put", (c1, c2)), ("signal", (c1, c2)), ("wait", (c1, c2))]


def test_a_signal_never_moves_past_an_op_that_waits():
    c1, c2 = Channel(1, 0), Channel(2, 0)
    ops = [
        Draft("put", (Loc(0, "i", 1),), (Loc(1, "s", 0),), (c1,)),
        Draft("signal", channels=(c1,)),
        Draft("wait", channels=(c2,)),
        Draft("put", (Loc(0, "i", 2),), (Loc(2, "s", 0),), (c2,)),
    ]
    assert [op.name for op in gather_peers(ops)] == ["put", "signal", "wait", "put"]


def test_copies_that_read_what_the_one_before_wrote_stay_apart():
    first = Draft("copy", (Loc(0, "s", 0),), (Loc(0, "o", 1),))
    second = Draft("copy", (Loc(0, "o", 1),), (Loc(0, "o", 2),))
    assert len(gather_peers([first, second])) == 2
    apart = Draft("copy", (Loc(0, "s", 1),), (Loc(0, "o", 3),))
    assert len(gather_peers([first, apart])) == 1


def test_a_two_rank_plan_gathers_its_two_thread_blocks_into_one():
    topology = resolve("hgx_h200:gpus=2")
    schedule = synthesize(topology, "allreduce", "twoshot")
    plan = pipeline.compile_and_verify(schedule, topology, protocol="simple", instances=8, multipeer=True)
    assert plan.weft.verification["ok"] and len(plan.gpus[0].threadblocks) == 8
    assert np.isin(build_tables(plan, 1, plan.size_chunks * 4096).ops["type"], [TRANSFER, SIGNAL, 3]).all()


def tune_rows(capsys, nranks: int, *extra: str, instances: str = "4,32") -> dict:
    from weft.cli import main

    assert (
        main(
            [
                "tune",
                "allreduce",
                "-t",
                f"hgx_h200:gpus={nranks}",
                "--method",
                "twoshot",
                "--instances",
                instances,
                "--threads",
                "1024",
                "--protocols",
                "simple",
                "--dry-run",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    return {r["variant"]: r for r in json.loads(capsys.readouterr().out)["variants"]}


@pytest.mark.parametrize("nranks,wide", [(4, 32), (8, 16)])
def test_tune_makes_multipeer_variants_that_fit_where_per_peer_blocks_do_not(capsys, nranks, wide):
    rows = tune_rows(capsys, nranks, instances=f"1,{wide}")
    assert rows[f"simple-x{wide}-mp"]["plan"] and rows[f"simple-x{wide}-mp"]["threadblocks"] == wide
    assert not rows[f"simple-x{wide}"]["plan"] and "SMs hold 132 at once" in rows[f"simple-x{wide}"]["skipped"]


def test_tune_sms_names_the_gpus_size(capsys):
    rows = tune_rows(capsys, 4, "--sms", "20", "--pipeline", "1,2")
    assert "20 SMs hold 20" in rows["simple-x32-mp"]["skipped"] and rows["simple-x4-p2-mp"]["plan"]


def test_tune_makes_no_multipeer_variant_where_each_rank_sends_to_one_peer(capsys):
    assert set(tune_rows(capsys, 2)) == {"simple-x4", "simple-x32"}
    assert "simple-x32-mp" in tune_rows(capsys, 2, "--multipeer")


def test_weft_compile_multipeer_writes_a_proven_one_block_plan(tmp_path, capsys):
    from schedules.plan.io import load_plan
    from schedules.schedule import save_schedule
    from weft.cli import main

    topology = resolve("hgx_h200:gpus=4")
    save_schedule(synthesize(topology, "allreduce", "twoshot"), tmp_path / "s.json")
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "compile",
                str(tmp_path / "s.json"),
                "-t",
                "hgx_h200:gpus=4",
                "--protocol",
                "simple",
                "--instances",
                "4",
                "--multipeer",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["threadblocks"] == 4 and summary["plan"].endswith("-mp")
    assert load_plan(out).weft.verification["ok"]
