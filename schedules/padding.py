"""Any message size on a plan: each part of the message padded to the plan's granule.

A plan moves chunks of whole 4-byte words, so it runs a message directly only where the message is a multiple of
its granule (``size_chunks × 4`` bytes: 192 B for an allgather of 6 chunks per rank on 8 ranks). A user's
tensors have the sizes they have, so every other size runs padded: the message is cut into the collective's
parts (``Collective.message_parts``: one per rank for the collectives that move a rank's slice, one for
allreduce, broadcast and reduce), each part is staged at the place of a part rounded up to the granule's share,
the plan runs at that padded size, and each output part is copied back from its padded place. The bytes a part
gains are never read back, so what they hold does not matter; a combining collective sums them among
themselves only (a padded part lines up with the same padded part on every rank).

That the padded message is the size rounded up to the granule follows: with ``parts`` parts of ``m`` bytes and
a part granule ``u = granule / parts``, the padded part is ``ceil(m / u) · u`` and the padded message
``parts · ceil(m / u) · u = ceil(size / granule) · granule``.

>>> p = padding_of(1 << 20, size_chunks=48, parts=8)
>>> p.padded_bytes, p.part_bytes, p.padded_part_bytes, p.direct
(1048704, 131072, 131088, False)
>>> p.spans(1)  # a buffer of one part (an allgather's input)
((0, 0, 131072),)
>>> p.spans(8)[:2]  # a buffer of eight (its output): part j at j·m in the caller's buffer, j·m' when padded
((0, 0, 131072), (131072, 131088, 131072))
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK_GRANULE = 4  # a chunk holds whole 32-bit words: fp16/bf16 pairs and LL packets never split


@dataclass(frozen=True)
class Padding:
    """How a message of ``nbytes`` runs on a plan: ``parts`` equal parts, each staged at a stride of
    ``padded_part_bytes`` in buffers of the padded size (``direct`` where nothing moves)."""

    nbytes: int
    padded_bytes: int
    parts: int

    @property
    def part_bytes(self) -> int:
        return self.nbytes // self.parts

    @property
    def padded_part_bytes(self) -> int:
        return self.padded_bytes // self.parts

    @property
    def direct(self) -> bool:
        """Whether the plan runs the caller's buffers as they are (the size is a multiple of the granule)."""
        return self.padded_bytes == self.nbytes

    def spans(self, buffer_parts: int) -> tuple[tuple[int, int, int], ...]:
        """(caller's offset, padded offset, length) in bytes of each part of a buffer of ``buffer_parts`` parts."""
        m, stride = self.part_bytes, self.padded_part_bytes
        return tuple((j * m, j * stride, m) for j in range(buffer_parts))


def padding_of(nbytes: int, size_chunks: int, parts: int, slices: int = 1) -> Padding | None:
    """The padding of a message of ``nbytes`` on a plan of ``size_chunks`` chunks whose collective has ``parts``
    parts; None where it cannot run: not a positive whole number of parts, or (a hand-written plan whose chunks
    do not split into the parts) not a multiple of the granule (``slices`` equal slices of every chunk)."""
    granule = size_chunks * CHUNK_GRANULE * slices
    if nbytes <= 0 or nbytes % parts:
        return None
    padded = -(-nbytes // granule) * granule
    if padded != nbytes and size_chunks % parts:
        return None
    return Padding(nbytes, padded, parts)


def refusal(nbytes: int, size_chunks: int, parts: int, slices: int = 1) -> str:
    """Why ``padding_of`` gives None for this size, as the end of a sentence."""
    if nbytes <= 0:
        return "is not a positive size"
    if nbytes % parts:
        return f"is not a whole number of the collective's {parts} equal parts (one per rank)"
    return (
        f"is not a multiple of the plan's granule ({size_chunks * CHUNK_GRANULE * slices} B), and its "
        f"{size_chunks} chunks do not split into the collective's {parts} parts to pad"
    )
