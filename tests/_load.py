"""How loaded this machine is right now, for tests whose limits are wall-clock seconds of an idle machine."""

from __future__ import annotations

import time


def slowdown(cpu_s: float = 0.2) -> float:
    """How many wall seconds a CPU second of one thread takes on this machine right now (1 when idle): spins for
    ``cpu_s`` of CPU time and divides the wall time it took by it. Other processes on the cores stretch the wall
    time of the child's work by about this much, so the tests' bounds are in idle seconds times this."""
    wall, cpu = time.monotonic(), time.process_time()
    while time.process_time() - cpu < cpu_s:
        pass
    return max(1.0, (time.monotonic() - wall) / (time.process_time() - cpu))


def idle_s(seconds: float) -> float:
    """``seconds`` of an idle machine as wall seconds here and now: a solver's time limit that an idle machine
    needs (to find an incumbent, or one good enough to assert on) grows with the load instead of failing under it."""
    return seconds * slowdown()
