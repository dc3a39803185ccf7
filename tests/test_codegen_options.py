"""Codegen's tuning options: pipelining, thread-block size and double scratch for Simple plans."""

from __future__ import annotations

import pytest

from codegen import CodegenError, compile_schedule
from executor.reference.prove import check_plan
from schedules.collectives import Collective
from synth import baselines
from topologies import resolve

TOPO = resolve("hgx_h200:gpus=2")
TOPO4 = resolve("hgx_h200:gpus=4")


def plan_for(collective: str, method: str, topology=TOPO, **options):
    schedule = getattr(baselines, method)(topology, Collective(collective, topology.nranks))
    return compile_schedule(schedule, topology, **options)


def op_names(plan, rank: int = 0) -> list[list[str]]:
    return [[op.name for op in tb.ops] for tb in plan.gpus[rank].threadblocks]


@pytest.mark.parametrize("topology", [TOPO, TOPO4], ids=["2", "4"])
@pytest.mark.parametrize(
    "collective,method",
    [
        ("allreduce", "direct"),
        ("allreduce", "twoshot"),
        ("allreduce", "ring"),
        ("reducescatter", "direct"),
        ("allgather", "direct"),
        ("allgather", "ring"),
    ],
)
def test_pipelined_plans_are_correct_on_the_reference_executor(topology, collective, method):
    plan = plan_for(collective, method, topology, instances=2, pipeline=3, protocol="simple", double_scratch=True)
    unit = plan.size_chunks * 4
    record = check_plan(plan, [unit * 4, unit * 16 + 4 * plan.size_chunks], dtypes=("fp32", "bf16"))
    assert record.ok


def test_a_pipelined_receiver_combines_each_piece_as_it_lands():
    plan = plan_for("allreduce", "direct", instances=1, pipeline=4, protocol="simple", double_scratch=True)
    recv, send = op_names(plan)
    assert recv == ["wait", "re"] * 4  # unpipelined: one wait for the whole piece, then one reduce
    assert send == ["put", "signal"] * 4  # never pws on memory channels: see codegen.fuse
    flat = op_names(plan_for("allreduce", "direct", protocol="simple", double_scratch=True))
    assert flat == [["wait", "re"], ["put", "signal"]]


def test_pipelined_twoshot_sends_every_piece_first_then_reduces_and_forwards_each():
    plan = plan_for("allreduce", "twoshot", pipeline=2, protocol="simple")
    (tb,) = op_names(plan)[:1]
    assert tb[:4] == ["put", "signal", "put", "signal"] and tb[4:6] == ["wait", "res"]


def test_double_scratch_drops_the_entry_handshake_of_a_one_shot_simple_plan():
    single = op_names(plan_for("allreduce", "direct", protocol="simple"))
    double = op_names(plan_for("allreduce", "direct", protocol="simple", double_scratch=True))
    assert single[0][0] == "signal" and single[1][0] == "wait"  # the reader's ready signal, the writer's wait
    assert "signal" not in double[0] and double[1] == ["put", "signal"]
    plan = plan_for("allreduce", "direct", protocol="simple", double_scratch=True)
    assert plan.use_double_scratch_buffer and plan.name.endswith("-2s")
    assert check_plan(plan, [plan.size_chunks * 64], dtypes=("fp32",)).ok


def test_threads_are_recorded_and_named():
    plan = plan_for("allreduce", "direct", protocol="ll", instances=4, threads=256)
    assert plan.num_threads_per_block == 256 and plan.name.endswith("-ll-x4-t256")
    assert plan_for("allreduce", "direct", protocol="ll").num_threads_per_block == 1024


