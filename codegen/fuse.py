"""Fusion: adjacent ops of one thread block that can be one op, so data crosses registers, not memory twice.

- ``re`` then ``put`` of its result becomes ``res`` (reduce, keep locally and send); ``rre`` (a sum that
  reads a peer) then ``put`` becomes ``rres``;
- ``repkt`` then ``ppkt`` of its result becomes ``respkt``;

``put`` then ``signal`` stay two ops: MSCCL++'s kernel runs ``pws`` on memory channels as a put without the
signal (it signals on port channels only), so a plan weft writes never uses it there.
"""

from __future__ import annotations

from codegen.ir import Draft


def fuse(ops: list[Draft]) -> list[Draft]:
    """The same thread-block program with fusable neighbours merged."""
    out: list[Draft] = []
    for op in ops:
        j = len(out)
        while j and out[j - 1].name == "sem_release":
            j -= 1  # a put may move ahead of releases: it only reads what this block wrote, and blocks on nothing
        fused = _pair(out[j - 1], op) if j and (j == len(out) or op.name in ("put", "ppkt")) else None
        if fused is not None:
            out[j - 1] = fused
        else:
            out.append(op)
    return out


def _pair(a: Draft, b: Draft) -> Draft | None:
    sends_sum = bool(a.dst) and bool(b.src) and all(s == a.dst[0] for s in b.src)  # to one peer or several
    if a.name == "re" and b.name == "put" and sends_sum:
        return Draft("res", a.src, a.dst + b.dst, b.channels)
    if (a.name, b.name) in (("res", "put"), ("rres", "put"), ("respkt", "ppkt")) and sends_sum:
        return Draft(a.name, a.src, a.dst + b.dst, a.channels + b.channels, packet_src=a.packet_src)  # more peers
    if a.name == "rre" and b.name == "put" and sends_sum:  # channels: remote srcs, then remote dsts
        return Draft("rres", a.src, a.dst + b.dst, a.channels + b.channels)
    if a.name == "repkt" and b.name == "ppkt" and sends_sum:
        return Draft("respkt", a.src, a.dst + b.dst, b.channels, packet_src=a.packet_src)
    return None
