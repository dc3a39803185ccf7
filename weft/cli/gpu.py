"""``weft run PLAN --nproc N`` and ``weft bench COLLECTIVE --nproc N``: plans on GPUs, checked against NCCL.

Without RANK in the environment the command starts one process per GPU running itself (as torchrun would);
under torchrun it reads RANK, WORLD_SIZE and LOCAL_RANK. Rank 0 prints and writes files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedules.collectives import NAMES
from weft.cli import ArgumentError
from weft.cli import progress as _progress
from weft.cli.words import counted
from weft.units import format_bytes, parse_bytes, parse_size_range
from weftcore.errors import WeftError
from weftcore.jsonfile import write_text
from weftcore.rendezvous import MULTICAST_OFF, rank_env, rendezvous_port


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run a plan on GPUs and check it against NCCL",
        description="Run PLAN on N GPUs (one process each) and compare with torch.distributed.",
    )
    run.add_argument("plan", help="plan file")
    _common(run)
    run.add_argument("--size", default="64MB", help="message size (nccl-tests terms; binary: 1KB = 1024 B)")
    run.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"), help="element type")
    run.add_argument("--check", action="store_true", help="compare with NCCL on the same random input")
    run.add_argument("--iters", type=int, default=20, help="timed executions")
    run.set_defaults(func=_run)
    bench = sub.add_parser(
        "bench",
        help="benchmark weft against NCCL and symmetric memory",
        description="Time NCCL, PyTorch symmetric memory (all-reduce, reduce-scatter, all-gather) and weft, in turns.",
    )
    bench.add_argument("collective", choices=NAMES)
    _common(bench)
    bench.add_argument("--plans", nargs="+", default=["registry"], help="plan files, or 'registry'")
    bench.add_argument("--registry", help="registry location (default: $WEFT_REGISTRY or the user data dir)")
    bench.add_argument(
        "--top",
        type=int,
        metavar="K",
        help="with --plans registry: time at each size only the K plans the registry ranks fastest there (its "
        "measured times, in the modes this run may use, --ll128 and --compiled; else its predictions) (default: "
        "every plan at every size it runs)",
    )
    bench.add_argument(
        "--sizes", default="1KB:1GB", help="sizes: 1KB:1GB (powers of two) or 1KB,4MB (binary: 1KB = 1024 B)"
    )
    bench.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"), help="element type")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument(
        "--graph", dest="graph", action="store_true", default=True, help="CUDA-graph replay (the default)"
    )
    mode.add_argument("--eager", dest="graph", action="store_false", help="eager launches (default: --graph)")
    bench.add_argument("--samples", type=int, default=30, help="timed samples per implementation and size")
    bench.add_argument("--calls", type=int, default=20, help="calls per sample")
    bench.add_argument("-o", "--output", help="JSON results file (default bench/results/gpu_<coll>_<n>x<gpu>.json)")
    bench.add_argument("--json", action="store_true", help="print the rows as JSON")
    bench.add_argument(
        "--peers",
        default="flashinfer,vllm",
        help="all-reduce peers timed beside NCCL and symmetric memory where installed, comma-separated: "
        "flashinfer, vllm (its custom all-reduce as FlashInfer ships it), or none "
        "(default: flashinfer,vllm); all-to-all: symm adds torch symmetric memory's all_to_all_vdev "
        "(NVSHMEM)",
    )
    bench.add_argument(
        "--record",
        action="store_true",
        help="store weft's measured times in the registry entries (with --plans registry)",
    )
    bench.set_defaults(func=_bench)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None, help="processes (GPUs); default WORLD_SIZE or all GPUs")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a GPU wait may spin before failing")
    p.add_argument(
        "--no-pdl",
        dest="pdl",
        action="store_false",
        help="ordinary launches instead of programmatic dependent launches",
    )
    p.add_argument(
        "--cluster",
        type=int,
        default=1,
        help="blocks a thread-block cluster in each kernel launch (Hopper and newer; default 1: none)",
    )
    p.add_argument(
        "--ll128",
        action="store_true",
        help="LL plans may move their packets as LL128 lines (NVLink machines only): run uses them, bench "
        "times each LL plan with and without them and records the two apart",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="plans compiled to kernels of their own (NVRTC, cached; the interpreter where refused): run uses "
        "them, bench times each plan compiled beside the interpreter in the same job and records both",
    )


# ---------------------------------------------------------------- launching


class RankFailed(WeftError):
    """A rank process of ``weft run``/``weft bench`` failed; the launcher stopped the others.

    The exit code is the rank's own (128 + the signal number for a rank killed by a signal)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _spawn(args: argparse.Namespace) -> int | None:
    """Start one process per GPU running this same command; None when this process is already a rank."""
    if args.cluster < 1:
        raise ArgumentError(f"weft: --cluster {args.cluster}: a cluster holds 1 block or more")
    _require_gpu_stack()
    if "RANK" in os.environ:
        return None
    n = args.nproc or _gpu_count()
    if n < 1:
        raise ArgumentError("weft: --nproc must be at least 1")
    return launch_ranks(_rank_command(), n)


