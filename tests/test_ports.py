"""Port channels: codegen puts every hop between hosts on one, the parser accepts them, and the CPU reference
executor runs them with MSCCL++'s ordering (a signal orders its channel's puts; flush completes the local side)."""

from pathlib import Path

import pytest

from codegen import CodegenError, compile_schedule
from executor.reference.machine import PlanRace
from executor.reference.prove import check_plan, run_reference
from schedules.collectives import Collective
from schedules.plan.io import dumps_plan, parse_plan
from schedules.plan.types import PlanError
from synth.baselines import ring
from topologies import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[1] / "examples" / "topologies"


def _plan(topology_name: str, collective: str):
    topology = load_topology(TOPOLOGIES / f"{topology_name}.json")
    schedule = ring(topology, Collective(collective, topology.nranks))
    return topology, compile_schedule(schedule, topology)


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
def test_every_hop_between_two_hosts_is_a_port_channel_and_the_plan_is_proven(collective):
    _, plan = _plan("two_hosts", collective)
    assert plan.protocol == "Simple"
    for gpu in plan.gpus:
        assert gpu.memory_peers == () and gpu.port_peers
        names = {op.name for tb in gpu.threadblocks for op in tb.ops if op.channel_type == "port"}
        assert names <= {"put", "pws", "signal", "wait", "flush"} and "flush" in names
    assert check_plan(plan, [plan.size_chunks * 64], ("fp32", "bf16")).ok
    assert parse_plan(__import__("json").loads(dumps_plan(plan)), "x.json") == plan


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter"])
def test_two_hosts_of_two_gpus_keep_memory_channels_inside_a_host(collective):
    topology, plan = _plan("two_hosts_2gpu", collective)
    for gpu in plan.gpus:
        assert all(topology.hosts[p] == topology.hosts[gpu.id] for p in gpu.memory_peers)
        assert all(topology.hosts[p] != topology.hosts[gpu.id] for p in gpu.port_peers)
        for b in gpu.remote_buffers:
            assert b.access_channel_types == (
                ("memory",) if topology.hosts[b.rank] == topology.hosts[gpu.id] else ("port",)
            )
    assert any(g.memory_peers for g in plan.gpus) and any(g.port_peers for g in plan.gpus)
    assert check_plan(plan, [plan.size_chunks * 16], ("fp16",)).ok


def test_packets_or_pulls_across_hosts_are_refused():
    topology = load_topology(TOPOLOGIES / "two_hosts.json")
    schedule = ring(topology, Collective("allgather", 2))
    with pytest.raises(CodegenError, match="port channels"):
        compile_schedule(schedule, topology, protocol="ll")
    with pytest.raises(CodegenError, match="port channels"):
        compile_schedule(schedule, topology, pull=True)


def _two_rank_plan(ops0, ops1, port_channels=1, scratch=1):
    """An allgather of 2 ranks whose rank 0 runs ops0 and rank 1 ops1 over ``port_channels`` port channels."""

    def gpu(r, ops):
        return {
            "id": r,
            "input_chunks": 1,
            "output_chunks": 2,
            "scratch_chunks": scratch,
            "channels": [{"channel_type": "port", "connected_to": [1 - r] * port_channels}],
            "remote_buffers": [{"rank": 1 - r, "type": "o", "access_channel_types": ["port"]}],
            "threadblocks": [
                {
                    "id": 0,
                    "ops": ops,
                    "channels": [{"channel_type": "port", "channel_ids": list(range(port_channels))}],
                    "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0]}],
                }
            ],
        }

    return parse_plan(
        {"name": "p", "collective": "allgather", "protocol": "Simple", "gpus": [gpu(0, ops0), gpu(1, ops1)]}, "p.json"
    )


def _copy(src, si, dst, di):
    return {
        "name": "copy",
        "src_buff": [{"type": src, "index": si, "size": 1}],
        "dst_buff": [{"type": dst, "index": di, "size": 1}],
    }


def _put(name, r, src="i", cid=0):
    return {
        "name": name,
        "channel_type": "port",
        "channel_ids": [cid],
        "src_buff": [{"type": src, "index": 0, "size": 1}],
        "dst_buff": [{"buffer_id": 0, "index": r, "size": 1}],
    }


