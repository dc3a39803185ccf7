"""Fit a plan to MSCCL++'s fixed-size executor tables (``schedules.mscclpp_format``): an op holds at most 10 buffer
entries per side, and a thread block at most 64 ops.

- A reduction over more than 10 sources first sums the first 10 into its local ``dst_buff[0]``, then adds the
  rest to it (the same additions in the same order, so the same rounding); more than 10 destinations are
  written by copies of ``dst_buff[0]`` after the sum (``put``/``ppkt`` to peers, ``copy``/``cpkt`` locally).
- A pairwise op of more than 10 pairs becomes several ops of at most 10.
- A thread block of more than 64 ops continues in a new thread block: the first releases a fresh semaphore as its
  last op, the next acquires it first, so the ops keep their order (the continuation lists the same channels).

>>> from schedules.plan import BufferRef, Op
>>> wide = Op("re", src_buff=tuple(BufferRef(k, 1, type="s") for k in range(12)), dst_buff=(BufferRef(0, 1, "o"),))
>>> [(op.name, len(op.src_buff)) for op in split_op(wide)]
[('re', 10), ('re', 3)]
"""

from __future__ import annotations

from dataclasses import replace

from schedules.mscclpp_format import MAX_BUFFERS_PER_OPERATION, MAX_OPERATION
from schedules.plan.types import BufferRef, Gpu, Op, Plan, Threadblock

_FIRST = {
    "re": "re",
    "res": "re",
    "rre": "rre",
    "rres": "rre",
    "repkt": "repkt",
    "respkt": "repkt",
    "recpkt": "repkt",
    "recspkt": "repkt",
}  # the op that sums the first sources into dst_buff[0] alone
_COPIES = {(True, False): "put", (True, True): "ppkt", (False, False): "copy", (False, True): "cpkt"}


def fit_mscclpp_limits(plan: Plan) -> Plan:
    """``plan`` with every op and thread block within MSCCL++'s limits (unchanged where it already is)."""
    return replace(plan, gpus=tuple(_fit_gpu(g) for g in plan.gpus))


def _fit_gpu(gpu: Gpu) -> Gpu:
    semaphores = list(gpu.semaphores)
    heads, tails = [], []
    for tb in gpu.threadblocks:
        parts = _chain(replace(tb, ops=tuple(o for op in tb.ops for o in split_op(op))), semaphores)
        heads.append(parts[0])
        tails += parts[1:]
    tbs = heads + [replace(tb, id=len(heads) + k) for k, tb in enumerate(tails)]
    return replace(gpu, threadblocks=tuple(tbs), semaphores=tuple(semaphores))


def _chain(tb: Threadblock, semaphores: list[int]) -> list[Threadblock]:
    """``tb`` as thread blocks of at most MAX_OPERATION ops, each releasing the semaphore the next acquires."""
    parts, ops = [], tb.ops
    while len(ops) > MAX_OPERATION:
        sem = len(semaphores)
        semaphores.append(0)
        parts.append(replace(tb, ops=ops[: MAX_OPERATION - 1] + (Op("sem_release", semaphore_ids=(sem,)),)))
        ops = (Op("sem_acquire", semaphore_ids=(sem,)),) + ops[MAX_OPERATION - 1 :]
    return parts + [replace(tb, ops=ops)]


def split_op(op: Op) -> list[Op]:
    """``op`` as ops of at most MAX_BUFFERS_PER_OPERATION entries per side, run in order (``[op]`` if it fits)."""
    n = MAX_BUFFERS_PER_OPERATION
    if len(op.src_buff) <= n and len(op.dst_buff) <= n:
        return [op]
    spec = op.spec
    if spec.signals:
        return [op]  # each part would signal: left as it is (mscclpp_verdict names it)
    if spec.pairwise and len(op.src_buff) == len(op.dst_buff):
        return [
            _with_entries(op, op.src_buff[k : k + n], op.dst_buff[k : k + n]) for k in range(0, len(op.src_buff), n)
        ]
    first = op.dst_buff[0] if op.dst_buff else None
    if not spec.reduces or first is None or first.remote or op.tbg is not None or first in op.src_buff[n:]:
        return [op]  # nothing to sum into: left as it is (mscclpp_verdict names it)
    ops = []
    srcs = op.src_buff
    while len(srcs) > n:  # sum the first n sources into dst_buff[0], then add the rest to it
        ops.append(_with_entries(replace(op, name=_FIRST[op.name]), srcs[:n], (first,)))
        srcs = (first,) + srcs[n:]
    head = op.dst_buff[:n]
    ops.append(_with_entries(op, srcs, head))
    rest = op.dst_buff[n:]
    for remote, packet in _COPIES:  # the destinations past the first n: copies of the sum in dst_buff[0]
        group = [d for k, d in enumerate(rest, n) if d.remote == remote and spec.writes_packet(d.remote, k) == packet]
        for k in range(0, len(group), n):
            dsts = tuple(group[k : k + n])
            ops.append(
                _with_entries(Op(_COPIES[(remote, packet)], op.channel_type), (first,) * len(dsts), dsts, source=op)
            )
    return ops


def _with_entries(op: Op, srcs: tuple[BufferRef, ...], dsts: tuple[BufferRef, ...], source: Op | None = None) -> Op:
    """``op`` on these entries, with the channel ids of its remote ones (remote srcs first, as ``op_channels``)."""
    source = source or op
    by_entry = _channels(source)
    remote = [b for b in srcs if b.remote] + [b for b in dsts if b.remote]
    ids = tuple(by_entry[id(b)] for b in remote) if source.channel_ids else ()
    return replace(op, src_buff=tuple(srcs), dst_buff=tuple(dsts), channel_ids=ids)


def _channels(op: Op) -> dict[int, int]:
    remote = [b for b in op.src_buff if b.remote] + [b for b in op.dst_buff if b.remote]
    return {id(b): c for b, c in zip(remote, op.channel_ids, strict=False)}
