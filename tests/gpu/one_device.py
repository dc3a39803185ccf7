"""Every rank of a plan as a process on ONE GPU: the executor's kernels checked against the CPU reference, exactly.

A machine with a single GPU cannot run NCCL between ranks, but CUDA IPC works between processes on one device, and
the GPU time-slices their kernels, so every wait is eventually met (slowly: this checks results, never speed).
The inputs are the reference's small non-zero integers (``executor.reference.prove.random_inputs``), so every sum is
exact in fp32, fp16 and bf16 and each rank's output must equal numpy's definition of the collective bit for bit.

    python tests/gpu/one_device.py RESULTS.json [--nproc 2] [--device 0] [--sizes 1KB,64KB,1MB] [--dtypes fp32,bf16]
                                  [--compiled] [PLAN.json ...]

Without plan files it runs the 2-rank (or ``plans4``) test plans, then CUDA graphs of zero-copy executions
(``capture()``, a replay before registration, then replays on fresh inputs) for the graph plans among them.
``--compiled``: every case runs as the plan's own kernel (NVRTC) instead of the interpreter, named CASE+compiled, and
no graphs. Exit
code 0 when every case matched, 1 when one did not, 2 on bad arguments. A rank runs its cases in the same order as
every other rank (contexts are collective).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

import numpy as np  # noqa: E402

from executor.gpu.tables import lines_possible  # noqa: E402
from executor.reference.machine import chunk_elems  # noqa: E402
from executor.reference.prove import expected_outputs, random_inputs  # noqa: E402
from schedules.plan.io import load_plan  # noqa: E402
from schedules.plan.types import Plan  # noqa: E402
from weft.units import parse_bytes  # noqa: E402
from weftcore.rendezvous import rank_env, rendezvous_port  # noqa: E402

DTYPES = ("fp32", "bf16")
GRAPH_PLANS = (
    "allreduce-direct-ll-x1.json",
    "allreduce-twoshot-simple-x8.json",
    "allgather-direct-ll-x1.json",
    "allreduce-direct-ll-x8.json",
    # multi-peer plans (4 and 8 ranks): one thread block per instance serves every peer
    "allreduce-twoshot-simple-x8-2s-mp.json",
    "allreduce-direct-ll-x4-mp.json",
    "allgather-direct-simple-x4-mp.json",
    "allreduce-twoshot-simple-x4-p2-2s-mp.json",
)


def cases(plans: list[Path], sizes: list[int], dtypes: tuple[str, ...] = DTYPES) -> list[tuple[Path, int, str, bool]]:
    """(plan, bytes, dtype, lines) for every size and dtype each plan accepts, LL plans also with lines."""
    out = []
    for path in plans:
        plan = load_plan(path)
        for nbytes in sizes:
            if not plan.accepts(nbytes):
                continue
            for dtype in dtypes:
                if plan.chunk_bytes(nbytes) % (4 if dtype == "fp32" else 2):
                    continue
                out.append((path, nbytes, dtype, False))
                if lines_possible(plan, nbytes):
                    out.append((path, nbytes, dtype, True))
    return out


def device_array(values: np.ndarray, dtype: str):
    """fp32 values as a CuPy array of ``dtype`` (bf16 as its bits in uint16: the values are small integers)."""
    import cupy

    if dtype == "bf16":
        return cupy.asarray((values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
    return cupy.asarray(values.astype(np.float32))


def host_values(array, dtype: str) -> np.ndarray:
    bits = array.get()
    return (bits.astype(np.uint32) << 16).view(np.float32) if dtype == "bf16" else bits.astype(np.float32)


def run_one(comm, plan: Plan, rank: int, nbytes: int, dtype: str, lines: bool, seed: int, compiled: bool) -> dict:
    """One execution; its output's required chunks against numpy's collective over every rank's input."""
    elems = chunk_elems(plan, nbytes, dtype)
    inputs = random_inputs(plan, elems, np.random.default_rng(seed))  # every rank draws every rank's input
    gpu = plan.gpus[rank]
    x, at_out = inputs[rank], 0
    if plan.inplace:  # one buffer: the smaller of input and output is the rank's slice of the larger
        at_in, at_out = plan.collective_spec().inplace_offsets(rank, gpu.input_chunks, gpu.output_chunks)
        x = np.zeros(max(gpu.input_chunks, gpu.output_chunks) * elems, np.float32)
        x[at_in * elems : (at_in + gpu.input_chunks) * elems] = inputs[rank]
    start = time.monotonic()
    out = comm.execute(plan, device_array(x, dtype), dtype=dtype, lines=lines, compiled=compiled)
    comm.synchronize()
    seconds = time.monotonic() - start
    got = host_values(out, dtype).reshape(-1, elems)[at_out : at_out + gpu.output_chunks]
    wrong = sum(
        int(np.count_nonzero(got[idx] != chunk))
        for idx, chunk in expected_outputs(plan.collective_spec(), inputs, elems, dtype)[rank].items()
    )
    return {"ok": wrong == 0, "wrong": wrong, "seconds": round(seconds, 3)}


