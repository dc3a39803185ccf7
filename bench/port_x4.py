"""The synthesized two-host plans against weft's ring/direct and NCCL, on 4 GPUs declared as 2 hosts x 2 GPUs.

One rank of the job (bench/port_x4.sh starts two torchrun "nodes" of 2 GPUs each, WEFT_HOST=host0/host1, NCCL on
sockets or, with NCCL_HOSTID, on NVLink inside a host and sockets between). Every plan of
examples/plans/two_hosts_2gpu for the collective runs through the port engine once per lanes value (named
PLAN+lanesL), alternated with NCCL on the same buffers (executor.gpu.bench.run_bench, CUDA-graph replay), and
every plan's result is checked against NCCL at every size. The lane counts run one after the other (each whole
before the next), sizes ascending; after every size rank 0 writes one JSON per collective holding every plan at
every lane count so far:

    python bench/port_x4.py OUT_DIR --collectives allgather,allreduce --sizes 1MB,64MB --lanes 1,4 --tag 2hosts

Each row adds to the bench format: ``plans_us`` (every plan's time), ``wrong_by_plan``, and the best synthesized
plan (milp, trees) against the best baseline plan (ring, direct, two-shot) of weft's own: ``synth_us``, ``baseline_us``,
``synth_speedup`` (baseline / synthesized) and their names.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import faulthandler
import json
import os
import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from weft.units import parse_size_range  # noqa: E402

PLANS = ROOT / "examples" / "plans" / "two_hosts_2gpu"
BASELINES = ("ring", "direct", "twoshot")
SYNTHESIZED = ("milp", "trees")
SUFFIX = "+lanes"
ENV = (
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_HOSTID",
    "NCCL_NET",
    "NCCL_P2P_NET_CHUNKSIZE",
    "WEFT_HOST",
)


class Engines:
    """The port engines of several lane counts behind one communicator: a plan named PLAN+lanesL runs on L lanes.
    Rank 0 prints each plan's first execution at each size, so a job that stops shows where."""

    def __init__(self, engines: dict):
        self.engines = engines
        first = next(iter(engines.values()))
        self.rank, self.world_size, self.device, self.hosts = first.rank, first.world_size, first.device, first.hosts
        self.started: set = set()

    def execute(self, plan, input, *args, **kwargs):
        key = (plan.name, input.numel())
        if self.rank == 0 and key not in self.started:
            self.started.add(key)
            print(f"start {plan.name} on {input.numel()} elements", flush=True)
        return self.engines[int(plan.name.rsplit(SUFFIX, 1)[1])].execute(plan, input, *args, **kwargs)

    def synchronize(self, stream=None) -> None:
        for e in self.engines.values():
            e.synchronize()

    def exchange(self, what, value):
        return next(iter(self.engines.values())).exchange(what, value)


def method(name: str) -> str:
    return name.split("-", 1)[0]


def summarize(row: dict, names: dict) -> dict:
    """The best synthesized plan against the best of weft's own baselines at this size."""
    times = {names[k[5:]]: v for k, v in row["median_us"].items() if k.startswith("weft:")}
    best = {
        kind: min(((v, k) for k, v in times.items() if method(k) in kinds), default=(None, None))
        for kind, kinds in (("synth", SYNTHESIZED), ("baseline", BASELINES))
    }
    (s_us, s_plan), (b_us, b_plan) = best["synth"], best["baseline"]
    return {
        "plans_us": times,
        "synth_plan": s_plan,
        "synth_us": s_us,
        "baseline_plan": b_plan,
        "baseline_us": b_us,
        "synth_speedup": b_us / s_us if s_us and b_us else None,
        "synth_vs_nccl": row["nccl_us"] / s_us if s_us else None,
    }


