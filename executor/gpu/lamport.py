"""The GPU interpreter's side of the Lamport protocol (``schedules.lamport``): scratch copies, sentinel, reset shares.

The kernel (``executor/gpu/cuda/lamport.cuh``) passed tests/gpu/test_lamport_gpu.py at 2 and 4 ranks (one-shot and
two-shot, fp32/fp16/bf16, back-to-back calls and graph replays, the fused norm, against NCCL), called on the engine
and through the Communicator (staging, padded sizes, zero-copy capture). Plan selection weighs Lamport plans by their
measured times like any other; the port engine refuses them (``executor.gpu.protocols``).

How a Lamport plan runs in the interpreter (``executor.gpu.tables.build_tables`` lowers it):

- Its scratch holds ``buffers`` copies of ``stride`` bytes each (the widest rank's scratch at 1x the data, so that
  every rank shifts a peer's scratch by the same bytes), filled once with the dtype's sentinel (``fill_scratch``)
  when the context is made, and again when it recovers from a timeout.
- A packet reference carries the ``LAMPORT`` flag (polled for the sentinel, written mapped, with no flag word) and,
  as every scratch reference of the plan, ``SCRATCH``: transfers carry the copy count, and the kernel shifts them
  to copy ``epoch % buffers``, where the epoch is the thread block's execution count on the device (a CUDA graph's
  replays rotate too).
- Each thread block runs a reset op over its share of this rank's copy ``(epoch + reset_ahead) % buffers``
  (``reset_shares``): the rule ``schedules.lamport.LamportBuffers.reset_by`` states and the reference proves, at any
  time of the launch. The tables place it before the block's first op that polls Lamport data (its stores issue
  while the block's puts fly), or last in a block that polls nothing.
- The fused call (a residual, then the RMSNorm epilogue: ``executor.reference.norm``) lowers as in other plans: the
  reduction that completes a sum adds the plain residual after its polled sources, the epilogue reads the output it
  wrote (never a scratch copy), the block's reset comes before its reduction, and a split row's sums of squares
  live past all the copies, which the fill and the resets stop short of. A two-shot's rows arrive as copies, so it
  takes the residual but not the norm (``executor.reference.norm.output_ranges`` says why), as an LL two-shot does.

>>> hex(sentinel_word("bf16")), hex(sentinel_word("fp32"))
('0x80008000', '0x80000000')
>>> reset_shares(160, 3)
[(0, 64), (64, 48), (112, 48)]
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from schedules.lamport import SENTINEL_BITS

RESET_UNIT = 16  # reset shares start at multiples of this many bytes (the widest vector the kernel stores)


def sentinel_word(dtype: str) -> int:
    """A 32-bit word of the dtype's elements that all hold the sentinel (-0.0): what the scratch copies start as."""
    bits = SENTINEL_BITS[dtype]
    return bits if dtype == "fp32" else bits << 16 | bits


def reset_shares(nbytes: int, blocks: int) -> list[tuple[int, int]]:
    """(first byte, bytes) of each thread block's share of a copy's ``nbytes``: whole RESET_UNITs, the first blocks
    one unit more, the last share taking any remainder below a unit; every block gets a share (maybe empty)."""
    units, tail = divmod(nbytes, RESET_UNIT)
    base, extra = divmod(units, blocks)
    shares, first = [], 0
    for b in range(blocks):
        size = (base + (b < extra)) * RESET_UNIT + (tail if b == blocks - 1 else 0)
        shares.append((first, size))
        first += size
    return shares


class ScratchLayout(Protocol):
    """What ``fill_scratch`` reads of a plan's device tables (``executor.gpu.tables.DeviceTables``), named here so
    that this module, which the tables import, never imports them back."""

    @property
    def scratch_bytes(self) -> int: ...

    @property
    def lamport_buffers(self) -> int: ...

    @property
    def scratch_fill(self) -> int: ...


def fill_scratch(cupy: Any, scratch: Any, tables: ScratchLayout) -> None:
    """Zero ``scratch`` (a context's device uint8 array), then, for a Lamport plan, write its sentinel over every
    scratch copy and wait for that: no peer's write may land before the sentinel does."""
    scratch.fill(0)
    copies = tables.scratch_bytes * tables.lamport_buffers // 4 * 4
    if tables.scratch_fill and copies:
        scratch[:copies].view(cupy.uint32).fill(np.uint32(tables.scratch_fill))
        cupy.cuda.runtime.deviceSynchronize()