def run_graph(comm, plan: Plan, rank: int, nbytes: int, dtype: str, lines: bool, seed: int) -> dict:
    """Three zero-copy executions captured in one CUDA graph inside ``capture()``: a replay before registration
    runs only the tripwire (outputs untouched, reported when capture() is left), then five replays on fresh inputs
    must each equal numpy's collective."""
    import cupy

    from executor.errors import ExecutorError

    elems = chunk_elems(plan, nbytes, dtype)
    rng = np.random.default_rng(seed)
    warm = comm.execute(plan, device_array(random_inputs(plan, elems, rng)[rank], dtype), dtype=dtype, lines=lines)
    comm.synchronize()
    xs = [device_array(random_inputs(plan, elems, rng)[rank], dtype) for _ in range(3)]
    outs = [cupy.full_like(warm, 0x7F7F if dtype == "bf16" else 3.0e38) for _ in range(3)]
    untouched = [o.copy() for o in outs]
    stream = cupy.cuda.Stream(non_blocking=True)
    early = "not reported"
    try:
        with comm.capture():
            stream.begin_capture()
            refusals = [
                comm.execute_captured(plan, x, o, stream=stream, dtype=dtype, lines=lines)
                for x, o in zip(xs, outs, strict=True)
            ]
            graph = stream.end_capture()
            graph.launch(stream)  # before registration: the disarmed records
            stream.synchronize()
    except ExecutorError as e:
        early = "reported" if "before their buffers were registered" in str(e) else str(e)
    if any(refusals):
        return {"ok": False, "error": f"refused: {refusals}"}
    kept = all(bool((o == u).all()) for o, u in zip(outs, untouched, strict=True))
    wrong = 0
    for _ in range(5):
        inputs = [random_inputs(plan, elems, rng) for _ in xs]
        for x, each in zip(xs, inputs, strict=True):
            x[...] = device_array(each[rank], dtype)
        stream.synchronize()
        cupy.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        comm.synchronize()
        for o, each in zip(outs, inputs, strict=True):
            got = host_values(o, dtype).reshape(-1, elems)
            want = expected_outputs(plan.collective_spec(), each, elems, dtype)[rank]
            wrong += sum(int(np.count_nonzero(got[idx] != chunk)) for idx, chunk in want.items())
    ok = wrong == 0 and kept and early == "reported"
    return {"ok": ok, "wrong": wrong, "untouched_before_registration": kept, "early_replay": early}


def rank_main(
    out_dir: Path,
    plans: list[Path],
    sizes: list[int],
    device: int,
    timeout_s: float,
    dtypes: tuple[str, ...] = DTYPES,
    compiled: bool = False,
    cluster: int = 1,
    gemm_tail: bool = False,
) -> None:
    import cupy

    from executor.gpu.engine import InterpreterEngine

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cupy.cuda.Device(device).use()
    comm = InterpreterEngine(rank, world, device=device, timeout_s=timeout_s, cluster=cluster, gemm_tail=gemm_tail)
    results = {}
    for k, (path, nbytes, dtype, lines) in enumerate(cases(plans, sizes, dtypes)):
        plan = load_plan(path)
        name = f"{path.stem}-{nbytes}B-{dtype}{'+ll128' if lines else ''}{'+compiled' if compiled else ''}"
        try:
            results[name] = run_one(comm, plan, rank, nbytes, dtype, lines, seed=k, compiled=compiled)
        except Exception as e:  # one failed case is a result; a timeout leaves the ranks in step (reset together)
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    for k, name in enumerate(() if compiled else GRAPH_PLANS):
        found = next((p for p in plans if p.name == name), None)
        if found is None:
            continue
        path = found
        plan = load_plan(path)
        nbytes = next(n for n in (65536, 1024) if plan.accepts(n))
        for lines in (False, True) if lines_possible(plan, nbytes) else (False,):
            label = f"graph-{path.stem}-{nbytes}B-bf16{'+ll128' if lines else ''}"
            try:
                results[label] = run_graph(comm, plan, rank, nbytes, "bf16", lines, seed=1000 + k)
            except Exception as e:
                results[label] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    comm.close()
    (out_dir / f"rank{rank}.launches.json").write_text(json.dumps({str(k): v for k, v in comm.launch_clusters.items()}))
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1))


