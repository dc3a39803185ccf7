"""Assembly: thread-block programs of Drafts become a Plan, with channels, remote buffers and semaphores numbered.

Channel ends are numbered per rank in ``(peer, instance, direction)`` order. Both ends of a pair list the
same (instance, direction) keys for each other, so the m-th channel of a to b pairs with the m-th of b to a,
as ``schedules.plan`` requires.
"""

from __future__ import annotations

from codegen.ir import Channel, Draft, Loc
from schedules.plan.types import (
    BufferRef,
    ChannelRef,
    Gpu,
    Op,
    Plan,
    PlanMeta,
    RemoteBuffer,
    RemoteBufferRef,
    Threadblock,
)
from schedules.plan.types import Channel as PlanChannel


def assemble(
    programs: dict[int, dict[int, list[Draft]]],
    *,
    name: str,
    collective: str,
    protocol: str,
    inplace: bool,
    nranks: int,
    input_chunks: int,
    output_chunks: int,
    scratch: list[int],
    meta: PlanMeta,
) -> Plan:
    """The Plan for every rank's thread-block programs."""
    ends: list[set[Channel]] = [set() for _ in range(nranks)]
    for rank, tbs in programs.items():
        for ops in tbs.values():
            for c in (c for op in ops for c in op.channels):
                ends[rank].add(c)
                ends[c.peer].add(Channel(rank, c.direction, c.instance))  # packets leave no end on the receiver
    gpus = []
    for rank in range(nranks):
        tbs = programs.get(rank, {})
        channels = sorted(ends[rank], key=lambda c: (c.peer, c.instance, c.direction))
        channel_id = {c: i for i, c in enumerate(channels)}
        remote = sorted(
            {(loc.rank, loc.type) for ops in tbs.values() for op in ops for loc in op.src + op.dst if loc.rank != rank}
        )
        remote_id = {key: i for i, key in enumerate(remote)}
        nsem = 1 + max((s for ops in tbs.values() for op in ops for s in op.semaphores), default=-1)
        threadblocks = tuple(_threadblock(t, tbs[t], rank, channel_id, remote_id) for t in sorted(tbs))
        gpus.append(
            Gpu(
                id=rank,
                input_chunks=input_chunks,
                output_chunks=output_chunks,
                scratch_chunks=scratch[rank],
                threadblocks=threadblocks,
                channels=(PlanChannel("memory", tuple(c.peer for c in channels)),) if channels else (),
                remote_buffers=tuple(RemoteBuffer(r, t) for r, t in remote),
                semaphores=(0,) * nsem,
            )
        )
    return Plan(
        name=name,
        collective=collective,
        protocol=protocol,
        inplace=inplace,
        gpus=tuple(gpus),
        use_double_scratch_buffer=protocol == "LL",
        weft=meta,
    )


def _threadblock(
    tb: int, drafts: list[Draft], rank: int, channel_id: dict[Channel, int], remote_id: dict[tuple[int, str], int]
) -> Threadblock:
    used_channels = sorted({channel_id[c] for op in drafts for c in op.channels})
    used_remote: list[int] = []
    for op in drafts:
        for loc in op.src + op.dst:
            if loc.rank != rank and remote_id[(loc.rank, loc.type)] not in used_remote:
                used_remote.append(remote_id[(loc.rank, loc.type)])
    ops = []
    for op in drafts:

        def ref(loc: Loc) -> BufferRef:
            if loc.rank == rank:
                return BufferRef(loc.index, loc.size, type=loc.type)
            return BufferRef(loc.index, loc.size, buffer_id=used_remote.index(remote_id[(loc.rank, loc.type)]))

        ops.append(
            Op(
                op.name,
                "memory" if op.channels else None,
                tuple(channel_id[c] for c in op.channels),
                tuple(ref(entry) for entry in op.src),
                tuple(ref(entry) for entry in op.dst),
                op.semaphores,
            )
        )
    return Threadblock(
        tb,
        tuple(ops),
        (ChannelRef("memory", tuple(used_channels)),) if used_channels else (),
        (RemoteBufferRef("memory", tuple(used_remote)),) if used_remote else (),
    )
