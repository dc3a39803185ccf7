"""A failed rank ends at once with one line (user errors, stops) or a traceback (bugs), without NCCL's teardown."""

from __future__ import annotations

import subprocess
import sys


def abandon(error: str) -> subprocess.CompletedProcess:
    code = (
        "from weft.cli.gpu import _abandon\nfrom executor.errors import ExecutorError\n"
        f"_abandon(1, {error})\nprint('not reached')"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_user_error_ends_the_rank_with_one_line_and_its_exit_code():
    done = abandon("ExecutorError('plan p: input of 3 B does not split')")
    assert done.returncode == 2
    assert done.stderr.strip() == "weft: error: rank 1: plan p: input of 3 B does not split"
    assert "not reached" not in done.stdout


def test_a_bug_ends_the_rank_with_its_traceback():
    done = abandon("ValueError('boom')")
    assert done.returncode == 1 and "ValueError: boom" in done.stderr and "not reached" not in done.stdout


def test_a_stopped_rank_ends_with_one_line_not_a_traceback():
    # a timeout's SIGTERM reaches each rank as KeyboardInterrupt (weft.cli.stop); the bench's ranks printed
    # tracebacks for it (bench/results/compiled_4xh200_s10/log_peers_4.txt)
    done = abandon("KeyboardInterrupt()")
    assert done.returncode == 130
    assert done.stderr.strip() == "weft: stopped: rank 1" and "not reached" not in done.stdout
