"""synth.workers.start_jobs: jobs in forked processes, each answering through a pipe of its own, at most ``width``
at a time; an error comes back as the value, a process that dies gives None, and stop() ends every process still
running at once (the SMT race and the --jobs sweep stand on it)."""

from __future__ import annotations

import os
import queue
import time

from synth.workers import start_jobs


def _job(kind: str, value: int) -> int:
    if kind == "raise":
        raise ValueError(f"job {value} refused")
    if kind == "die":
        os._exit(3)
    if kind == "sleep":
        time.sleep(value)
    return value * value


def _results(results: queue.Queue, n: int) -> dict:
    return dict(results.get(timeout=30) for _ in range(n))


def test_every_job_answers_with_its_tag_its_error_or_none_where_it_died():
    results: queue.Queue = queue.Queue()
    jobs = [(0, ("square", 3)), (1, ("raise", 7)), (2, ("die", 0)), (3, ("square", 5))]
    stop = start_jobs(_job, jobs, 2, results, initargs=(os.getpid(),))
    try:
        got = _results(results, len(jobs))
    finally:
        stop()
    assert (got[0], got[2], got[3]) == (9, None, 25)
    assert isinstance(got[1], ValueError) and str(got[1]) == "job 7 refused"


def test_stop_kills_the_jobs_still_running_and_leaves_the_rest_unstarted():
    results: queue.Queue = queue.Queue()
    jobs = [(0, ("square", 2)), (1, ("sleep", 600)), (2, ("sleep", 600)), (3, ("square", 4))]
    stop = start_jobs(_job, jobs, 2, results, initargs=(os.getpid(),))
    assert results.get(timeout=30) == (0, 4)
    began = time.monotonic()
    stop()
    assert time.monotonic() - began < 5.0  # not the sleeping jobs' 600 s
    time.sleep(0.2)
    leftover = []
    while not results.empty():
        leftover.append(results.get_nowait())
    assert all(tag != 3 for tag, _ in leftover)  # the fourth job waited for a place and never started
