"""MSCCL XML export: a Schedule as an ``<algo>`` for the MSCCL and RCCL interpreters.

MSCCL moves data with paired send and receive steps over NCCL connections: a thread block sends to at most
one peer and receives from at most one peer on one channel, and the k-th send of a (sender, receiver,
channel) meets the k-th receive. Each schedule send becomes an ``s`` step in the sender's thread block for
that peer and an ``r`` (copy) or ``rrc`` (receive, reduce with the local copy, store) step in the
receiver's thread block for the sender, both in the schedule's order, so every send has exactly one receive.
Final local copies are ``cpy`` steps. A step that must follow a step of another thread block names it with
``depid``/``deps``; MSCCL allows one such edge per step, so extra edges become ``nop`` steps before it.
Instances become channels: instance i moves piece j·k+i of every chunk on channel i.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import cast
from xml.etree import ElementTree as ET

from codegen.buffers import Placement, place_buffers
from codegen.ir import Loc
from codegen.protocol import CodegenError, choose_protocol, size_range
from schedules.compact import expand
from schedules.plan.types import MAX_MESSAGE_SIZE
from schedules.schedule import Schedule


@dataclass
class _Step:
    type: str
    src: Loc | None
    dst: Loc | None
    reads: list[Loc]
    writes: list[Loc]
    dep: tuple[int, int] | None = None
    hasdep: bool = False


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    steps: list[_Step] = field(default_factory=list)


def to_msccl_xml(schedule: Schedule, instances: int = 1, protocol: str = "auto", name: str | None = None) -> str:
    """MSCCL XML for ``schedule`` with every attribute MSCCL/RCCL require."""
    schedule = expand(schedule)
    collective = schedule.collective
    proto = choose_protocol(schedule, protocol)
    if proto not in ("Simple", "LL"):
        raise CodegenError(f"--protocol {protocol}: MSCCL's XML carries Simple and LL only")
    placement = place_buffers(collective)
    tbs = _thread_blocks(schedule, placement, instances)
    n = collective.nranks
    lo, hi = size_range(proto)
    algo = ET.Element(
        "algo",
        {
            "name": name or f"{schedule.name or collective.name}-msccl",
            "proto": proto,
            "nchannels": str(instances),
            "nchunksperloop": str(collective.size_chunks * instances),
            "ngpus": str(n),
            "coll": collective.facts.msccl_coll or collective.name,
            "inplace": "0",
            "outofplace": "1",
            "minBytes": str(lo),
            "maxBytes": "0" if hi == MAX_MESSAGE_SIZE else str(hi),
        },
    )
    for r in range(n):
        gpu = ET.SubElement(
            algo,
            "gpu",
            {
                "id": str(r),
                "i_chunks": str(placement.input_chunks * instances),
                "o_chunks": str(placement.output_chunks * instances),
                "s_chunks": str(placement.scratch[r] * instances),
            },
        )
        for t, role in enumerate(_tb_order(tbs[r])):
            tb = tbs[r][role]
            el = ET.SubElement(
                gpu, "tb", {"id": str(t), "send": str(tb.send), "recv": str(tb.recv), "chan": str(tb.chan)}
            )
            for s, st in enumerate(tb.steps):
                ET.SubElement(el, "step", _step_attrs(s, st, _tb_order(tbs[r])))
    ET.indent(algo)
    return ET.tostring(algo, encoding="unicode") + "\n"


def _thread_blocks(schedule: Schedule, placement: Placement, instances: int) -> list[dict[tuple, _Tb]]:
    """Each rank's thread blocks (by role) with their steps, dependencies filled in."""
    collective = schedule.collective
    n = collective.nranks
    tbs: list[dict[tuple, _Tb]] = [{} for _ in range(n)]
    order: list[list[tuple[tuple, _Step]]] = [[] for _ in range(n)]

    def add(rank: int, role: tuple, step: _Step) -> None:
        kind, peer, chan = role
        tb = tbs[rank].setdefault(role, _Tb(peer if kind == "send" else -1, peer if kind == "recv" else -1, chan))
        tb.steps.append(step)
        order[rank].append((role, step))

    # a rank's input buffer has a slot for every chunk of its precondition (both come from input_map)
    loc: list[dict[int, Loc]] = [
        {c: cast(Loc, placement.input_loc(r, c)) for c in collective.precondition(r)} for r in range(n)
    ]
    for step in schedule.steps:
        reading = {(s.src, s.chunk) for s in step.sends}
        sums: dict[tuple[int, int], Loc] = {}  # reductions of this step so far: they add up
        receives = []
        for send in step.sends:
            d, c = send.dst, send.chunk
            src = loc[send.src][c]
            if send.op == "reduce":
                dst = placement.home(d, c)
                held = sums.get((d, c), loc[d].get(c))
                recv = _Step("rrc", held, dst, [held], [dst]) if held else _Step("r", src, dst, [], [dst])
                sums[(d, c)] = dst
            else:
                dst = placement.home(d, c) if (d, c) not in reading else placement.new_scratch(d)
                recv = _Step("r", src, dst, [], [dst])
            for i in range(instances):
                add(send.src, ("send", d, i), _piece(_Step("s", src, dst, [src], []), instances, i))
            receives.append((d, send.src, c, dst, recv))
        for d, peer, c, dst, recv in receives:  # sends read the step's starting state, so they go first
            for i in range(instances):
                add(d, ("recv", peer, i), _piece(recv, instances, i))
            loc[d][c] = dst
    for r in range(n):
        for c in sorted(collective.postcondition(r)):
            out = placement.output_loc(r, c)
            if out is not None and loc[r].get(c) not in (None, out):
                for i in range(instances):
                    add(r, ("local", -1, i), _piece(_Step("cpy", loc[r][c], out, [loc[r][c]], [out]), instances, i))
    for r in range(n):
        _dependencies(tbs[r], order[r])
    return tbs


