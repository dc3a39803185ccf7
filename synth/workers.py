"""Worker processes that end with the command: a signal to the main process ends the whole process tree.

The main process handles Ctrl-C and SIGTERM (``weft.cli``) and then kills its workers (``start_jobs``). A forked
worker must therefore ignore SIGINT (a Ctrl-C reaches the whole process group, and the main process decides), die on
SIGTERM at once even inside a solver's C code (where a Python handler inherited from the main process would never
run), and die with the main process if that one is killed outright (Linux's parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing import connection as mp_connection
from typing import Any, cast

PR_SET_PDEATHSIG = 1


HELD = {signal.SIGINT, signal.SIGTERM}
MAIN_THREAD_ONLY = HELD | {signal.SIGALRM}  # the signals whose Python handlers raise in the main thread


@contextlib.contextmanager
def held(signals: set[signal.Signals]) -> Iterator[None]:
    """``signals`` blocked in this thread for the block's duration, then the mask as it was."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start_thread(target: Callable[[], object], name: str) -> threading.Thread:
    """A daemon thread that never takes SIGINT, SIGTERM or SIGALRM (it inherits the mask it is started with).
    The kernel hands a process's signal to any thread that does not block it; Python then runs the handler in
    the main thread, but only once that thread runs bytecode, so a main thread waiting on a lock (a pool's
    results, for the whole sweep) slept through a signal that a helper thread took."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with held(MAIN_THREAD_ONLY):
        thread.start()
    return thread


@contextlib.contextmanager
def forking():
    """SIGINT and SIGTERM held while a pool forks its workers. Both were lost otherwise: in the main process a
    signal that lands in Python's at-fork callbacks (logging's lock release) is swallowed there ("Exception
    ignored ... KeyboardInterrupt"), and in a new worker one that lands before Python resets its signal state
    after the fork is dropped, so the pool's terminate() then waited for a worker that never died. Held, the
    main process gets them as soon as the pool exists, and a worker only once they are harmless or fatal
    (``worker_init``)."""
    with held(HELD):
        yield


def worker_init(parent: int | None = None) -> None:
    """A pool's initializer: SIGINT ignored, SIGTERM fatal, SIGKILL when the parent dies. ``parent``: the main
    process's pid (default: this process's parent now), checked after the death signal is set, since a parent
    that died before it was set sends nothing."""
    parent = os.getppid() if parent is None else parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)  # the main process's (``weft.cli.stop``): a worker's signals are its own
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)  # held since the fork (``forking``)
    if sys.platform.startswith("linux"):
        # no prctl: the main process's terminate() still ends the pool
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _job_main(fn: Callable[..., object], args: tuple, send: Any, init: Callable[..., None], initargs: tuple) -> None:
    """A job's process: ``init``, then ``fn(*args)`` (or what it raised) sent back through its own pipe."""
    init(*initargs)
    try:
        value: object = fn(*args)
    except BaseException as e:  # the caller decides what an error means
        value = e
    try:
        send.send(value)
    except Exception as e:  # a value that does not pickle
        send.send(RuntimeError(f"a worker's result could not be sent back: {type(e).__name__}: {e}"))
    finally:
        send.close()
        os._exit(0)  # no interpreter teardown in a forked child


def start_jobs(
    fn: Callable[..., object],
    jobs: list[tuple[int, tuple]],
    width: int,
    results: queue.Queue,
    init: Callable[..., None] = worker_init,
    initargs: tuple = (),
) -> Callable[[], None]:
    """Runs ``fn(*args)`` for every ``(tag, args)`` of ``jobs`` in forked processes, at most ``width`` at a time,
    and puts ``(tag, value)`` on ``results`` as each ends: what ``fn`` returned or raised, or None where its
    process died without a word. Returns ``stop``: it ends the runner and kills every process still running.

    Each job has a process and a pipe of its own, so a process killed mid-answer holds no lock that another
    process or the runner could wait on (a ``multiprocessing.Pool``'s terminate() could: its task thread writing
    the shared task pipe that no killed worker reads any more), and every wait here is bounded."""
    ctx = multiprocessing.get_context("fork")
    stopping = threading.Event()

    def run() -> None:
        pending = deque(jobs)
        live: dict[Any, tuple[Any, int]] = {}
        try:
            while not stopping.is_set() and (pending or live):
                while pending and len(live) < max(width, 1):
                    tag, args = pending.popleft()
                    recv, send = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_job_main, args=(fn, args, send, init, initargs), daemon=True)
                    with forking():
                        proc.start()
                    send.close()
                    live[recv] = (proc, tag)
                for ready in mp_connection.wait(list(live), timeout=0.05):
                    conn = cast(mp_connection.Connection, ready)  # what it was given: the pipes' read ends
                    proc, tag = live.pop(conn)
                    try:
                        value = conn.recv()
                    except (EOFError, OSError):
                        value = None
                    conn.close()
                    proc.join(timeout=1.0)
                    results.put((tag, value))
        finally:
            for conn, (proc, _) in live.items():
                with contextlib.suppress(Exception):
                    proc.kill()
                    proc.join(timeout=2.0)
                conn.close()

    thread = start_thread(run, "weft-jobs")

    def stop() -> None:
        stopping.set()
        thread.join(timeout=10.0)

    return stop
