"""All-to-all plans in the zero-copy capture flow, without GPUs (the fakes of tests/test_inference_capture_flow.py):
the LL all-to-all writes peers only in their scratch, so a captured call binds the captured tensors with no
exchange of buffers (the ranks only agree that every one binds); the Simple one writes peers' outputs, so their
captured outputs are exchanged when the capture closes."""

from __future__ import annotations

import pytest
from test_inference_capture_flow import Buffer, fake_communicator, lone_gather, opened, out_of, record_of
from test_inference_zero_copy import on_ranks, slots_of, walk

from executor.gpu import engine as comm_module
from topologies.catalog import build
from weft.pipeline import compile_and_verify, save_plan
from weft.synthesis import synthesize


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, object]:
    """The direct all-to-all for two H200s as an LL and a Simple plan file."""
    folder = tmp_path_factory.mktemp("alltoall-plans")
    topology = build("hgx_h200:gpus=2")
    schedule = synthesize(topology, "alltoall", "direct")
    paths = {}
    for protocol in ("ll", "simple"):
        paths[protocol] = folder / f"{protocol}.plan.json"
        save_plan(compile_and_verify(schedule, topology, protocol=protocol), paths[protocol])
    return paths


def test_a_captured_ll_all_to_all_binds_the_captured_tensors_with_no_exchange(plans):
    gather, calls = lone_gather(2)
    comm = fake_communicator(0, 2, gather, plans["ll"])
    with comm.capture():
        assert comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000)) == ""
        record, ctx = record_of(comm, 0)
        assert not any(walk(record, ctx.records.layout)[1:])  # disarmed while capturing
    assert calls == ["graph-bind", "graph-buffers"]  # the ranks agree to bind; no peer maps the captured tensors
    assert slots_of(record, ctx.records.layout)[:2] == [0x10000, 0x20000]
    assert len(comm.launches) == 1


def test_a_captured_simple_all_to_all_exchanges_peers_outputs_when_capture_closes(plans, monkeypatch):
    monkeypatch.setattr(comm_module.ipc, "export", lambda pointer: ("handle", pointer))
    monkeypatch.setattr(comm_module, "ipc_capable", lambda pointer: True)

    def body(rank, gather):
        comm = fake_communicator(rank, 2, gather, plans["simple"])
        with comm.capture():
            for k in range(2):
                assert (
                    comm.execute_captured(comm.plan, Buffer(out_of(rank, k) - 0x80000), Buffer(out_of(rank, k))) == ""
                )
        ctx = next(iter(comm._templates.values()))
        return ctx.peers, [slots_of(record_of(comm, k)[0], ctx.records.layout) for k in range(2)]

    for peers, slots in on_ranks(2, body):
        assert peers.exported == ("o",)  # the direct all-to-all puts each block straight into its owner's output
        ((slot, peer, _),) = peers.deferred
        assert [s[slot] for s in slots] == [opened(("handle", out_of(peer, k))) for k in range(2)]