def _plans(
    collective: str, n: int, methods: str = "ring,direct,twoshot,milp,trees", fabric_plans: tuple[Path, ...] = ()
) -> tuple[list, dict, dict]:
    """The collective's two_hosts_2gpu plans named PLAN+lanesN, each one's short name (METHOD-COLLECTIVE+lanesN) and
    each short name's plan file and content hash; then those of each ``fabric_plans`` folder (plans synthesized for
    the fabric this run uses, e.g. two_hosts_2gpu_sockets), short-named METHOD-COLLECTIVE@FABRIC+lanesN (FABRIC: the
    folder's name past two_hosts_2gpu_)."""
    from schedules.plan.io import load_plan

    plans, names, files = [], {}, {}
    for folder in (PLANS, *fabric_plans):
        tag = "" if folder == PLANS else "@" + folder.name.removeprefix(PLANS.name + "_")
        for m in methods.split(","):
            path = folder / f"{m}-{collective}.plan.json"
            if path.exists():
                plan = load_plan(path)
                named = dataclasses.replace(plan, name=f"{plan.name}{tag}{SUFFIX}{n}")
                plans.append(named)
                names[named.name] = f"{m}-{collective}{tag}{SUFFIX}{n}"
                files[names[named.name]] = {"file": str(path.resolve().relative_to(ROOT)), "hash": plan.content_hash}
    return plans, names, files


def _finish(row: dict, collective: str, comm, plans: list, names: dict, torch, buffers, check, local: int) -> None:
    """Every plan's result checked against NCCL at this size, the short names, the synthesized-vs-baseline summary."""
    x = buffers(collective, row["size"], comm.world_size, torch.bfloat16, torch.device("cuda", local))[0]
    wrong = {
        names[p.name]: check(collective, comm, p, x, comm.world_size, "bf16")
        for p in plans
        if f"weft:{p.name}" in row["median_us"]
    }  # those the bench ran
    every = comm.exchange("wrong", wrong)
    row["wrong_by_plan"] = {k: sum(w[k] for w in every) for k in wrong}
    row["wrong"] = sum(row["wrong_by_plan"].values())
    row["plan"] = names.get(row["plan"], row["plan"])
    row.update(summarize(row, names))
    for k in ("raw_us", "plans_ll128_us", "median_us"):
        row.pop(k, None)


def _combine(phases: dict, lanes: list) -> dict:
    """One size's rows of every lane count as one row: every plan's time, and the best plan's time against the
    NCCL time measured beside it (in its phase)."""
    times, wrong, nccl = {}, {}, {}
    for n, row in phases.items():
        times.update(row["plans_us"])
        wrong.update(row["wrong_by_plan"])
        nccl[n] = row["nccl_us"]
    best_n = min(phases, key=lambda n: phases[n]["weft_us"] if phases[n]["weft_us"] else float("inf"))
    row = {
        **phases[best_n],
        "plans_us": times,
        "wrong_by_plan": wrong,
        "wrong": sum(wrong.values()),
        "nccl_us_by_lanes": nccl,
        "lanes": best_n,
    }
    names = {k: k for k in times}
    row.update(
        {
            k: v
            for k, v in summarize(
                {"median_us": {f"weft:{k}": v for k, v in times.items()}, "nccl_us": row["nccl_us"]}, names
            ).items()
            if k != "plans_us"
        }
    )
    if row["synth_us"]:  # against the NCCL time of the synthesized plan's own phase
        row["synth_vs_nccl"] = nccl[int(row["synth_plan"].rsplit(SUFFIX, 1)[1])] / row["synth_us"]
    return row


