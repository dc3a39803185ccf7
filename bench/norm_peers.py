"""The fused all-reduce + residual add + RMSNorm call alone, weft against FlashInfer and NCCL, in one job.

    WEFT_REGISTRY=bench/registry_h200x2 torchrun --nproc-per-node 2 bench/norm_peers.py \
        -o bench/results/gpu_allreduce_norm_bf16_graph_2xh200.json

Per token count (hidden 8192, bf16): weft's ``comm.all_reduce(y, residual=h, rms_weight=w, eps=)`` (the plan its
Communicator picks, run the way the registry measured it fastest: ``plan`` carries the bench's +ll128/+compiled
suffix, and where that is compiled the same plan interpreted is timed beside it as ``interpreted_us``),
FlashInfer's ``trtllm_allreduce_fusion`` with ``kARResidualRMSNorm`` (one-shot, two-shot and its own choice;
``flashinfer_us`` is the best, named in ``flashinfer_variant``), with ``--candidates K`` the K plans selection
ranks next for the fused call, and with ``--plans NAMES`` those registry plans, each pinned (``candidates_us``, by
plan name and mode suffix; a plan that cannot run the call is in ``peers_refused``), and NCCL's in-place
all-reduce followed by torch's add and ``rms_norm`` (``nccl_us``). ``plans_us`` (and ``plans_wrong``) key every weft
call by its plan's hash and mode suffix: `weft registry record FILE` stores them as the fused call's times, which
selection for the fused call then ranks its plans by (registry/norms.py). Timed as ``weft bench`` times
(executor/gpu/bench.py): a CUDA graph of ``--calls`` calls per sample, the implementations alternating sample by
sample, each one's median on its slowest rank.

Checked, every implementation on the same inputs: the new residual against NCCL's all-reduce plus the residual,
within ``within_rounding`` for nranks + 1 terms; the normed rows against the definition applied to that
implementation's own new residual (fp32 mean of squares, ``x * rstd * w`` rounded once), within 2 bf16 ulps
(``NORM_ULPS``). ``wrong`` counts ranks where weft fails either, ``peers_wrong`` the same per peer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN, EPS = 8192, 1e-5
NORM_ULPS = 2  # a fused kernel may normalize the unrounded sum, the definition here the rounded residual


def norm_wrong(normed, residual, ref_residual, magnitude, weight, nranks: int) -> bool:
    """Whether (normed, residual) misses NCCL's residual or the norm's definition (module docstring)."""
    import torch

    from executor.gpu.bench import within_rounding

    if not within_rounding(residual, ref_residual, magnitude, "bf16", nranks + 1):
        return True
    x = residual.float()
    rstd = 1.0 / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True).float() + EPS)
    want = ((x * rstd) * weight.float()).to(torch.bfloat16).float()
    ulp = torch.maximum(want.abs(), torch.tensor(2.0**-126, device=want.device)) * 2.0**-7
    return bool(((normed.float() - want).abs() > NORM_ULPS * ulp).any())


def _timers(comm: Any, calls: dict[str, Any], count: int, refused: dict[str, str]) -> dict[str, Any]:
    """A timer per call that every rank could start; the others' reasons go to ``refused``."""
    from executor.gpu.bench import _refused_anywhere, _timer

    timers = {}
    for name, (run, _, capture) in calls.items():
        try:
            timer, why = _timer(run, True, count, *((capture,) if capture else ())), ""
        except Exception as e:
            timer, why = None, f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if _refused_anywhere(comm, why):
            refused[name] = why or "refused on another rank"
            continue
        timers[name] = timer
    return timers


