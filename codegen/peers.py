"""Multi-peer ops: one thread block serves every peer, each phase one op over N-1 channels.

With ``multipeer`` codegen gives each instance one thread block (``compile_schedule``), so that block's program
holds, phase after phase, one op per peer: ``put, signal`` to each peer, a ``wait`` on each, a sum, then a put of
the sum to each peer. This pass gathers them, as MSCCL++'s 8-GPU kernels do: within each run of ops that wait for
nothing, signals move to the run's end (a signal may always come later), and neighbours of one kind become one op
over several channels: puts (and gets, copies, packet puts) to several peers one pairwise op, signals one signal
on every channel, waits one wait. ``codegen.fuse`` then makes ``res`` of a sum and its puts to every peer. The
GPU runs a plain pairwise op's pairs side by side (``executor.gpu.tables``), so every peer's link carries data at
once.

>>> from codegen.ir import Channel, Draft, Loc
>>> c1, c2 = Channel(1, 0), Channel(2, 0)
>>> ops = [Draft("put", (Loc(0, "i", 1),), (Loc(1, "s", 0),), (c1,)), Draft("signal", channels=(c1,)),
...        Draft("put", (Loc(0, "i", 2),), (Loc(2, "s", 0),), (c2,)), Draft("signal", channels=(c2,))]
>>> [(op.name, len(op.channels)) for op in gather_peers(ops)]
[('put', 2), ('signal', 2)]
"""

from __future__ import annotations

from dataclasses import replace

from codegen.ir import Draft, Loc

GATHERED = ("put", "get", "copy", "ppkt", "signal", "wait")  # ops whose neighbours of one kind merge
NON_BLOCKING = ("put", "get", "copy", "re", "rre", "ppkt", "signal", "sem_release")


def gather_peers(ops: list[Draft]) -> list[Draft]:
    """One thread block's program with its per-peer neighbours gathered into multi-peer ops."""
    out: list[Draft] = []
    for run in _runs(ops):
        if run[0].name in NON_BLOCKING:
            run = [op for op in run if op.name != "signal"] + [op for op in run if op.name == "signal"]
        for op in run:
            merged = _merge(out[-1], op) if out else None
            if merged is not None:
                out[-1] = merged
            else:
                out.append(op)
    return out


def _runs(ops: list[Draft]) -> list[list[Draft]]:
    """Maximal runs of ops that wait for nothing, and each waiting op as a run of its own."""
    runs: list[list[Draft]] = []
    for op in ops:
        free = op.name in NON_BLOCKING
        if runs and free and runs[-1][0].name in NON_BLOCKING:
            runs[-1].append(op)
        else:
            runs.append([op])
    return runs


def _merge(a: Draft, b: Draft) -> Draft | None:
    """a and b as one op, where they are of one gathered kind and b neither reads nor writes what a writes."""
    if a.name != b.name or a.name not in GATHERED or a.semaphores or b.semaphores:
        return None
    if a.name in ("signal", "wait"):
        return replace(a, channels=a.channels + b.channels)
    written = _slots(a.dst)
    if written & (_slots(b.src) | _slots(b.dst)) or _slots(b.dst) & _slots(a.src):
        return None
    return Draft(a.name, a.src + b.src, a.dst + b.dst, a.channels + b.channels, packet_src=a.packet_src + b.packet_src)


def _slots(locs: tuple[Loc, ...]) -> set[Loc]:
    return {s for loc in locs for s in loc.slots()}