def _document(collective: str, comm, config, lanes: list, names: dict, files: dict, rows: list, torch) -> dict:
    """The results file; ``files``: each short name's plan file and content hash (``_plans``)."""
    return {
        "collective": collective,
        "dtype": "bf16",
        "nranks": comm.world_size,
        "mode": "graph",
        "machine": {"gpu": torch.cuda.get_device_name(), "gpus": comm.world_size, "host": platform.node()},
        "versions": {
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "method": {
            "calls_per_sample": config.calls,
            "samples": config.samples,
            "warmup": config.warmup,
            "statistic": "median of the slowest rank",
            "timer": "CUDA events",
            "check": "every plan at every size against NCCL (wrong_by_plan)",
        },
        "transport": {
            "engine": "PortEngine",
            "hosts": list(comm.hosts),
            "lanes": lanes,
            "piece_bytes": comm.engines[lanes[0]].piece_bytes,
            "env": {k: os.environ[k] for k in ENV if k in os.environ},
        },
        "plans": {short: {"name": name.rsplit(SUFFIX, 1)[0], **files[short]} for name, short in names.items()},
        "rows": rows,
    }


def _print(rows: list) -> None:
    for r in rows:
        print(
            f"{r['size']:>10} nccl {r['nccl_us']:9.1f}  best {r['weft_us']:9.1f} {r['plan']:28s} x{r['speedup']:.2f}"
            f"  synth {r['synth_plan']} {r['synth_us'] or 0:9.1f}  baseline {r['baseline_plan']} "
            f"{r['baseline_us'] or 0:9.1f}  synth/baseline x{r['synth_speedup'] or 0:.2f}  "
            f"wrong {r['wrong_by_plan']}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--collectives", default="allgather,allreduce")
    parser.add_argument("--sizes", default="1MB,16MB,64MB")
    parser.add_argument("--lanes", default="1,4")
    parser.add_argument("--methods", default="ring,direct,twoshot,milp,trees")
    parser.add_argument(
        "--fabric-plans",
        action="append",
        default=[],
        type=Path,
        help="a folder of plans synthesized for the fabric this run uses (examples/plans/two_hosts_2gpu_sockets), "
        "timed beside the two_hosts_2gpu plans; repeatable",
    )
    parser.add_argument(
        "--piece-bytes", type=int, default=None, help="the least of a chunk a lane carries (default: the engine's)"
    )
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--tag", default="2hosts")
    parser.add_argument("--dump-s", type=float, default=600.0, help="print every stack after this many seconds")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    from executor.gpu.bench import BenchConfig, _buffers, _check, run_bench
    from executor.port.engine import PortEngine

    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    lanes = [int(x) for x in args.lanes.split(",")]
    piece = {} if args.piece_bytes is None else {"piece_bytes": args.piece_bytes}
    comm = Engines({n: PortEngine(None, 60.0, n, **piece) for n in lanes})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    faulthandler.dump_traceback_later(args.dump_s)  # a stuck job shows every rank's stack before it is stopped
    done: dict = {}  # collective -> size -> lanes -> row
    every_name: dict = {}
    every_file: dict = {}  # collective -> short name -> the plan's file and content hash
    for n in lanes:  # one phase per lane count, each whole before the next: a stop loses only the later phases
        for size in parse_size_range(args.sizes):
            for collective in args.collectives.split(","):
                plans, names, files = _plans(collective, n, args.methods, tuple(args.fabric_plans))
                config = BenchConfig(
                    collective, (size,), "bf16", True, args.calls, args.samples, args.warmup, symm=False
                )
                if comm.rank == 0:
                    print(
                        f"{datetime.datetime.now(datetime.UTC):%H:%M:%S} {collective} {size} B, {n} lanes", flush=True
                    )
                rows = run_bench(comm, config, plans, print if comm.rank == 0 else None)
                for row in rows:
                    _finish(row, collective, comm, plans, names, torch, _buffers, _check, local)
                for row in rows:
                    done.setdefault(collective, {}).setdefault(size, {})[n] = row
                every_name.setdefault(collective, {}).update(names)
                every_file.setdefault(collective, {}).update(files)
                if comm.rank == 0:
                    doc = _document(
                        collective,
                        comm,
                        config,
                        lanes,
                        every_name[collective],
                        every_file[collective],
                        [_combine(phases, lanes) for _, phases in sorted(done[collective].items())],
                        torch,
                    )
                    model = re.search(r"[A-Z]\d+", torch.cuda.get_device_name())
                    gpu = model.group(0).lower() if model else "gpu"  # "h100", "h200"
                    path = out / f"gpu_{collective}_bf16_graph_{comm.world_size}x{gpu}_{args.tag}.json"
                    path.write_text(json.dumps(doc, indent=1) + "\n")
                    _print(rows)
    comm.synchronize()
    dist.barrier()
    os._exit(0)  # NCCL's teardown with captured graphs alive can hang (tests/gpu/port_job.py)


if __name__ == "__main__":
    main()