def _piece(step: _Step, instances: int, i: int) -> _Step:
    def q(loc: Loc) -> Loc:
        return Loc(loc.rank, loc.type, loc.index * instances + i)

    def p(loc: Loc | None) -> Loc | None:
        return None if loc is None else q(loc)

    return _Step(step.type, p(step.src), p(step.dst), [q(x) for x in step.reads], [q(x) for x in step.writes])


def _tb_order(tbs: dict[tuple, _Tb]) -> list[tuple]:
    return sorted(tbs, key=lambda role: (role[2], role[0], role[1]))


def _dependencies(tbs: dict[tuple, _Tb], order: list[tuple[tuple, _Step]]) -> None:
    """Fill depid/deps from slot reads and writes in logical order; extra edges become nop steps."""
    ids = {role: t for t, role in enumerate(_tb_order(tbs))}
    needs = _cross_tb_needs(order)
    for tb in tbs.values():
        steps: list[_Step] = []
        for step in tb.steps:
            edges = sorted(needs[id(step)].items(), key=lambda kv: ids[kv[0]])
            for other, _ in edges[:-1]:
                steps.append(_Step("nop", None, None, [], [], dep=(ids[other], id(needs[id(step)][other]))))
            if edges:
                step.dep = (ids[edges[-1][0]], id(edges[-1][1]))
            steps.append(step)
        tb.steps = steps
    index = {id(s): (ids[role], k) for role, tb in tbs.items() for k, s in enumerate(tb.steps)}
    for tb in tbs.values():
        for s in tb.steps:
            if s.dep is not None:
                s.dep = index[s.dep[1]]
    for tb in tbs.values():
        for s in tb.steps:
            if s.dep is not None:
                t, k = s.dep
                target = tbs[_tb_order(tbs)[t]].steps[k]
                target.hasdep = True


def _cross_tb_needs(order: list[tuple[tuple, _Step]]) -> dict[int, dict[tuple, _Step]]:
    """Per step (by id), the last step of each other thread block it must wait for (slot reads and writes)."""
    writer: dict[Loc, tuple[tuple, _Step]] = {}
    readers: dict[Loc, list[tuple[tuple, _Step]]] = defaultdict(list)
    needs: dict[int, dict[tuple, _Step]] = {}
    for role, step in order:
        want: dict[tuple, _Step] = {}
        sources = [writer.get(x) for x in step.reads + step.writes]
        sources += [r for x in step.writes for r in readers[x]]
        for source in sources:
            if source is not None and source[0] != role:
                want[source[0]] = source[1]  # later steps of one tb replace earlier ones: program order covers them
        needs[id(step)] = want
        for x in step.reads:
            readers[x].append((role, step))
        for x in step.writes:
            writer[x], readers[x] = (role, step), []
    return needs


def _step_attrs(s: int, st: _Step, roles: list[tuple]) -> dict[str, str]:
    def buf(loc: Loc | None) -> tuple[str, str]:
        return ("i", "-1") if loc is None else (loc.type, str(loc.index))

    srcbuf, srcoff = buf(st.src)
    dstbuf, dstoff = buf(st.dst)
    depid, deps = st.dep if st.dep is not None else (-1, -1)
    return {
        "s": str(s),
        "type": st.type,
        "srcbuf": srcbuf,
        "srcoff": srcoff,
        "dstbuf": dstbuf,
        "dstoff": dstoff,
        "cnt": "1",
        "depid": str(depid),
        "deps": str(deps),
        "hasdep": "1" if st.hasdep else "0",
    }
