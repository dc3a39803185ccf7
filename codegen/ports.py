"""Port channels: every hop between ranks of different hosts moves to MSCCL++'s ``"port"`` channel type.

A Plan-in/Plan-out pass, run last. Host identity comes from the topology's ``hosts``: a channel whose two ranks
sit on one host stays a memory channel (CUDA IPC); a channel between hosts becomes a port channel, numbered
among the GPU's port channels in the same order (so the m-th channel a->b still pairs with the m-th b->a). Ops
are rewritten to what a port channel carries (``schedules.ops.PORT_OPS``):

- ``signal``/``wait``/``flush`` over channels of both kinds split into one op per channel type;
- ``put``/``pws``/``pwsf`` split into their memory pairs and their port pairs;
- ``res`` (reduce, keep, send) becomes ``re`` into its local destinations plus a ``put`` of the first local
  destination over the port channels (its intra-host sends stay fused);
- anything that reads remote memory or writes packets across hosts is refused (compile such plans Simple,
  without ``--pull``).

A port put is asynchronous: its source may change only after a ``flush`` of its channel. The pass flushes a
thread block's pending port channels before the block next writes one of their sources, before it lets another
block run on (``sem_release``, ``barrier``, a memory ``signal``), and at its end.

>>> from schedules.plan import parse_plan
>>> doc = {"name": "x", "collective": "allgather", "protocol": "Simple", "gpus": [
...     {"id": r, "input_chunks": 1, "output_chunks": 2, "channels": [{"channel_type": "memory",
...      "connected_to": [1 - r]}], "remote_buffers": [{"rank": 1 - r, "type": "o"}], "threadblocks": [
...      {"id": 0, "channels": [{"channel_type": "memory", "channel_ids": [0]}],
...       "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}], "ops": [
...       {"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
...        "dst_buff": [{"type": "o", "index": r, "size": 1}]},
...       {"name": "put", "channel_type": "memory", "channel_ids": [0],
...        "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"buffer_id": 0, "index": r, "size": 1}]},
...       {"name": "signal", "channel_type": "memory", "channel_ids": [0]},
...       {"name": "wait", "channel_type": "memory", "channel_ids": [0]}]}]} for r in range(2)]}
>>> plan = port_channels(parse_plan(doc, "x.json"), (0, 1))
>>> [op.name + ":" + str(op.channel_type) for op in plan.gpus[0].threadblocks[0].ops]
['copy:None', 'put:port', 'signal:port', 'wait:port', 'flush:port']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from codegen.protocol import CodegenError
from schedules.ops import PORT_OPS
from schedules.plan.types import (
    BufferRef,
    Channel,
    ChannelRef,
    Gpu,
    Op,
    Plan,
    RemoteBufferRef,
    Threadblock,
    op_channels,
)

MEMORY, PORT = "memory", "port"


def crosses_hosts(hosts: Sequence[int]) -> bool:
    """Whether ranks on ``hosts`` (host of each rank) span more than one host."""
    return len(set(hosts)) > 1


def port_channels(plan: Plan, hosts: Sequence[int]) -> Plan:
    """``plan`` with every channel between ranks of different hosts (``hosts[rank]``) a port channel."""
    if len(hosts) != plan.nranks:
        raise CodegenError(
            f"plan {plan.name}: the topology places {len(hosts)} ranks on hosts, the plan has {plan.nranks}"
        )
    return replace(plan, gpus=tuple(_gpu(plan, g, hosts) for g in plan.gpus))


class _Ids:
    """Old memory-channel and remote-buffer ids of one GPU -> (channel type, new id)."""

    def __init__(self, gpu: Gpu, hosts: Sequence[int]):
        self.cross = [hosts[p] != hosts[gpu.id] for p in gpu.memory_peers]
        self.channel = _renumber(self.cross)
        self.buffer_cross = [hosts[b.rank] != hosts[gpu.id] for b in gpu.remote_buffers]

    def kind(self, cid: int) -> str:
        return PORT if self.cross[cid] else MEMORY


def _renumber(cross: list[bool]) -> list[tuple[str, int]]:
    counts = {MEMORY: 0, PORT: 0}
    out = []
    for c in cross:
        kind = PORT if c else MEMORY
        out.append((kind, counts[kind]))
        counts[kind] += 1
    return out


def _gpu(plan: Plan, gpu: Gpu, hosts: Sequence[int]) -> Gpu:
    ids = _Ids(gpu, hosts)
    peers = gpu.memory_peers
    channels = tuple(
        Channel(kind, tuple(p for p, c in zip(peers, ids.cross, strict=True) if c == (kind == PORT)))
        for kind in (MEMORY, PORT)
        if any(c == (kind == PORT) for c in ids.cross)
    )
    others = tuple(c for c in gpu.channels if c.channel_type != MEMORY)
    remote = tuple(
        replace(b, access_channel_types=(PORT,) if cross else b.access_channel_types)
        for b, cross in zip(gpu.remote_buffers, ids.buffer_cross, strict=True)
    )
    tbs = tuple(_threadblock(plan, gpu, tb, ids) for tb in gpu.threadblocks)
    return replace(gpu, channels=channels + others, remote_buffers=remote, threadblocks=tbs)


def _threadblock(plan: Plan, gpu: Gpu, tb: Threadblock, ids: _Ids) -> Threadblock:
    ops: list[Op] = []
    for i, op in enumerate(tb.ops):
        ops.extend(_rewrite(plan, gpu, tb, i, op, ids))
    ops = _with_flushes(ops)
    used: dict[str, set[int]] = {MEMORY: set(), PORT: set()}
    for op in ops:
        if op.channel_type in used:
            used[op.channel_type].update(op.channel_ids)
    channels = tuple(ChannelRef(k, tuple(sorted(used[k]))) for k in (MEMORY, PORT) if used[k])
    refs = _buffer_refs(ops)
    return replace(
        tb,
        ops=tuple(_renumber_buffers(op, refs) for op in ops),
        channels=channels,
        remote_buffer_refs=tuple(RemoteBufferRef(k, tuple(v)) for k, v in refs.items() if v),
    )


# Between _rewrite and _renumber_buffers an op's remote entries hold the GPU's remote-buffer id (not yet the
# thread block's index into its refs of the op's channel type), so that splitting never renumbers twice.
def _rewrite(plan: Plan, gpu: Gpu, tb: Threadblock, index: int, op: Op, ids: _Ids) -> list[Op]:
    if op.channel_type != MEMORY:
        return [op]
    op = _absolute(gpu, tb, op)
    kinds = [ids.kind(c) for c in op.channel_ids]
    if PORT not in kinds:
        return [_move(op, ids, op.channel_ids)]
    where = f"plan {plan.name}: gpus[{gpu.id}].threadblocks[{tb.id}].ops[{index}]"
    if op.spec.device in ("signal", "wait", "flush"):
        return [
            _move(op, ids, tuple(c for c, k in zip(op.channel_ids, kinds, strict=True) if k == kind))
            for kind in (MEMORY, PORT)
            if kind in kinds
        ]
    if op.name in ("put", "pws", "pwsf"):
        out = []
        for kind in (MEMORY, PORT):
            pairs = [
                (s, d, c)
                for s, d, c in zip(op.src_buff, op.dst_buff, op.channel_ids, strict=True)
                if ids.kind(c) == kind
            ]
            if pairs:
                src, dst, cids = zip(*pairs, strict=True)
                out.append(_move(replace(op, src_buff=src, dst_buff=dst), ids, cids))
        return out
    if op.name == "res":
        return _split_res(op, ids, where)
    raise CodegenError(
        f"{where}: op {op.name!r} crosses hosts, but port channels carry only "
        f"{', '.join(sorted(PORT_OPS))} (compile multi-host plans with the Simple protocol, "
        "without --pull)"
    )


def _split_res(op: Op, ids: _Ids, where: str) -> list[Op]:
    local = tuple(b for b in op.dst_buff if not b.remote)
    remote = [(b, c) for b, c in op_channels(op)]
    if not local:
        raise CodegenError(
            f"{where}: op 'res' sends a sum across hosts without keeping it locally; a port put needs a local source"
        )
    near = [(b, c) for b, c in remote if ids.kind(c) == MEMORY]
    far = [(b, c) for b, c in remote if ids.kind(c) == PORT]
    if near:
        first = Op("res", MEMORY, tuple(c for _, c in near), op.src_buff, local + tuple(b for b, _ in near))
        out = [_move(first, ids, first.channel_ids)]
    else:
        out = [Op("re", None, (), op.src_buff, local)]
    put = Op("put", MEMORY, tuple(c for _, c in far), (local[0],) * len(far), tuple(b for b, _ in far))
    return out + [_move(put, ids, put.channel_ids)]


def _absolute(gpu: Gpu, tb: Threadblock, op: Op) -> Op:
    def fix(b: BufferRef) -> BufferRef:
        if not b.remote:
            return b
        assert b.buffer_id is not None  # parse_plan gave every remote entry its buffer_id
        return replace(b, buffer_id=tb.remote_buffer_id(MEMORY, b.buffer_id))

    return replace(op, src_buff=tuple(map(fix, op.src_buff)), dst_buff=tuple(map(fix, op.dst_buff)))


def _move(op: Op, ids: _Ids, cids: Sequence[int]) -> Op:
    kind = ids.kind(cids[0]) if cids else MEMORY
    return replace(op, channel_type=kind, channel_ids=tuple(ids.channel[c][1] for c in cids))


def _buffer_refs(ops: list[Op]) -> dict[str, list[int]]:
    refs: dict[str, list[int]] = {MEMORY: [], PORT: []}
    for op in ops:
        for b in op.src_buff + op.dst_buff:
            if not b.remote:
                continue
            assert b.buffer_id is not None and op.channel_type is not None  # parse_plan: a remote entry names both
            if b.buffer_id not in refs[op.channel_type]:
                refs[op.channel_type].append(b.buffer_id)
    return refs


def _renumber_buffers(op: Op, refs: dict[str, list[int]]) -> Op:
    def fix(b: BufferRef) -> BufferRef:
        if not b.remote:
            return b
        assert b.buffer_id is not None and op.channel_type is not None  # parse_plan: a remote entry names both
        return replace(b, buffer_id=refs[op.channel_type].index(b.buffer_id))

    return replace(op, src_buff=tuple(map(fix, op.src_buff)), dst_buff=tuple(map(fix, op.dst_buff)))


def _with_flushes(ops: list[Op]) -> list[Op]:
    """Flush pending port puts before their sources change, before the block lets another run on, and at its end."""
    out: list[Op] = []
    pending: dict[int, list[BufferRef]] = {}  # port channel id -> the sources of its unflushed puts

    def flush(cids: Sequence[int]) -> None:
        if cids:
            out.append(Op("flush", PORT, tuple(sorted(cids))))
            for c in cids:
                pending.pop(c, None)

    for op in ops:
        releases = op.name in ("sem_release", "barrier") or (op.spec.device == "signal" and op.channel_type == MEMORY)
        if releases:
            flush(list(pending))
        else:
            writes = [b for b in op.dst_buff if not b.remote]
            flush([c for c, srcs in pending.items() if any(_overlap(w, s) for w in writes for s in srcs)])
        if op.name == "flush" and op.channel_type == PORT:
            for c in op.channel_ids:
                pending.pop(c, None)
        out.append(op)
        if op.channel_type == PORT and op.spec.buffers and op.name != "pwsf":  # pwsf flushes itself
            for src, c in zip(op.src_buff, op.channel_ids, strict=False):
                pending.setdefault(c, []).append(src)
    flush(list(pending))
    return out


def _overlap(a: BufferRef, b: BufferRef) -> bool:
    if a.type != b.type:
        return "s" not in (a.type, b.type)  # in place, i and o share memory: assume they overlap
    return a.index < b.index + b.size and b.index < a.index + a.size
