"""MSCCL XML export: every attribute MSCCL/RCCL read, one receive per send, acyclic dependencies."""

from collections import Counter
from xml.etree import ElementTree as ET

import networkx as nx
import pytest

from codegen.msccl_xml import to_msccl_xml
from schedules.collectives import Collective
from synth import baselines
from topologies.catalog import build

ALGO_ATTRS = {
    "name",
    "proto",
    "nchannels",
    "nchunksperloop",
    "ngpus",
    "coll",
    "inplace",
    "outofplace",
    "minBytes",
    "maxBytes",
}
STEP_ATTRS = {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"}
SENDS, RECVS = {"s", "rcs", "rrs", "rrcs"}, {"r", "rrc", "rcs", "rrs", "rrcs"}


@pytest.fixture(scope="module", params=[1, 2])
def ring8(request):
    topology = build("ring:n=8")
    xml = to_msccl_xml(baselines.ring(topology, Collective("allreduce", 8)), instances=request.param)
    return ET.fromstring(xml), request.param


def test_algo_has_every_attribute(ring8):
    algo, instances = ring8
    assert set(algo.attrib) == ALGO_ATTRS
    assert (algo.get("ngpus"), algo.get("coll"), algo.get("proto")) == ("8", "allreduce", "Simple")
    assert algo.get("nchannels") == str(instances) and algo.get("nchunksperloop") == str(8 * instances)
    assert (algo.get("inplace"), algo.get("outofplace"), algo.get("minBytes"), algo.get("maxBytes")) == (
        "0",
        "1",
        "0",
        "0",
    )


def test_gpus_threadblocks_and_steps_have_every_attribute(ring8):
    algo, _ = ring8
    gpus = algo.findall("gpu")
    assert [g.get("id") for g in gpus] == [str(r) for r in range(8)]
    for gpu in gpus:
        assert {"id", "i_chunks", "o_chunks", "s_chunks"} <= set(gpu.attrib)
        for tb in gpu.findall("tb"):
            assert set(tb.attrib) == {"id", "send", "recv", "chan"}
            steps = tb.findall("step")
            assert [s.get("s") for s in steps] == [str(i) for i in range(len(steps))]
            assert all(set(s.attrib) == STEP_ATTRS for s in steps)


def test_every_send_has_exactly_one_receive(ring8):
    algo, _ = ring8
    sends, recvs = Counter(), Counter()
    for gpu in algo.findall("gpu"):
        rank = int(gpu.get("id"))
        for tb in gpu.findall("tb"):
            chan, peer_send, peer_recv = tb.get("chan"), int(tb.get("send")), int(tb.get("recv"))
            for step in tb.findall("step"):
                if step.get("type") in SENDS:
                    sends[(rank, peer_send, chan)] += 1
                if step.get("type") in RECVS:
                    recvs[(peer_recv, rank, chan)] += 1
    assert sends == recvs and sum(sends.values()) == 2 * 7 * 8 * int(algo.get("nchannels"))


def test_dependencies_and_transfers_form_no_cycle(ring8):
    algo, _ = ring8
    graph = nx.DiGraph()
    queues: dict = {}
    for gpu in algo.findall("gpu"):
        rank = int(gpu.get("id"))
        tbs = gpu.findall("tb")
        for tb in tbs:
            t, steps = int(tb.get("id")), tb.findall("step")
            for i, step in enumerate(steps):
                node = (rank, t, i)
                if i:
                    graph.add_edge((rank, t, i - 1), node)
                if step.get("depid") != "-1":
                    dep = (rank, int(step.get("depid")), int(step.get("deps")))
                    assert dep[2] < len(tbs[dep[1]].findall("step"))
                    assert tbs[dep[1]].findall("step")[dep[2]].get("hasdep") == "1"
                    graph.add_edge(dep, node)
                if step.get("type") in SENDS:
                    queues.setdefault(("s", rank, int(tb.get("send")), tb.get("chan")), []).append(node)
                if step.get("type") in RECVS:
                    queues.setdefault(("r", int(tb.get("recv")), rank, tb.get("chan")), []).append(node)
    for (kind, src, dst, chan), nodes in queues.items():
        if kind == "s":
            for send, recv in zip(nodes, queues[("r", src, dst, chan)], strict=True):
                graph.add_edge(send, recv)
    assert nx.is_directed_acyclic_graph(graph)
