"""The fuzzes' hang oracle: a command that runs past its bound fails the case instead of stalling the run."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

REPEAT_S = 0.5  # an alarm raised inside a finalizer is dropped by Python: it fires again until the block ends


@contextlib.contextmanager
def no_hang(seconds: float, what: str) -> Iterator[None]:
    """AssertionError in the main thread if the block runs past ``seconds`` (a command that sets its own alarm,
    such as ``--time-limit``, replaces this one while it runs)."""

    def hang(signum, frame) -> None:
        raise AssertionError(f"{what} ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
