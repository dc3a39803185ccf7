"""SIGINT and SIGTERM as a stop that cannot be lost: the command's first signal is recorded, raised in the main
thread as KeyboardInterrupt, and delivered again every ``REFIRE_S`` until the CLI's top level has acted on it.

A single raise was lost two ways (issue 39): Python drops an exception that a handler raises while the main
thread runs a finalizer (a pool's ``__del__``, a generator the garbage collector closes: "Exception ignored
in ..."), and a signal that the kernel hands to a helper thread only runs its handler once the main thread runs
bytecode again, so a main thread waiting on a pool's results slept through it until the sweep ended. Here the C
handler's wake-up byte, written by whichever thread took the signal, reaches a forwarding thread that blocks
these signals itself and sends the signal to the main thread (``pthread_kill``), which interrupts its wait; it
keeps doing so until ``close``. A delivery that finds the stop already under way (a KeyboardInterrupt being
handled, in an ``except`` or ``finally`` block or an ``__exit__``) does not raise again, so cleanup is never cut
short.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

from synth.workers import HELD, start_thread

REFIRE_S = 0.2  # a stop not yet acted on is delivered again this often


def _stopping() -> bool:
    """Whether a KeyboardInterrupt is being handled in this thread (the stop is under way)."""
    error, seen = sys.exc_info()[1], set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__context__
    return False


class Stop:
    """A context for one command in the main thread: SIGTERM (and SIGINT where Python's Ctrl-C handler is set)
    raise KeyboardInterrupt until ``close``; ``received`` holds the first such signal. Off the main thread,
    where Python cannot set handlers, it does nothing."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._closed = threading.Event()
        self._previous: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._wakeup = -1
        self._unraisable: Any = None
        self._forwarder: threading.Thread | None = None

    def __enter__(self) -> Stop:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)  # set_wakeup_fd's requirement
        self._wakeup = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
        for signum in HELD:
            handler = signal.getsignal(signum)
            if signum == signal.SIGTERM or handler is signal.default_int_handler:  # an ignored Ctrl-C stays so
                self._previous[signum] = signal.signal(signum, self._handle)
        self._unraisable, sys.unraisablehook = sys.unraisablehook, self._drop_repeats
        self._forwarder = start_thread(self._forward, "weft-stop")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """The top level has acted: no more deliveries, and the handlers as they were (may be called again)."""
        self._closed.set()
        if self._forwarder is not None:
            assert self._pipe is not None  # closed below, after the forwarder
            with contextlib.suppress(BlockingIOError):
                os.write(self._pipe[1], b"\0")  # wakes the forwarder's select at once
            self._forwarder.join()
            self._forwarder = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # runs any delivery still pending first, with ours (a no-op now)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._wakeup)
            sys.unraisablehook = self._unraisable
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._closed.is_set():
            return
        if not self.received:
            self.received.append(signum)
        if not _stopping():
            raise KeyboardInterrupt

    def _forward(self) -> None:
        """In its own thread (these signals blocked): send the stop to the main thread until ``close``."""
        assert self._pipe is not None  # set before the thread starts
        main, pending = threading.main_thread().ident, 0
        assert main is not None  # the main thread has started
        while not self._closed.is_set():
            if select.select([self._pipe[0]], [], [], REFIRE_S)[0]:
                woken = os.read(self._pipe[0], 512)
                pending = pending or next((s for s in woken if s in HELD and s in self._previous), 0)
            pending = self.received[0] if self.received else pending
            if pending and not self._closed.is_set():
                with contextlib.suppress(ProcessLookupError):
                    signal.pthread_kill(main, pending)
                self._closed.wait(REFIRE_S)

    def _drop_repeats(self, unraisable: Any) -> None:
        """A KeyboardInterrupt raised inside a finalizer is delivered again, not reported."""
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.received:
            return
        self._unraisable(unraisable)
