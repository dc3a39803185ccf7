"""``--time-limit`` as the whole command's deadline: every phase (reading the fabric, the cut bound, the solve,
verification and pricing) runs under one wall-clock alarm, so no phase can outlast it unnoticed. A command
that runs past ``QUIET_S`` says which phase it is in, every ``QUIET_S`` seconds, on stderr (``progress``).

Solvers keep their own, gentler limit (the MILP returns its best incumbent at it); the alarm is the backstop
that ends a phase which has no limit of its own (a cut bound on a 100,000-rank ring) with one line naming the
phase. It fires ``GRACE_S`` after the limit, the time a solver that stopped on time needs to hand back its
answer. It is armed only around computation, never while a file is written.

>>> with Deadline("weft topo bound", 5.0) as deadline:
...     deadline.phase = "computing the cut bound"
...     deadline.left() <= 5.0
True
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from synth.workers import start_thread
from weftcore.errors import CheckFailed

GRACE_S = 2.0
QUIET_S = 2.0  # a command quiet for this long says what it is doing
REFIRE_S = 0.5  # a time-limit alarm that was swallowed fires again this often, until the phase ends


class TimeLimitReached(CheckFailed):
    """The command ran past its --time-limit; the message names the phase it was in (exit code 1)."""


@dataclass
class Deadline:
    """A context that raises TimeLimitReached in the main thread once ``limit_s`` (+ GRACE_S) have passed."""

    command: str
    limit_s: float
    phase: str = "starting"
    progress: Callable[[str], None] | None = None
    quiet: bool = False  # a phase that reports its own progress (a solver family) is not talked over
    after: str = "nothing written"  # what the time-limit message says was kept
    started: float = field(default_factory=time.monotonic)
    _previous: Callable[[int, FrameType | None], Any] | int | None = None  # the SIGALRM handler to restore
    _ticker: threading.Event = field(default_factory=threading.Event)
    _closing: bool = False  # set first in __exit__: an alarm that lands while the context closes does nothing

    def left(self) -> float:
        """Seconds of the limit still unspent (at least a little, so a solver asked to stop still answers)."""
        return max(0.1, self.limit_s - (time.monotonic() - self.started))

    def _fire(self, signum, frame) -> None:
        if self._closing:
            return
        raise TimeLimitReached(
            f"{self.command}: --time-limit {self.limit_s:g} s reached while {self.phase} "
            f"(after {time.monotonic() - self.started:.1f} s); {self.after}"
        )

    def _tick(self) -> None:
        while not self._ticker.wait(QUIET_S):
            if not self.quiet and self.progress is not None:  # the ticker starts only with a progress
                self.progress(f"{self.command}: {self.phase} ({time.monotonic() - self.started:.0f} s)")

    def __enter__(self) -> Deadline:
        # an alarm reaches only the main thread (a CLI called from another thread keeps the solvers' own limits)
        if (
            math.isfinite(self.limit_s)
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
        ):
            self._previous = signal.signal(signal.SIGALRM, self._fire)
            # the alarm repeats: Python swallows an exception raised while it runs a finalizer (a generator that
            # the garbage collector closes mid-max-flow: "Exception ignored in ..."), so one alarm can be lost
            signal.setitimer(signal.ITIMER_REAL, max(0.01, self.left() + GRACE_S), REFIRE_S)
        if self.progress is not None:
            start_thread(self._tick, "deadline-progress")  # never the thread that takes a signal
        return self

    def __exit__(self, *exc) -> None:
        self._closing = True
        self._ticker.set()
        if self._previous is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self._previous = None
