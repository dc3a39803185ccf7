"""How loaded this machine is, as a factor for the bounds of timing tests: the wall seconds one CPU second of a
thread takes now (1 when idle). Other processes on the cores stretch a child's work by about this much, so a
bound in idle seconds times this factor holds on a busy machine without being loose on an idle one."""

from __future__ import annotations

import threading
import time


def slowdown(cpu_s: float = 0.2) -> float:
    """Spin for ``cpu_s`` of this thread's CPU time and divide the wall time it took by it."""
    wall, cpu = time.monotonic(), time.thread_time()
    while time.thread_time() - cpu < cpu_s:
        pass
    return max(1.0, (time.monotonic() - wall) / (time.thread_time() - cpu))


class Sampled:
    """The slowdown over a stretch of time, sampled in a thread (short spins, mostly asleep, so that measuring
    adds little load): ``factor()`` is the mean so far, at least 1."""

    def __init__(self, spin_s: float = 0.02, every_s: float = 0.1) -> None:
        self.wall = self.cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(spin_s, every_s), daemon=True)
        self._thread.start()

    def _sample(self, spin_s: float, every_s: float) -> None:
        while not self._stop.wait(every_s):
            wall, cpu = time.monotonic(), time.thread_time()
            while time.thread_time() - cpu < spin_s:
                pass
            self.wall += time.monotonic() - wall
            self.cpu += time.thread_time() - cpu

    def factor(self) -> float:
        return max(1.0, self.wall / self.cpu) if self.cpu else 1.0

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.factor()


def idle_s(seconds: float) -> float:
    """``seconds`` of an idle machine as wall seconds here and now: a solver's time limit that an idle machine
    needs (to find an incumbent, or one good enough to assert on) grows with the load instead of failing under it."""
    return seconds * slowdown()
