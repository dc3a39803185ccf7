"""A kernel's start, from its launch to its first op, with the L2 cold (as after a matmul) and warm, on ONE GPU.

    PYTHONPATH=. python bench/prologue_trace.py OUT.json [--registry bench/registry_h200x2] [--nproc 2] [--compiled]

Every rank runs as a process on one GPU (as tests/gpu/one_device.py does), on the timed interpreter build. The
phases before the first op (the tables, the op window and the dependency wait, the barrier) are each block's own
work and do not wait for a peer, so they time correctly on a shared GPU, while the ops do not (the peers'
kernels are time-sliced) and are left out. "cold": a 256 MB memset runs before each call, so the tables come from
memory, as they do after the weights of a decode step's matmul; "warm": calls back to back. Each call is
synchronized before the next one, so the programmatic launch overlaps nothing and the start is all on the path.
``--compiled``: every case also runs as the plan compiled to a kernel of its own (executor.gpu.compiled, the timed
build of it), on the same context, in the same job: its rows carry ``"kernel": "compiled"`` beside the
interpreter's, so the two starts compare within one call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

P = "direct-allreduce-hgx_h200:gpus=2-"
CASES = (
    (P + "ll-x1", 1 << 10),
    (P + "ll-x64-t256", 16 << 10),
    (P + "ll-x64-t512-max8MB", 256 << 10),
    (P + "simple-x64-2s", 1 << 20),
    ("twoshot-allreduce-hgx_h200:gpus=2-simple-x128", 64 << 20),
)
CALLS = 40


def rank_main(out_dir: Path, registry: str, compiled: bool = False) -> None:
    import cupy

    from executor.gpu.engine import InterpreterEngine
    from registry.store import Registry

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cupy.cuda.Device(0).use()
    comm = InterpreterEngine(rank, world, device=0, trace=True, timeout_s=60.0)
    plans = {e.plan.name: e.plan for e in Registry(registry).entries()}
    flush = cupy.empty(256 << 20, cupy.uint8)
    results = []
    for name, nbytes in CASES:
        plan = plans[name]
        x = cupy.ascontiguousarray(cupy.random.standard_normal(nbytes // 2, cupy.float32).view(cupy.uint16)[1::2])
        for kernel, cold in [(k, c) for k in ((False, True) if compiled else (False,)) for c in (False, True)]:
            for _ in range(3):
                comm.execute(plan, x, dtype="bf16", compiled=kernel)
            comm.synchronize()
            comm.reset_kernel_times()
            for k in range(CALLS):
                if cold:
                    flush.fill(k & 0xFF)
                comm.execute(plan, x, dtype="bf16", compiled=kernel)
                comm.synchronize()
            times = comm.kernel_times(plan, nbytes, "bf16")
            phases = {p: statistics.median(t.phases[p] for t in times) for p in times[0].phases}
            results.append(
                {
                    "plan": name,
                    "bytes": nbytes,
                    "cold": cold,
                    "kernel": "compiled" if kernel else "interpreter",
                    "compiled_refused": comm.compiled_refused.get(plan.content_hash, "") if kernel else "",
                    "blocks": len(times),
                    "phases_us": phases,
                    "start_us": round(sum(phases.values()), 3),
                    "start_us_max": round(max(sum(t.phases.values()) for t in times), 3),
                }
            )
    comm.close()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--registry", default="bench/registry_h200x2")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--compiled", action="store_true", help="also time each plan compiled to its own kernel")
    parser.add_argument("--rank-of", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.registry, args.compiled)
        return 0
    work = args.output.parent / (args.output.stem + ".ranks")
    work.mkdir(parents=True, exist_ok=True)
    from weftcore.rendezvous import rank_env, rendezvous_port  # the tree is on PYTHONPATH, as for the ranks

    port = rendezvous_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(args.output), "--registry", args.registry, "--rank-of", str(work)]
            + (["--compiled"] if args.compiled else []),
            env={**os.environ, **rank_env(r, args.nproc, port, local_rank=0)},  # every rank on one GPU
        )
        for r in range(args.nproc)
    ]
    codes = [p.wait(timeout=500) for p in procs]
    ranks = [
        json.loads((work / f"rank{r}.json").read_text()) for r in range(args.nproc) if (work / f"rank{r}.json").exists()
    ]
    import platform

    import cupy

    import executor

    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "executor": str(Path(executor.__file__).parent),
        "calls": CALLS,
        "machine": {
            "gpu": gpu.decode() if isinstance(gpu, bytes) else gpu,
            "host": platform.node(),
            "ranks_on_one_gpu": args.nproc,
        },
        "versions": {
            "cupy": cupy.__version__,
            "driver": cupy.cuda.runtime.driverGetVersion(),
            "python": platform.python_version(),
        },
        "exit_codes": codes,
        "ranks": ranks,
    }
    args.output.write_text(json.dumps(doc, indent=1))
    for row in ranks[0] if ranks else []:
        print(
            f"{row['plan'][-24:]:>24} {row['bytes']:>9} {row['kernel'][:8]:>8} "
            f"{'cold' if row['cold'] else 'warm'}  start "
            f"{row['start_us']:.2f} µs (max {row['start_us_max']:.2f})  {row['phases_us']}"
        )
    return 0 if codes == [0] * args.nproc else 1


if __name__ == "__main__":
    sys.exit(main())
