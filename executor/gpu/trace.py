"""Reading the timed interpreter build (``Communicator(trace=True)``, built with -DWEFT_TRACE).

Each thread block sums, over launches, the SM clock cycles of its phases (interpreter.cu's Tracer): the slot
table, op range and epoch, the op window load with the wait for the previous grid, the barrier after it, each op
(ops past the last slot add to it), then the whole block in cycles and in global-timer nanoseconds. The two
whole-block sums give the clock rate that turns cycles into microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TRACE_OPS = 16  # kTraceOps in interpreter.cu
TRACE_SLOTS = 3 + TRACE_OPS + 2
PHASES = ("tables", "dependency wait", "barrier")


@dataclass(frozen=True)
class BlockTimes:
    """Mean µs per launch of each phase for one thread block; ``ops[k]`` is op k's."""

    block: int
    phases: dict[str, float]
    ops: tuple[float, ...]
    total: float


def summarize(trace: np.ndarray, nblocks: int, ops_per_block: list[int], launches: int) -> list[BlockTimes]:
    """Per-block mean times from the raw sums (``trace`` holds ``nblocks * TRACE_SLOTS`` words).

    >>> raw = np.zeros(TRACE_SLOTS, np.uint64)
    >>> raw[:4] = [200, 400, 200, 1200]; raw[-2:] = [2000, 1000]   # 2 cycles per ns
    >>> t = summarize(raw, 1, [1], launches=1)[0]
    >>> t.phases, t.ops, t.total
    ({'tables': 0.1, 'dependency wait': 0.2, 'barrier': 0.1}, (0.6,), 1.0)
    """
    if launches <= 0:
        raise ValueError("no launches were traced")
    sums = np.asarray(trace, np.float64).reshape(nblocks, TRACE_SLOTS)
    out = []
    for b in range(nblocks):
        cycles, ns = float(sums[b, -2]), float(sums[b, -1])
        per_us = cycles / ns * 1e3 if ns else 0.0  # cycles per µs
        phases = {name: _us(sums[b, k], per_us, launches) for k, name in enumerate(PHASES)}
        nops = min(ops_per_block[b], TRACE_OPS)
        ops = tuple(_us(sums[b, 3 + k], per_us, launches) for k in range(nops))
        out.append(BlockTimes(b, phases, ops, round(ns / 1e3 / launches, 3)))
    return out


def _us(cycles: float, per_us: float, launches: int) -> float:
    """Clock cycles summed over ``launches`` as µs per launch (0 where the block recorded no time)."""
    return round(float(cycles) / per_us / launches, 3) if per_us else 0.0