def _weft_calls(
    comm: Any, y: Any, h: Any, weight: Any, shape: Any, chosen: Any, mode: Any, others: list[tuple[Any, Any]]
) -> dict[str, tuple]:
    """weft's fused call as the Communicator runs it ("weft": ``chosen`` in ``mode``); where that is compiled, the
    same plan interpreted ("weft:interpreted"); and each of ``others`` ((plan, mode): the runners-up of
    ``Communicator.norm_plans``) as "weft:<plan><mode suffix>". Each is pinned around its calls (the graph keeps
    how it was captured)."""
    import torch

    from registry.index import Mode

    nbytes = y.numel() * y.element_size()

    def capture():
        return comm.capture(sizes=[nbytes], residual=True, rms_norm=shape)

    def weft():
        return comm.all_reduce(y, residual=h, rms_weight=weight, eps=EPS)

    def pinned(plan: Any, how: Any) -> Callable[[], Any]:
        def call():
            comm.pin_norm_plan(nbytes, torch.bfloat16, shape, plan, how)
            try:
                return weft()
            finally:
                comm.pin_norm_plan(nbytes, torch.bfloat16, shape, None)

        return call

    calls = {"weft": (weft, weft, capture)}
    if chosen is not None and mode.compiled:
        interpreted = pinned(chosen, Mode(lines=mode.lines))
        calls["weft:interpreted"] = (interpreted, interpreted, capture)
    for plan, how in others:
        call = pinned(plan, how)
        calls[f"weft:{plan.name}{how.suffix}"] = (call, call, capture)
    return calls


def _samples(timers: dict[str, Any], warmup: int, samples: int) -> dict[str, list[float]]:
    """``samples`` samples of each timer after ``warmup`` discarded ones, the timers interleaved, their order
    changing from round to round."""
    from executor.gpu.bench import turns

    raw: dict[str, list[float]] = {k: [] for k in timers}
    for i in range(warmup + samples):
        for name in turns(list(timers), i):  # each in every place equally often (executor.gpu.bench.turns)
            value = timers[name]()
            if i >= warmup:
                raw[name].append(value)
    return raw


def _runners_up(comm: Any, nbytes: int, shape: Any, chosen: Any, args: argparse.Namespace) -> list[tuple]:
    """The ``--candidates`` plans after ``chosen`` that the fused call of this size could run, with their modes."""
    import torch

    if args.candidates <= 0:
        return []
    ranked = comm.norm_plans(nbytes, torch.bfloat16, shape, args.candidates + 1)
    return [(plan, how) for plan, how in ranked if chosen is None or plan.name != chosen.name][: args.candidates]


