"""``pytest -m gpu`` split by file over groups of GPUs, or over device calls (bench/gpu_gate.sh's SHARDS and PART).

    python3 bench/gpu_shards.py --groups 0,1 2,3 --nproc 2 --limit-s 540 --out DIR [--part 1/2] [--costs FILE]
        [--ignore PATH ...] [--resume FILE] [--apart PATH ...]

The whole suite at 2 ranks took ~470 s on one pair of H200s in the fourteenth session and 4 ranks ~570 s, near a
device call's 600 s. Here each file of the ``-m gpu`` selection runs as a pytest of its own (its module fixtures
stay whole), taken from one queue by as many workers as there are GPU groups, each with CUDA_VISIBLE_DEVICES set to
its group: two pairs of a 4-GPU machine run the 2-rank suite in about half the time. ``--part K/N`` keeps files K,
K+N, ... of the queue, so that N calls together run it whole. The queue puts the costliest files first (``--costs``:
a previous run's summary, else HEAVY's order), so that no long file starts last. ``--resume``: a previous run's
summary whose passed files are not run again (their rows are carried over, marked ``resumed``), so that a run cut by
a call's limit goes on in the next call and its summary still covers the whole selection. ``--apart``: files of the
selection that need no GPU (the nvcc-only tests), run one after another by a worker of their own beside the GPU
groups (CUDA_VISIBLE_DEVICES empty, group "apart"); their rows are in the same summary, so that ``--resume`` knows
them (the sixteenth session's second call ran test_cuda_compile again, 131 s, because the gate's separate nvcc
pytest had passed it outside the summary).

Writes DIR/gpu_shards_x<NPROC>[_p<K>of<N>].json (per file: group, exit code, seconds, the counts of its summary
line) and a log a group (DIR/gpu_tests_x<NPROC>_g<I>.txt); prints a line a file and the totals; exits 1 unless
every file ran and passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

# The slowest files of the fourteenth session's 2-rank run (its setup and call lines), slowest first.
HEAVY = (
    "tests/gpu/test_fused_norm.py",
    "tests/test_cuda_compile.py",  # nvcc alone, minutes of CPU (NVCC_APART=1: --apart, beside the GPU groups)
    "tests/gpu/test_compiled_gpu.py",
    "tests/gpu/test_alltoall.py",
    "tests/gpu/test_inference.py",
    "tests/gpu/test_port_two_hosts.py",
    "tests/gpu/test_communicator_engines.py",
    "tests/gpu/test_gpu_executor.py",
    "tests/gpu/test_bench_cli.py",
    "tests/gpu/test_faults_dead_rank.py",
    "tests/gpu/test_one_device.py",
    "tests/gpu/test_lamport_gpu.py",
    "tests/gpu/test_experts_gpu.py",
    "tests/gpu/test_zero_copy.py",
)
COUNTS = ("passed", "failed", "errors", "skipped", "deselected")


def files_of(nodeids: list[str]) -> list[str]:
    """The files of pytest node ids (``path::test``), each once, in the order first met.

    >>> files_of(["tests/a.py::t1", "tests/b.py::t[x::y]", "tests/a.py::t2", "", "3 tests collected"])
    ['tests/a.py', 'tests/b.py']
    """
    out: list[str] = []
    for line in nodeids:
        path, sep, _ = line.partition("::")
        if sep and path not in out:
            out.append(path)
    return out


def ordered(files: list[str], costs: dict[str, float]) -> list[str]:
    """Costliest first: by a previous run's seconds where ``costs`` has the file, else HEAVY's rank above the
    rest, which keep their order.

    >>> ordered(["a.py", "tests/gpu/test_alltoall.py", "b.py", "tests/gpu/test_fused_norm.py"], {})
    ['tests/gpu/test_fused_norm.py', 'tests/gpu/test_alltoall.py', 'a.py', 'b.py']
    >>> ordered(["a.py", "b.py"], {"b.py": 30.0, "a.py": 2.0})
    ['b.py', 'a.py']
    """

    def key(item: tuple[int, str]) -> tuple[float, float, int]:
        i, f = item
        heavy = len(HEAVY) - HEAVY.index(f) if f in HEAVY else 0
        return (-costs.get(f, 0.0), -heavy, i)

    return [f for _, f in sorted(enumerate(files), key=key)]


def part(files: list[str], spec: str) -> list[str]:
    """Files K, K+N, ... (1-based) of ``files`` for ``spec`` "K/N": the N parts together are every file once.

    >>> part(list("abcde"), "1/2"), part(list("abcde"), "2/2")
    (['a', 'c', 'e'], ['b', 'd'])
    >>> part(list("ab"), "3/2")
    Traceback (most recent call last):
    ValueError: --part 3/2: K/N with 1 <= K <= N
    """
    k, _, n = spec.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"--part {spec}: K/N with 1 <= K <= N")
    return files[int(k) - 1 :: int(n)]


def counts(text: str) -> dict[str, int]:
    """The counts of pytest's last summary line in ``text`` ({} when it has none: the run was cut).

    >>> counts("x\\n===== 3 passed, 1 skipped, 2 deselected in 4.20s =====\\n")
    {'passed': 3, 'skipped': 1, 'deselected': 2}
    >>> counts("== 1 failed, 2 passed, 1 error in 9.1s ==")
    {'failed': 1, 'passed': 2, 'errors': 1}
    >>> counts("tests/gpu/test_x.py::test_y PASSED")
    {}
    """
    lines = [line for line in text.splitlines() if re.search(r"\bin [0-9.]+s\b", line) and "=" in line]
    if not lines:
        return {}
    found = re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", lines[-1])
    return {("errors" if word.startswith("error") else word): int(n) for n, word in found}


def collect(ignore: list[str]) -> list[str]:
    """The files of the ``-m gpu`` selection, as pytest collects them here."""
    args = [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(args + [f"--ignore={p}" for p in ignore], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu_shards: collection failed (exit {done.returncode}):\n{done.stdout[-2000:]}")
    return files_of(done.stdout.splitlines())


def run_file(path: str, gpus: str, env: dict[str, str], left: float, test_s: int) -> tuple[dict, str]:
    """One file's pytest on ``gpus`` within ``left`` seconds: its row and its output ("" where no time was left to
    start it: rc None). A run cut by the limit has rc "cut" and the counts of no summary line."""
    row: dict = {"file": path, "group": gpus, "rc": None, "seconds": 0.0, "counts": {}}
    if left <= 5:
        return row, ""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfE", "--tb=short", "-p", "no:cacheprovider"]
    cmd += ["--timeout", str(test_s), "--timeout-method", "signal"] if test_s > 0 else []
    cmd.append(path)
    start = time.monotonic()
    # a session of its own, so that a cut run's rank processes (the test's children) are stopped with it
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        text, _ = proc.communicate(timeout=left)
        row["rc"] = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        row["rc"] = "cut"
    row["seconds"] = round(time.monotonic() - start, 1)
    row["counts"] = counts(text)
    return row, text


def resumed(summary: str, queue: list[str]) -> list[dict]:
    """The rows of ``summary`` (an earlier run's JSON) for files of ``queue`` that passed there, marked resumed."""
    rows = json.loads(Path(summary).read_text())["files"]
    return [{**r, "resumed": True} for r in rows if r["rc"] == 0 and r["file"] in queue]


def run(args: argparse.Namespace) -> int:
    costs: dict[str, float] = {}
    if args.costs:
        costs = {r["file"]: r["seconds"] for r in json.loads(Path(args.costs).read_text())["files"]}
    queue = ordered(collect(args.ignore), costs)
    if args.part:
        queue = part(queue, args.part)
    rows: list[dict] = resumed(args.resume, queue) if args.resume else []
    done = {r["file"] for r in rows}
    apart = [f for f in queue if f in args.apart and f not in done]
    todo: deque[str] = deque(f for f in queue if f not in done and f not in apart)
    lock = threading.Lock()
    end = time.monotonic() + args.limit_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def worker(name: str, gpus: str, queue: deque[str]) -> None:
        """Runs ``queue``'s files on ``gpus`` ("apart": on none), logging to gpu_tests_x<NPROC>_<name>.txt."""
        visible = "" if gpus == "apart" else gpus
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "WEFT_GPU_NPROC": str(args.nproc)}
        log = out / f"gpu_tests_x{args.nproc}_{name}.txt"
        while True:
            with lock:
                if not queue:
                    return
                path = queue.popleft()
            row, text = run_file(path, gpus, env, end - time.monotonic(), args.test_s)
            if text:
                with log.open("a") as f:
                    f.write(f"=== {path} on GPUs {gpus}: rc {row['rc']}, {row['seconds']} s\n{text}\n")
            with lock:
                rows.append(row)
                print(
                    f"{path:<48} GPUs {gpus:<8} rc {row['rc']!s:<4} {row['seconds']:>6} s  {row['counts']}", flush=True
                )

    threads = [threading.Thread(target=worker, args=(f"g{i}", g, todo)) for i, g in enumerate(args.groups)]
    if apart:
        threads.append(threading.Thread(target=worker, args=("apart", "apart", deque(apart))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = {c: sum(r["counts"].get(c, 0) for r in rows) for c in COUNTS}
    whole = all(r["rc"] == 0 for r in rows) and len(rows) == len(queue)
    name = f"gpu_shards_x{args.nproc}" + (f"_p{args.part.replace('/', 'of')}" if args.part else "")
    doc = {"nproc": args.nproc, "groups": args.groups, "part": args.part, "ignore": args.ignore}
    doc |= {"resume": args.resume, "files": rows}
    (out / f"{name}.json").write_text(json.dumps({**doc, "total": total, "whole": whole}, indent=1))
    print(f"total {total}; {'every file ran and passed' if whole else 'NOT whole'}")
    return 0 if whole else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="+", required=True, help="GPU groups, each a CUDA_VISIBLE_DEVICES list")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--limit-s", type=float, default=540.0, help="the whole run's time: no file starts past it")
    p.add_argument("--test-s", type=int, default=200, help="one test's limit (pytest-timeout; 0: none)")
    p.add_argument("--part", help="K/N: files K, K+N, ... of the queue")
    p.add_argument("--costs", help="a previous run's summary JSON: its seconds order the queue")
    p.add_argument("--resume", help="a previous run's summary JSON: its passed files are not run again")
    p.add_argument("--ignore", action="append", default=[], help="a path pytest leaves out (repeatable)")
    p.add_argument(
        "--apart", action="append", default=[], help="a file that needs no GPU, run beside the groups (repeatable)"
    )
    p.add_argument("--out", required=True)
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