def launch(out: Path, argv: list[str], nproc: int, wait_s: float) -> dict:
    """Start ``nproc`` ranks of this script on one device; every case's result by rank."""
    work = out.parent / (out.stem + ".ranks")
    work.mkdir(parents=True, exist_ok=True)
    port = str(rendezvous_port())
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank-of", str(work), *argv],
            env={**os.environ, **rank_env(r, nproc, port, local_rank=0)},  # every rank on this one device
        )
        for r in range(nproc)
    ]
    deadline = time.monotonic() + wait_s
    codes: list[int | str] = []  # exit codes, "timeout" where a rank never ended
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    ranks = {
        r: json.loads((work / f"rank{r}.json").read_text()) for r in range(nproc) if (work / f"rank{r}.json").exists()
    }
    clusters = {  # rank -> {blocks a cluster: launches prepared with it}
        r: json.loads((work / f"rank{r}.launches.json").read_text())
        for r in range(nproc)
        if (work / f"rank{r}.launches.json").exists()
    }
    return {"nproc": nproc, "exit_codes": codes, "ranks": ranks, "launch_clusters": clusters}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("plans", nargs="*", type=Path)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--sizes", default="1KB,64KB,1MB")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of fp32, bf16")
    parser.add_argument("--compiled", action="store_true", help="each plan as its own kernel, not interpreted")
    parser.add_argument("--timeout", type=float, default=60.0, help="each GPU wait's bound (s)")
    parser.add_argument("--cluster", type=int, default=1, help="blocks a thread-block cluster (the engine's cluster)")
    parser.add_argument("--gemm-tail", action="store_true", help="an empty clustered launch after each (gemm_tail)")
    parser.add_argument("--wait", type=float, default=500.0, help="the whole job's bound (s)")
    parser.add_argument("--rank-of", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    except ValueError as e:
        print(f"one_device: --sizes: {e}", file=sys.stderr)
        return 2
    dtypes = tuple(args.dtypes.split(","))
    if not set(dtypes) <= set(DTYPES):
        print(f"one_device: --dtypes: {args.dtypes!r} is not a list of {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    plans = args.plans or sorted((HERE / ("plans" if args.nproc == 2 else f"plans{args.nproc}")).glob("*.json"))
    if args.rank_of:
        rank_main(
            args.rank_of,
            plans,
            sizes,
            args.device,
            args.timeout,
            dtypes,
            args.compiled,
            cluster=args.cluster,
            gemm_tail=args.gemm_tail,
        )
        return 0
    forwarded = [
        str(args.results),
        *map(str, args.plans),
        "--nproc",
        str(args.nproc),
        "--device",
        str(args.device),
        "--sizes",
        args.sizes,
        "--timeout",
        str(args.timeout),
        "--dtypes",
        args.dtypes,
        *(["--compiled"] if args.compiled else []),
        "--cluster",
        str(args.cluster),
        *(["--gemm-tail"] if args.gemm_tail else []),
    ]
    job = launch(args.results, forwarded, args.nproc, args.wait)
    names = sorted({n for r in job["ranks"].values() for n in r})
    failed = [n for n in names if not all(r.get(n, {}).get("ok") for r in job["ranks"].values())]
    job.update(cases=len(names), failed=failed)
    args.results.write_text(json.dumps(job, indent=1))
    print(
        f"one_device: {len(names) - len(failed)}/{len(names)} cases matched on {args.nproc} ranks sharing "
        f"device {args.device}; exit codes {job['exit_codes']}"
    )
    for n in failed[:20]:
        print(f"  {n}: {[r.get(n) for r in job['ranks'].values()]}")
    return 0 if not failed and len(job["ranks"]) == args.nproc and names else 1


if __name__ == "__main__":
    sys.exit(main())