def _named(comm: Any, names: list[str], nbytes: int, dtype: Any, shape: Any, skip: set[str]) -> tuple[list, dict]:
    """The ``--plans`` plans (registry plan names) that the fused call of this size can run, each with the mode the
    registry measured it fastest (``Communicator.pin_norm_plan``'s default), and why each other one cannot
    ("weft:<name>": one line). Names in ``skip`` (the choice and the runners-up, timed already) are left out."""
    plans = {e.plan.name: e.plan for e in comm.choice.entries} if comm.choice is not None else {}
    found, refused = [], {}
    for name in names:
        if name in skip:
            continue
        plan = plans.get(name)
        if plan is None:
            refused[f"weft:{name}"] = "no such plan among the registry's for this fabric"
            continue
        try:
            comm.pin_norm_plan(nbytes, dtype, shape, plan)
            found.append((plan, comm.norm_mode_for(nbytes, dtype, shape)))
        except ValueError as e:  # its proof, its rows at this size, or the staging size refuse it
            refused[f"weft:{name}"] = str(e).splitlines()[0][:300]
        finally:
            comm.pin_norm_plan(nbytes, dtype, shape, None)
    return found, refused


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,4,16,64")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--candidates",
        type=int,
        default=0,
        metavar="K",
        help="also time the K plans selection ranks next for the fused call (Communicator.norm_plans), each pinned "
        "and run the way the registry measured it fastest, as weft:<plan> (default 0)",
    )
    p.add_argument(
        "--plans",
        default="",
        metavar="NAMES",
        help="also time these registry plans (comma-separated plan names) for the fused call, each pinned where it "
        "can run it and run the way the registry measured it fastest, as weft:<plan> (refusals in peers_refused)",
    )
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args()
    for var, value in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        os.environ.setdefault(var, value)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from executor import Communicator
    from executor.gpu import peers
    from executor.gpu.bench import TURNS_ORDER, _every_rank, _slowest_rank, nccl_result
    from executor.reference.norm import RowNorm
    from registry.index import Mode
    from registry.norms import norm_key

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    started = time.monotonic()

    def progress(what: str) -> None:
        """Rank 0's stage with the seconds since the start, on stderr: a run cut by its time limit shows where its
        time went (the sixteenth session's 4-GPU run, four plans pinned, wrote nothing in 136 s)."""
        if rank == 0:
            print(f"[{time.monotonic() - started:6.1f} s] {what}", file=sys.stderr, flush=True)

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    comm = Communicator.from_process_group(ll128=True)
    progress("communicator ready")
    tokens_list = [int(t) for t in args.tokens.split(",")]
    try:
        fi, fi_absent = peers.FlashInfer.create(max_bytes=max(tokens_list) * HIDDEN * 2, hidden=HIDDEN), ""
    except Exception as e:  # the fused call is then weft against NCCL alone
        fi, fi_absent = None, f"{type(e).__name__}: {e}".splitlines()[0][:300]
    progress(f"flashinfer {'ready' if fi is not None else 'absent: ' + fi_absent}")
    gen = torch.Generator(device=device).manual_seed(99 + rank)
    weight = (
        1.0 + 0.1 * torch.randn(HIDDEN, generator=torch.Generator(device=device).manual_seed(4321), device=device)
    ).to(torch.bfloat16)  # the same on every rank

    def write(rows: list[dict]) -> None:
        """The results file with the token counts done so far (rank 0), ``complete`` false until the last: a job
        stopped by its time limit keeps what it measured."""
        doc = {
            "benchmark": "allreduce_norm",  # `weft registry record` stores plans_us in the registry's norm.json
            "collective": "allreduce",
            "op": "all-reduce + residual add + RMSNorm (the call alone)",
            "dtype": "bf16",
            "nranks": world,
            "mode": "graph",
            "hidden": HIDDEN,
            "eps": EPS,
            "machine": {"gpu": torch.cuda.get_device_name(device), "gpus": world, "host": platform.node()},
            "versions": peers.run_versions(torch),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "method": {
                "calls_per_sample": args.calls,
                "samples": args.samples,
                "warmup": args.warmup,
                "statistic": "median of the slowest rank",
                "timer": "CUDA events",
                "order": TURNS_ORDER,
                "check": f"residual within within_rounding(nranks + 1 terms); normed within {NORM_ULPS} "
                "bf16 ulps of the definition on the call's own residual",
            },
            "rows": rows,
            "complete": len(rows) == len(tokens_list),
            "tokens_planned": tokens_list,
        }
        Path(args.output).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    rows = []
    for tokens in tokens_list:
        nbytes = tokens * HIDDEN * 2
        y = torch.randn(tokens, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16)
        h = torch.randn(
            tokens, HIDDEN, generator=torch.Generator(device=device).manual_seed(5), device=device, dtype=torch.bfloat16
        )  # the residual stream is replicated across ranks
        t = y.clone()  # NCCL sums in place; its time does not depend on the values

        def nccl(t=t, h=h):
            dist.all_reduce(t)
            return F.rms_norm(h + t, (HIDDEN,), weight, EPS), h + t

        def nccl_checked(y=y, h=h):
            s = nccl_result("allreduce", y, world)
            return F.rms_norm(h + s, (HIDDEN,), weight, EPS), h + s

        shape = RowNorm(HIDDEN, EPS)
        plan, mode = comm.norm_plan_for(nbytes, y.dtype, shape), comm.norm_mode_for(nbytes, y.dtype, shape)
        others = _runners_up(comm, nbytes, shape, plan, args)
        # every weft call's plan and mode, by its label: what plans_us records
        keyed = {"weft": (plan, mode)} if plan is not None else {}
        skip = {p.name for p, _ in others} | ({plan.name} if plan is not None else set())
        named, refused = _named(comm, [n for n in args.plans.split(",") if n], nbytes, y.dtype, shape, skip)
        progress(
            f"tokens {tokens}: choice {plan.name + mode.suffix if plan is not None else None}, "
            f"{len(others)} runners-up, {len(named)} named plans pinned, {len(refused)} refused"
        )
        calls: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]] = {
            "nccl": (nccl, nccl_checked, None),
            **_weft_calls(comm, y, h, weight, shape, plan, mode, others + named),
        }
        if plan is not None and mode.compiled:
            keyed["weft:interpreted"] = (plan, Mode(lines=mode.lines))
        keyed |= {f"weft:{p.name}{how.suffix}": (p, how) for p, how in others + named}
        refused |= {} if fi is not None else {"flashinfer": fi_absent}
        for variant in peers.VARIANTS if fi is not None else ():
            assert fi is not None
            why = fi.refusal(tokens, HIDDEN, variant)
            if why:
                refused[f"flashinfer:{variant}"] = why
                continue
            normed, new_residual = torch.empty_like(y), torch.empty_like(y)

            def fused(fi=fi, v=variant, n=normed, r=new_residual, y=y, h=h):
                return fi.fused_norm(y, h, weight, EPS, v, n, r)

            calls[f"flashinfer:{variant}"] = (fused, fused, None)
        timers = _timers(comm, calls, args.calls, refused)
        torch.cuda.synchronize()
        progress(f"tokens {tokens}: {len(timers)} timers captured")
        raw = _samples(timers, args.warmup, args.samples)
        torch.cuda.synchronize()
        progress(f"tokens {tokens}: sampled")
        med = _slowest_rank(comm, {k: statistics.median(v) for k, v in raw.items()})
        ref_residual = nccl_result("allreduce", y, world).float() + h.float()  # NCCL's sum plus the residual
        magnitude = nccl_result("allreduce", y.float().abs(), world) + h.float().abs()
        mine = {}
        for name in timers:
            normed, residual = calls[name][1]()
            torch.cuda.synchronize()
            mine[name] = int(norm_wrong(normed, residual, ref_residual, magnitude, weight, world))
        every = _every_rank(comm, "norm-peers-wrong", mine)
        wrong = {name: sum(w[name] for w in every) for name in mine}
        flashinfer = {k: v for k, v in med.items() if k.startswith("flashinfer:")}
        rivals = {k: v for k, v in med.items() if not k.startswith("weft")}
        best_peer = min(rivals, key=rivals.__getitem__)
        rows.append(
            {
                "size": nbytes,
                "tokens": tokens,
                "hidden": HIDDEN,
                "nccl_us": med.get("nccl"),
                "symm_us": None,
                "weft_us": med.get("weft"),
                "flashinfer_us": min(flashinfer.values()) if flashinfer else None,
                "flashinfer_variant": min(flashinfer, key=flashinfer.__getitem__).split(":")[1] if flashinfer else None,
                "best_peer": best_peer,
                "best_peer_us": rivals[best_peer],
                "speedup": med["nccl"] / med["weft"] if "weft" in med and "nccl" in med else None,
                "interpreted_us": med.get("weft:interpreted", med.get("weft") if not mode.compiled else None),
                "candidates_us": {
                    k[5:]: v for k, v in med.items() if k.startswith("weft:") and k != "weft:interpreted"
                },
                # by plan hash + mode suffix (registry/norms.py), for `weft registry record`
                "plans_us": {norm_key(p.content_hash, m): med[k] for k, (p, m) in keyed.items() if k in med},
                "plans_wrong": {norm_key(p.content_hash, m): wrong[k] for k, (p, m) in keyed.items() if k in wrong},
                "wrong": wrong.get("weft"),
                "interpreted_wrong": wrong.get("weft:interpreted"),
                "peers_wrong": {k: v for k, v in wrong.items() if not k.startswith("weft")},
                "peers_refused": refused,
                "plan": plan.name + mode.suffix if plan is not None else None,  # as weft bench names it
                "median_us": med,
                "raw_us": raw,
            }
        )
        if rank == 0:
            print(
                f"tokens {tokens}: "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(med.items(), key=lambda kv: kv[1]))
                + f" µs; wrong {wrong}",
                flush=True,
            )
            write(rows)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no teardown: it outlived the device call once (FlashInfer's and weft's IPC buffers, NCCL)


if __name__ == "__main__":
    main()