def _sync(name, cid=0):
    return {"name": name, "channel_type": "port", "channel_ids": [cid]}


def _exchange(r, first=(), then=()):
    return [_copy("i", 0, "o", r), *first, _put("pws", r), _sync("wait"), _sync("flush"), *then]


def test_a_port_exchange_with_signal_wait_and_flush_runs_correct():
    import numpy as np

    plan = _two_rank_plan(_exchange(0), _exchange(1))
    out = run_reference(plan, [np.full(4, 1.0), np.full(4, 2.0)], 32, "fp32")
    assert [list(o) for o in out] == [[1.0] * 4 + [2.0] * 4] * 2


def test_a_signal_orders_only_the_puts_of_its_own_channel():
    # rank 0 puts on port channel 0 but signals on channel 1: with memory channels the put would be complete at
    # the signal, with port channels rank 1 has no edge to the data
    ops0 = [_copy("i", 0, "o", 0), _put("put", 0, cid=0), _sync("signal", cid=1), _sync("flush", cid=0)]
    ops1 = [_copy("i", 0, "o", 1), _sync("wait", cid=1), _copy("o", 0, "s", 0)]
    with pytest.raises(PlanRace, match="rank 1 threadblock 0 op 2 .* reads chunk 0 of rank 1's output buffer"):
        check_plan(_two_rank_plan(ops0, ops1, port_channels=2), [8], ("fp32",), back_to_back=1)


def test_a_put_source_may_change_only_after_a_flush():
    staged = [_copy("i", 0, "s", 0), _put("pws", 0, src="s")]
    overwrite = [_copy("i", 0, "s", 0)]
    ops0 = [_copy("i", 0, "o", 0), *staged, *overwrite, _sync("wait"), _sync("flush")]
    ops1 = _exchange(1)
    with pytest.raises(
        PlanRace, match="overwrites chunk 0 of rank 0's scratch buffer while a put in flight on rank 0's port channel 0"
    ):
        check_plan(_two_rank_plan(ops0, ops1), [8], ("fp32",), back_to_back=1)
    flushed = [_copy("i", 0, "o", 0), *staged, _sync("flush"), *overwrite, _sync("wait")]
    assert check_plan(_two_rank_plan(flushed, ops1), [8], ("fp32",), back_to_back=1).ok
    put_signal_flush = [
        _copy("i", 0, "o", 0),
        _copy("i", 0, "s", 0),
        _put("pwsf", 0, src="s"),
        *overwrite,
        _sync("wait"),
    ]
    assert check_plan(_two_rank_plan(put_signal_flush, ops1), [8], ("fp32",), back_to_back=1).ok


def test_a_port_channel_carries_puts_and_signals_only():
    get = {
        "name": "get",
        "channel_type": "port",
        "channel_ids": [0],
        "src_buff": [{"buffer_id": 0, "index": 1, "size": 1}],
        "dst_buff": [{"type": "o", "index": 1, "size": 1}],
    }
    with pytest.raises(
        PlanError,
        match=r"p.json: gpus\[0\].threadblocks\[0\].ops\[0\].channel_type: op 'get' "
        "cannot run on a port channel",
    ):
        _two_rank_plan([get], _exchange(1))


def test_a_plan_with_cuda_ipc_between_the_topologys_hosts_is_not_committed(tmp_path):
    from registry.store import RegistryError
    from weft import publish

    plan = parse_plan(
        __import__("json").loads(
            (Path(__file__).parent / "gpu" / "plans" / "allreduce-direct-simple-x1.json").read_text()
        ),
        "p.json",
    )
    plan = plan.with_meta(topology="")  # a plan from elsewhere, committed for the two-host topology
    with pytest.raises(
        RegistryError,
        match=r"gpus\[0\] memory channel 0 joins rank 0 \(topology two_hosts host 0\) "
        r"and rank 1 \(topology two_hosts host 1\): a memory channel is CUDA IPC",
    ):
        publish.commit(plan, str(TOPOLOGIES / "two_hosts.json"), str(tmp_path / "registry"))
    assert not (tmp_path / "registry").exists() or not list((tmp_path / "registry").rglob("*.json"))