@pytest.mark.parametrize(
    "options,field",
    [
        ({"threads": 100}, "--threads"),
        ({"threads": 2048}, "--threads"),
        ({"pipeline": 0}, "--pipeline"),
        ({"instances": 128, "pipeline": 4}, "--pipeline"),
        ({"instances": 512}, "--instances"),
        ({"protocol": "ll", "double_scratch": False}, "--double-scratch"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, field):
    with pytest.raises(CodegenError, match=field):
        plan_for("allreduce", "direct", **options)


def test_weft_compile_takes_the_options(tmp_path, capsys):
    from weft.cli import main

    schedule = tmp_path / "s.json"
    assert main(["synth", "allreduce", "-t", "hgx_h200:gpus=2", "--method", "direct", "-o", str(schedule)]) == 0
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "compile",
                str(schedule),
                "-t",
                "hgx_h200:gpus=2",
                "--protocol",
                "simple",
                "--instances",
                "4",
                "--pipeline",
                "2",
                "--threads",
                "512",
                "--double-scratch",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    pulled = tmp_path / "pull.json"
    assert (
        main(["compile", str(schedule), "-t", "hgx_h200:gpus=2", "--protocol", "simple", "--pull", "-o", str(pulled)])
        == 0
    )
    from schedules.plan.io import load_plan

    assert load_plan(pulled).name.endswith("-pull")
    plan = load_plan(out)
    assert plan.num_threads_per_block == 512 and plan.use_double_scratch_buffer and "-x4-p2-t512-2s" in plan.name
    capsys.readouterr()
    assert (
        main(["compile", str(schedule), "-t", "hgx_h200:gpus=2", "--threads", "33", "-o", str(tmp_path / "q.json")])
        == 2
    )
    assert "--threads" in capsys.readouterr().err and not (tmp_path / "q.json").exists()


PULLED = [
    ("allreduce", "direct"),
    ("allreduce", "twoshot"),
    ("allreduce", "ring"),
    ("reducescatter", "direct"),
    ("allgather", "direct"),
    ("allgather", "ring"),
    ("alltoall", "direct"),
]


@pytest.mark.parametrize("topology", [TOPO, TOPO4], ids=["2", "4"])
@pytest.mark.parametrize("collective,method", PULLED)
@pytest.mark.parametrize("instances,depth", [(1, 1), (2, 2)])
def test_pulled_plans_are_correct_and_safe_back_to_back(topology, collective, method, instances, depth):
    plan = plan_for(collective, method, topology, instances=instances, pipeline=depth, protocol="simple", pull=True)
    unit = plan.size_chunks * 4
    record = check_plan(plan, [unit * 4, unit * 16 + 4 * plan.size_chunks], dtypes=("fp32", "bf16"))
    assert record.ok and record.back_to_back == 2 and plan.name.endswith("-pull")
    assert any(b.type == "i" for g in plan.gpus for b in g.remote_buffers)  # someone reads a peer's input


def test_a_pulled_one_shot_reads_the_peer_and_sums_as_it_streams():
    plan = plan_for("allreduce", "direct", protocol="simple", pull=True)
    (tb,) = plan.gpus[0].threadblocks
    assert [op.name for op in tb.ops] == ["signal", "wait", "rre", "signal", "wait"]  # READY, its wait, DONE, its wait
    assert [b.type for b in plan.gpus[0].remote_buffers] == ["i"] and not plan.gpus[0].scratch_chunks
    two = plan_for("allreduce", "twoshot", protocol="simple", pull=True)
    (tb,) = two.gpus[0].threadblocks
    rres = next(op for op in tb.ops if op.name == "rres")
    assert [b.remote for b in rres.src_buff] == [False, True] and [b.remote for b in rres.dst_buff] == [False, True]


@pytest.mark.parametrize("drop,error", [(-1, "PlanRace"), (1, "PlanRace")])
def test_the_reference_executor_rejects_a_pull_without_its_notices(drop, error):
    from dataclasses import replace

    from executor.reference import machine

    plan = plan_for("allreduce", "direct", protocol="simple", pull=True)
    g = plan.gpus[0]
    (tb,) = g.threadblocks
    ops = tb.ops[:drop] if drop < 0 else tb.ops[:drop] + tb.ops[drop + 1 :]  # the DONE wait, or the READY wait
    cut = replace(plan, gpus=(replace(g, threadblocks=(replace(tb, ops=ops),)),) + plan.gpus[1:])
    with pytest.raises(getattr(machine, error)):
        check_plan(cut, [cut.size_chunks * 16], dtypes=("fp32",))


@pytest.mark.parametrize("options", [{"protocol": "ll"}, {"protocol": "simple", "inplace": True}])
def test_pull_is_refused_where_peers_inputs_cannot_be_read(options):
    with pytest.raises(CodegenError, match="--pull"):
        plan_for("allreduce", "direct", pull=True, **options)


def test_lamport_plans_accept_up_to_lamport_max_bytes_and_other_plans_refuse_the_option():
    wide = plan_for("allreduce", "direct", protocol="lamport", lamport_max_bytes=16 << 20)
    assert wide.max_message_size == 16 << 20 and wide.name.endswith("-lamport-x1-max16MB")
    assert plan_for("allreduce", "direct", protocol="lamport").max_message_size == 4 << 20
    for bad in (dict(protocol="ll", lamport_max_bytes=16 << 20), dict(protocol="lamport", lamport_max_bytes=1000)):
        with pytest.raises(CodegenError, match="--lamport-max-bytes"):
            plan_for("allreduce", "direct", **bad)


def test_ll_plans_accept_up_to_ll_max_bytes_and_other_plans_refuse_the_option():
    wide = plan_for("allreduce", "direct", protocol="ll", ll_max_bytes=16 << 20)
    assert wide.max_message_size == 16 << 20 and wide.name.endswith("-max16MB")
    assert check_plan(wide, [4096, 8 << 20], dtypes=("bf16",)).ok
    assert plan_for("allreduce", "direct", protocol="ll").max_message_size == 1 << 20
    for bad in (dict(protocol="simple", ll_max_bytes=16 << 20), dict(protocol="ll", ll_max_bytes=1000)):
        with pytest.raises(CodegenError, match="--ll-max-bytes"):
            plan_for("allreduce", "direct", **bad)