def _rank_command() -> list[str]:
    return [sys.executable, "-c", "from weft.cli import run; run()", *sys.argv[1:]]


def launch_ranks(command: list[str], n: int, grace_s: float = 10.0, poll_s: float = 0.05) -> int:
    """Run ``command`` as ranks 0..n-1 (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set); 0 when all succeed.

    When one rank fails (a non-zero exit or a signal) the others get SIGTERM, then SIGKILL after ``grace_s``,
    and RankFailed names the first rank that failed. A launcher that is interrupted or terminated takes its
    ranks with it.
    """
    port = rendezvous_port()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(n):
            procs.append(subprocess.Popen(command, env={**os.environ, **rank_env(rank, n, port)}))
        failed = _first_failure(procs, poll_s)
        if failed is None:
            return 0
        stopped = [r for r, p in enumerate(procs) if p.poll() is None]
        _stop(procs, grace_s)
        rank, code = failed
        raise RankFailed(
            f"rank {rank} of {n} {_describe_exit(code)}"
            + (f"; stopped rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}" if stopped else ""),
            128 - code if code < 0 else code,
        )
    finally:
        _stop(procs, grace_s)  # a killed or interrupted launcher takes its ranks with it
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


def _first_failure(procs: list[subprocess.Popen], poll_s: float) -> tuple[int, int] | None:
    """(rank, return code) of the first rank seen failing, or None once every rank exited with 0."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            return failed[0]
        if all(c == 0 for c in codes):
            return None
        time.sleep(poll_s)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to every rank still running, SIGKILL to those still there after ``grace_s``; reaps them all."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "unknown signal"
    return f"was killed by signal {-code} ({name})"


def _require_gpu_stack() -> None:
    import importlib.util

    missing = [m for m in ("torch", "cupy") if importlib.util.find_spec(m) is None]
    if missing:
        raise ArgumentError(f"weft: GPU commands need {' and '.join(missing)} (pip install 'weft[gpu]')")


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _init_rank(args: argparse.Namespace, port: bool = False, compiled: bool = False):
    """This rank's process group and executor: the GPU interpreter (``compiled``: running plans compiled to kernels
    of their own where it can), or for plans with port channels (hops between hosts) the port engine over NCCL's
    point-to-point calls."""
    os.environ.update({k: os.environ.get(k, v) for k, v in MULTICAST_OFF.items()})
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    if port:
        from executor.port.engine import PortEngine

        return PortEngine.from_process_group(timeout_s=args.timeout), rank, world
    from executor.gpu.engine import InterpreterEngine

    comm = InterpreterEngine.from_process_group(
        timeout_s=args.timeout, programmatic=args.pdl, ll128=args.ll128, compiled=compiled, cluster=args.cluster
    )
    return comm, rank, world


def has_port_channels(plans: list) -> bool:
    """Whether any plan crosses hosts (port channels): those run on the port engine, and so do all plans of a bench
    that has one (one engine per job)."""
    return any(g.port_peers for p in plans for g in p.gpus)


def _abandon(rank: int, error: BaseException) -> None:
    """End a rank that failed, at once: NCCL's teardown would wait for peers that may sit in a collective this rank
    never reaches (so the error was never shown). The launcher then stops the other ranks."""
    if isinstance(error, WeftError):
        print(f"weft: error: rank {rank}: {error}", file=sys.stderr, flush=True)
        code = error.exit_code
    elif isinstance(error, KeyboardInterrupt):  # a stop (Ctrl-C, or the launcher's or a timeout's SIGTERM): one line
        print(f"weft: stopped: rank {rank}", file=sys.stderr, flush=True)
        code = 130
    else:
        import traceback

        traceback.print_exception(error, file=sys.stderr)
        sys.stderr.flush()
        code = 1
    sys.stdout.flush()
    os._exit(code)


# ---------------------------------------------------------------- weft run


def _in_place(plan, rank: int, x, message: int) -> tuple:
    """(x, the buffer to run on, the output's view of it): an in-place plan runs on one buffer of the message's
    size holding the input at the rank's slice, and its output is the rank's slice of it (all of it for most)."""
    if not plan.inplace:
        return x, lambda out: out
    facts = plan.collective_spec()
    n_out = int(message * facts.output_fraction)
    at_in, at_out = facts.inplace_offsets(rank, x.numel(), n_out)
    buf = x.new_zeros(message)
    buf[at_in : at_in + x.numel()] = x
    return buf, lambda out: out[at_out : at_out + n_out]


def _run(args: argparse.Namespace) -> int:
    from schedules.plan.io import load_plan

    plan = load_plan(args.plan)
    nbytes = parse_bytes(args.size)
    code = _spawn(args)
    if code is not None:
        return code
    import torch
    import torch.distributed as dist

    from executor.errors import WrongResult
    from executor.gpu.bench import TORCH_DTYPES, matches, nccl_result, sum_magnitude
    from executor.reference.padded import buffer_parts

    comm, rank, world = _init_rank(args, has_port_channels([plan]), compiled=args.compiled)
    try:
        dtype = getattr(torch, TORCH_DTYPES[args.dtype])
        gpu = plan.gpus[rank] if rank < plan.nranks else plan.gpus[0]
        esize = torch.tensor([], dtype=dtype).element_size()
        # a size off the plan's granule runs padded (schedules.padding); the input is its parts at the caller's size
        n_in = (
            nbytes // plan.message_parts * buffer_parts(plan, gpu.input_chunks) // esize
            if plan.runs(nbytes)
            else nbytes // esize
        )
        torch.manual_seed(rank)
        x = torch.randn(n_in, device="cuda", dtype=torch.float32).to(dtype)
        mine = x
        x, take = _in_place(plan, rank, mine, nbytes // esize)  # MSCCL++'s plans often run in place
        out = comm.execute(plan, x, dtype=args.dtype)
        comm.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            comm.execute(plan, x)  # same input, same context: the output allocated above is reused
        end.record()
        comm.synchronize()
        us = start.elapsed_time(end) * 1000 / args.iters
        ok = True
        if args.check:
            ref, magnitude = nccl_result(plan.collective, mine, world), sum_magnitude(plan.collective, mine, world)
            x, take = _in_place(plan, rank, mine, nbytes // esize)
            out = take(comm.execute(plan, x))
            comm.synchronize()
            ok = matches(plan.collective, out, ref, args.dtype, magnitude, world)
        oks = comm.exchange("run-check", ok)  # plain data through the store, never a pickle
        if rank == 0:
            print(
                f"plan {plan.name}: {plan.collective} {format_bytes(nbytes)} {args.dtype} on "
                f"{counted(world, 'GPU')}: "
                f"{us:.2f} µs per execution (eager, {counted(args.iters, 'execution')})"
                + (f"; check against NCCL: {_check_word(oks)}" if args.check else "")
                + (_kernel_words(comm, plan) if args.compiled else "")
            )
        if not all(oks):
            raise WrongResult(f"plan {plan.name}: result differs from NCCL")
    except BaseException as e:
        _abandon(rank, e)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- weft bench


def _kernel_words(comm, plan) -> str:
    """What ``weft run --compiled`` ran: the compiled kernel, or the interpreter and why."""
    why = getattr(comm, "compiled_refused", {}).get(plan.content_hash, "")
    if not hasattr(comm, "compiled_refused"):
        why = "the port engine has no compiled kernels"
    return f"; interpreted ({why})" if why else "; compiled kernel"


def _check_word(oks: list) -> str:
    """The check's verdict: "ok", or the ranks whose result differs from NCCL's."""
    return "ok" if all(oks) else "WRONG on ranks " + str([r for r, o in enumerate(oks) if not o])


def _load_plans(
    args: argparse.Namespace, world: int, sizes: list[int]
) -> tuple[list, tuple[tuple[int, frozenset[str]], ...]]:
    """The plans to time, and with ``--top`` the plan hashes timed at each size (BenchConfig.contenders)."""
    from schedules.plan.io import load_plan

    at: tuple[tuple[int, frozenset[str]], ...] = ()
    if args.plans == ["registry"]:
        from registry.store import Registry, contenders_at, ranked_anywhere

        entries = Registry(args.registry).entries(collective=args.collective)
        entries = [e for e in entries if e.plan.nranks == world]
        if args.top is not None:
            ranked = contenders_at(entries, sizes, args.top, args.ll128, args.compiled)
            at = tuple((n, frozenset(e.plan.content_hash for e in kept)) for n, kept in ranked.items())
            entries = ranked_anywhere(entries, ranked)
        plans = [e.plan for e in entries]
    else:
        plans = [load_plan(p) for p in args.plans]
    plans = [p for p in plans if p.collective == args.collective and p.nranks == world]
    if not plans:
        raise ArgumentError(
            f"weft bench: no {args.collective} plan for {counted(world, 'rank')} in {' '.join(args.plans)}"
        )
    return plans, at


def _bench(args: argparse.Namespace) -> int:
    sizes = parse_size_range(args.sizes)
    if args.record and args.plans != ["registry"]:
        raise ArgumentError("weft bench: --record needs --plans registry (times are stored in registry entries)")
    if args.top is not None and (args.plans != ["registry"] or args.top < 1):
        raise ArgumentError(f"weft bench: --top {args.top}: a count of 1 or more, with --plans registry")
    code = _spawn(args)
    if code is not None:
        return code
    import torch
    import torch.distributed as dist

    from executor.gpu.bench import BenchConfig, run_bench

    plans, contenders = _load_plans(args, int(os.environ["WORLD_SIZE"]), sizes)
    port = has_port_channels(plans)
    comm, rank, world = _init_rank(args, port)
    try:
        config = BenchConfig(
            args.collective,
            tuple(sizes),
            args.dtype,
            args.graph,
            args.calls,
            args.samples,
            ll128=args.ll128,
            compiled=args.compiled,
            symm=not port,
            peers=tuple(p for p in args.peers.split(",") if p in ("flashinfer", "vllm", "symm")),
            contenders=contenders,
        )
        path = Path(
            args.output
            or f"bench/results/gpu_{args.collective}_{args.dtype}_"
            f"{'graph' if args.graph else 'eager'}_{world}x{_gpu_slug(torch)}.json"
        )

        def write(rows: list[dict], complete: bool) -> dict:
            doc = _bench_document(args, config, rows, world, torch, comm) | {
                "complete": complete,
                "sizes_planned": sizes,
            }
            write_text(path, json.dumps(doc, indent=1) + "\n", "bench results", ArgumentError, parents=True)
            return doc

        on_row = row_verdicts(comm.exchange, config.compiled, len(sizes), write if rank == 0 else None)
        rows = run_bench(comm, config, plans, _progress if rank == 0 else None, on_row)
        if rank == 0:
            doc = write(rows, True)
            if args.record:
                _record(args, rows)
            if args.json:
                print(json.dumps(doc["rows"], indent=1))
            else:
                _print_table(doc, path)
    except BaseException as e:
        _abandon(rank, e)
    dist.destroy_process_group()
    return 1 if any(r["wrong"] or r.get("compiled_wrong") for r in rows) else 0


def row_verdicts(
    exchange: Callable[[str, Any], list[Any]],
    compiled: bool,
    total: int,
    write: Callable[[list[dict], bool], object] | None,
) -> Callable[[dict], None]:
    """The bench's ``on_row``: each size's wrong counts summed over every rank (``exchange``, collective), then,
    where ``write`` is given (rank 0), the results file with the sizes done so far, ``complete`` false until the
    last. A job stopped by its time limit so keeps its finished sizes, which ``weft registry record`` takes as any
    results file."""
    done: list[dict] = []

    def on_row(row: dict) -> None:
        row["wrong"] = sum(exchange("bench-wrong", row["wrong"]))  # plain data, never a pickle
        if compiled:
            row["compiled_wrong"] = sum(exchange("bench-compiled-wrong", row.get("compiled_wrong", 0)))
        done.append(row)
        if write is not None and len(done) < total:
            write(list(done), False)

    return on_row


def _record(args: argparse.Namespace, rows: list[dict]) -> None:
    """Every plan's measured time into its registry entry, so `select` compares measurements, not predictions,
    and NCCL's, so that selection runs NCCL where it measured faster (``publish.record_bench``)."""
    from registry.store import Registry
    from weft import publish

    publish.record_bench(Registry(args.registry), args.collective, rows)


def _gpu_slug(torch) -> str:
    return torch.cuda.get_device_name().replace("NVIDIA ", "").replace(" ", "").lower()


def _bench_document(args, config, rows, world: int, torch, comm=None) -> dict:
    import cupy

    from executor.gpu import peers
    from executor.gpu.bench import TURNS_ORDER

    versions = {
        **peers.run_versions(torch),
        "cupy": cupy.__version__,
        "driver": cupy.cuda.runtime.driverGetVersion(),
    }
    return {
        "collective": args.collective,
        "dtype": args.dtype,
        "nranks": world,
        "mode": "graph" if args.graph else "eager",
        "machine": {"gpu": torch.cuda.get_device_name(), "gpus": world, "host": platform.node()},
        "versions": versions,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "method": {
            "calls_per_sample": config.calls,
            "samples": config.samples,
            "warmup": config.warmup,
            "statistic": "median",
            "timer": "CUDA events",
            "order": TURNS_ORDER,
            "programmatic_launch": args.pdl,
            "cluster": args.cluster,
            "ll128": args.ll128,
            "compiled": args.compiled,
        },
        "rows": rows,
        **({"transport": _transport(comm)} if hasattr(comm, "hosts") and len(set(comm.hosts)) > 1 else {}),
    }


def _transport(comm) -> dict:
    """How a run across hosts moved its data: the hosts of the ranks and NCCL's transport settings."""
    keys = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME")
    return {
        "engine": type(comm).__name__,
        "hosts": list(comm.hosts),
        "env": {k: os.environ[k] for k in keys if k in os.environ},
    }


def _print_table(doc: dict, path: Path) -> None:
    print(f"# weft bench {doc['collective']} {doc['dtype']} {doc['mode']} on {doc['nranks']}x {doc['machine']['gpu']}")
    print(
        f"{'size':>10} {'nccl_us':>9} {'symm_us':>9} {'fi_us':>9} {'best_peer':>20} {'weft_us':>9} {'algbw':>8} "
        f"{'busbw':>8} {'speedup':>8} {'#wrong':>6} {'peers':>5}  plan"
    )

    def us(t) -> str:
        return f"{t:9.2f}" if t is not None else f"{'-':>9}"

    for r in doc["rows"]:
        peer = f"{r.get('best_peer') or '-'} {r.get('best_peer_us') or 0:.2f}"
        head = (
            f"{format_bytes(r['size']):>10} {r['nccl_us']:9.2f} {us(r['symm_us'])} {us(r.get('flashinfer_us'))} "
            f"{peer:>20}"
        )
        peers_wrong = sum((r.get("peers_wrong") or {}).values())
        if r["weft_us"] is None:
            print(
                f"{head} {'-':>9} {'-':>8} {'-':>8} {'-':>8} {r['wrong']:>6} {peers_wrong:>5}  "
                "(no plan accepts this size)"
            )
            continue
        print(
            f"{head} {r['weft_us']:9.2f} {r['algbw']:8.2f} {r['busbw']:8.2f} {r['speedup']:8.2f} {r['wrong']:>6} "
            f"{peers_wrong:>5}  {r['plan']}"
        )
    print(f"# written to {path}")
