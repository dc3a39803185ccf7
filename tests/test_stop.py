"""A SIGINT or SIGTERM to a command is never lost (issue 39): the two ways a single raise was lost, reproduced in
a child process. Each child waits for a stop that must come at once; one still waiting after 30 s is lost (the
child then leaves with exit code 3)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from weft.cli.deadline import Deadline

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30


def _child(body: str) -> subprocess.CompletedProcess:
    """Run ``body`` inside a Stop, then wait for the stop: prints "stopped [signal]", or exits 3 if it is lost."""
    lines = [
        "import os, signal, sys, threading",
        f"threading.Timer({WAIT_S}, os._exit, (3,)).start()",
        "from weft.cli.stop import Stop",
        "with Stop() as stop:",
        "    try:",
        *("        " + line for line in textwrap.dedent(body).strip().splitlines()),
        "        threading.Event().wait()",
        "    except KeyboardInterrupt:",
        "        print('stopped', stop.received, flush=True)",
        "        os._exit(0)",
    ]
    return subprocess.run(
        [sys.executable, "-c", "\n".join(lines)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S + 60,
        check=False,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_a_helper_thread_takes_stops_a_main_thread_that_waits(sig):
    # Python runs handlers in the main thread only once it runs bytecode; waiting on a lock (a pool's results)
    # it slept through a signal the kernel had handed to a helper thread, until the wait ended
    got = _child(
        f"""
        helper = threading.Thread(target=threading.Event().wait, args=({WAIT_S},), daemon=True)
        helper.start()
        threading.Timer(0.2, signal.pthread_kill, (helper.ident, {int(sig)})).start()
        """
    )
    assert got.returncode == 0 and got.stdout.split("\n")[0] == f"stopped [{int(sig)}]", got


def test_a_stop_raised_inside_a_finalizer_is_delivered_again_and_not_reported():
    # Python drops an exception raised while it runs a finalizer ("Exception ignored in ..."): a handler that
    # raised once lost the stop when the signal came during a pool's __del__ or a generator's close
    got = _child(
        """
        class Finalized:
            def __del__(self):
                signal.raise_signal(signal.SIGTERM)  # the handler runs here, and its raise is dropped
        Finalized()
        """
    )
    assert got.returncode == 0 and got.stdout.split("\n")[0] == "stopped [15]", got
    assert "Exception ignored" not in got.stderr, got


def _blocked(thread: threading.Thread) -> set[int]:
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return {s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM) if mask >> (s - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread signal masks from /proc")
def test_a_commands_helper_threads_never_take_its_signals():
    before = set(threading.enumerate())
    with Deadline("weft test", 60.0, progress=lambda line: None):
        helpers = [t for t in threading.enumerate() if t not in before]
        assert helpers  # the progress ticker
        for thread in helpers:
            assert _blocked(thread) == {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}, thread.name
