"""An expert-parallel mixture-of-experts decode layer over NCCL's or weft's exchange, under CUDA graphs.

Each rank holds ``--tokens`` tokens of hidden 4096 (bf16) and E / EP of the E experts (a SwiGLU MLP each,
hidden -> ``--ffn`` -> hidden). The layer, as Tutel and GShard run it: a router (replicated, fp32) picks each token's
top-2 experts with softmax gates over the two; each expert takes at most ``capacity`` tokens per rank
(ceil(2 · tokens · factor / E), first choices before second); dispatch sends each rank its experts' rows; the experts
run as one batched matmul per weight; combine brings the outputs back and sums each token's two by their gates. The
index math is examples/moe_routing.py (tested on the CPU against a dense layer: tests/test_moe_routing.py); dispatch
and combine are an expert exchange (``executor.inference.experts``).

The backends (``--backend``) run in the same job, on the same weights and tokens, and take turns replay by replay:
- ``nccl``: the claims fill a fixed-shape dispatch buffer, ``dist.all_to_all_single`` exchanges it, the rows are
  reordered expert-major; on the way back reordered rank-major, exchanged, and summed by torch (``PlainExperts``);
- ``weft``: ``comm.expert_exchange``, on one host one kernel each way that reads and writes the layer's own rows
  (no dispatch buffer, no reordering copies, the weighted sum inside combine; DeepEP's shape);
- ``weft_a2a``: the ``nccl`` backend's layer around weft's ``comm.all_to_all_single`` (captured inside
  ``comm.capture``, so its plans read and write the captured tensors).
For each token count the script reports the layer's latency, tokens/s (all ranks' tokens over the layer time), and
the exchange share (a graph of the exchanges alone over the layer's time: the two all-to-alls for ``nccl`` and
``weft_a2a``, dispatch and combine for ``weft``, which do the reordering and the sum too), and checks that the
outputs agree with NCCL's: the backends move the same rows and the experts then run the same kernels on them, so
they must be bit-identical; a row fails (``agree`` false) past max |weft - nccl| > 1e-2 · max |nccl| (``BOUND``),
and ``bitwise`` says whether they were identical (``a2a_*`` for ``weft_a2a``).

    WEFT_REGISTRY=REG WEFT_TOPOLOGY=hgx_h200:gpus=4 torchrun --nproc-per-node 4 examples/moe_layer.py \
        --tokens 1,2,4,8,16,32,64,128,256 [--layers 8] --json bench/results/moe_layer_4xh200.json

``--layers N`` captures N layers in a row in each graph and reports times per layer: the ranks' launch skew, which
the first exchange of a replay absorbs, then weighs once per N layers, as in a model. ``--routing lean`` routes in
fewer kernels (moe_routing's torch-only functions: top-k, a one-hot running count), nearer a production layer's
fused routing; the same claims and rows.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.gpu.experts import ExpertLayout
from executor.inference.experts import Experts, PlainExperts

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_routing as moe  # noqa: E402
from tp_decode import graph_of, profile_step, time_replay  # noqa: E402  (the same graphs and timing as the decode step)

HIDDEN = 4096
BOUND = 1e-2  # max |weft - nccl| / max |nccl| over the layer's output; the expected difference is 0


@dataclass(frozen=True)
class Shape:
    ranks: int
    experts: int
    ffn: int
    tokens: int
    factor: float

    @property
    def local(self) -> int:
        return self.experts // self.ranks

    @property
    def capacity(self) -> int:
        return moe.capacity(self.tokens, self.experts, self.factor)

    @property
    def rows(self) -> int:
        """Rows of the dispatch buffer that the all-to-all moves (E · capacity)."""
        return self.experts * self.capacity

    @property
    def alltoall_bytes(self) -> int:
        return self.rows * HIDDEN * 2


def make_weights(experts: int, ffn: int, rank: int, local: int, device) -> tuple[torch.Tensor, ...]:
    """(router (HIDDEN, E) fp32, the same on every rank; this rank's experts' gate_up (local, H, 2F) and down
    (local, F, H), each expert seeded by its global number)."""
    router = torch.randn(HIDDEN, experts, generator=torch.Generator(device=device).manual_seed(11), device=device)
    gate_up, down = [], []
    for e in range(rank * local, (rank + 1) * local):
        gen = torch.Generator(device=device).manual_seed(1000 + e)
        gate_up.append(torch.randn(HIDDEN, 2 * ffn, generator=gen, device=device) * HIDDEN**-0.5)
        down.append(torch.randn(ffn, HIDDEN, generator=gen, device=device) * ffn**-0.5)
    return (router * HIDDEN**-0.5, torch.stack(gate_up).to(torch.bfloat16), torch.stack(down).to(torch.bfloat16))


Exchange = Callable[[torch.Tensor, torch.Tensor], object]  # all_to_all_single(output, input); its result unused


class Layer:
    """One MoE layer at one token count: its weights and ``forward(x, experts)`` over an expert exchange
    (``executor.inference.experts``: dispatch, then the experts, then combine)."""

    def __init__(self, shape: Shape, weights: tuple[torch.Tensor, ...], device, lean: bool = False):
        """``lean``: the routing in fewer kernels (moe_routing's torch-only functions), as a production layer runs
        it; the same claims and rows (the gates may differ in the last bit)."""
        self.shape, self.lean = shape, lean
        self.router, self.gate_up, self.down = weights
        self.ids = torch.arange(shape.experts, device=device)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, gates): each claim's dispatch row (int64) and gate (fp32), (tokens, 2)."""
        s = self.shape
        logits = x.float() @ self.router
        if self.lean:
            experts, gates = moe.route_topk(logits)
            return moe.assign_onehot(experts, s.experts, s.capacity), gates
        experts, gates = moe.route(logits, self.ids, torch)
        return moe.assign(experts, self.ids, s.capacity), gates

    def forward(self, x: torch.Tensor, experts: Experts) -> torch.Tensor:
        rows, gates = self.route(x)
        batch = experts.dispatch(x, rows)  # (local experts, ranks * capacity, hidden)
        gate, up = torch.bmm(batch, self.gate_up).chunk(2, dim=-1)
        done = torch.bmm(F.silu(gate) * up, self.down)
        return experts.combine(done, rows, gates)


@dataclass(frozen=True)
class Backend:
    """How one backend makes a token count's expert exchange, what its graphs' capture needs, and its all-to-all
    alone (None where the exchange is fused: its exchanges alone are dispatch and combine)."""

    experts: Callable[[Shape], Experts]
    capture: Callable[[Shape], contextlib.AbstractContextManager]
    all_to_all: Exchange | None = None


def layout(shape: Shape) -> ExpertLayout:
    return ExpertLayout(shape.ranks, shape.experts, shape.capacity, shape.tokens, HIDDEN, "bf16", moe.TOP_K)


def plain_backend(all_to_all: Exchange, capture=lambda shape: contextlib.nullcontext()) -> Backend:
    """The layer around an all-to-all (``PlainExperts``: a dispatch buffer, the exchange, the reordering copies and
    torch's weighted sum), as GShard and Tutel run it."""

    def experts(shape: Shape) -> Experts:
        return PlainExperts(layout(shape), all_to_all, torch.device("cuda", torch.cuda.current_device()))

    return Backend(experts, capture, all_to_all)


def nccl_backend() -> Backend:
    return plain_backend(lambda out, inp: dist.all_to_all_single(out, inp))


def local_backend() -> Backend:
    """The exchanges as local copies of the same bytes: the layer's time without communication
    (``--exchange-copies``), so that each backend's layer time less this one is what its exchanges cost inside the
    layer."""
    return plain_backend(lambda out, inp: out.copy_(inp))


def weft_a2a_backend(comm) -> Backend:
    """The layer around weft's ``all_to_all_single`` (the registry's plans; zero-copy inside ``comm.capture``)."""
    return plain_backend(comm.all_to_all_single, lambda shape: comm.capture(alltoall_sizes=[shape.alltoall_bytes]))


def weft_backend(comm) -> Backend:
    """weft's expert exchange (``comm.expert_exchange``): one kernel each way on one host."""

    def experts(shape: Shape) -> Experts:
        return comm.expert_exchange(shape.tokens, shape.experts, shape.capacity, HIDDEN, torch.bfloat16, moe.TOP_K)

    return Backend(experts, lambda shape: contextlib.nullcontext())


def run_tokens(
    shape: Shape,
    weights,
    backends: dict[str, Backend],
    iters: int,
    device,
    layers: int = 1,
    lean: bool = False,
    profile: int = 0,
) -> dict:
    """One row: every backend's layer and exchanges as graphs, timed taking turns, and the outputs compared.

    ``layers``: each graph runs the layer that many times in a row (each layer's output the next one's input, on the
    same weights and buffers), and times are per layer. With one, each replay's time holds the ranks' launch skew,
    which the first all-to-all absorbs; with several, the later layers run as a model's do, the ranks already in
    step (tp_decode's graphs hold a step's 2 x layers calls for the same reason).

    ``profile``: after the timing, that many replays of each backend's layer graph under torch's profiler
    (``layer_kernels``: device µs per replay by kernel family, and the top kernels; divide by ``layers``)."""
    x = torch.randn(
        shape.tokens, HIDDEN, generator=torch.Generator(device=device).manual_seed(7 + dist.get_rank()), device=device
    ).to(torch.bfloat16)
    layer = Layer(shape, weights, device, lean)
    claims = layer.route(x)  # the exchanges alone run on the first layer's claims
    graphs, results, paths = {}, {}, {}
    side = torch.cuda.Stream()
    for name, impl in backends.items():
        experts = impl.experts(shape)  # collective: every rank makes each backend's in the same order
        paths[name] = getattr(experts, "path", "")
        graphs[name], out = backend_graphs(impl, experts, shape, layer, x, claims, layers, side)
        results[name] = (out, experts)
    times: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in g} for name, g in graphs.items()}
    for _ in range(iters):
        for kind in ("layer", "alltoall"):
            for name, g in graphs.items():
                times[name][kind].append(time_replay(g[kind]))
    kernels = {name: profile_step(g["layer"], profile) for name, g in graphs.items()} if profile else {}
    for g in graphs.values():
        g["layer"].replay()
    torch.cuda.synchronize()
    for _, experts in results.values():
        experts.check()  # a fused exchange's wait that timed out raises here
    row: dict[str, Any] = {
        "tokens": shape.tokens,
        "ep": shape.ranks,
        "experts": shape.experts,
        "capacity": shape.capacity,
        "alltoall_bytes": shape.alltoall_bytes,
        "layers": layers,
        "paths": paths,
        **({"layer_kernels": kernels} if kernels else {}),
    }
    for name in graphs:
        layer_ms = statistics.median(times[name]["layer"]) / layers
        a2a_ms = statistics.median(times[name]["alltoall"]) / layers
        row.update(
            {
                f"{name}_ms": layer_ms,
                f"{name}_alltoall_ms": a2a_ms,
                f"{name}_alltoall_share": a2a_ms / layer_ms,
                f"{name}_tokens_per_s": shape.tokens * shape.ranks / layer_ms * 1e3,
                f"{name}_raw_ms": times[name]["layer"],
                f"{name}_raw_alltoall_ms": times[name]["alltoall"],
            }
        )
    for name, prefix in (("weft", ""), ("weft_a2a", "a2a_")):  # weft's layer (and around its all-to-all) vs NCCL's
        if "nccl" in results and name in results:
            row.update(agreement(results["nccl"][0]["y"], results[name][0]["y"], prefix))
            row[f"{prefix}speedup"] = row["nccl_ms"] / row[f"{name}_ms"]
    return row


def backend_graphs(
    impl: Backend, experts: Experts, shape: Shape, layer: Layer, x: torch.Tensor, claims, layers: int, side
) -> tuple[dict[str, torch.cuda.CUDAGraph], dict[str, Any]]:
    """One backend's graphs (``layer``: ``layers`` layers in a row; ``alltoall``: its exchanges alone, on the first
    layer's ``claims``) and where the layer graph leaves its output (``["y"]``)."""
    out: dict[str, Any] = {}
    if impl.all_to_all is not None:  # the two all-to-alls alone run on buffers of the layer's size
        sent = torch.randn(shape.rows, HIDDEN, device=x.device).to(torch.bfloat16)
        received = torch.empty_like(sent)

    def forward():
        y = x
        for _ in range(layers):
            y = layer.forward(y, experts)
        out["y"] = y

    def exchanges():
        rows, gates = claims
        for _ in range(layers):
            if impl.all_to_all is None:  # fused: dispatch and combine alone
                experts.combine(experts.dispatch(x, rows), rows, gates)
            else:  # the two all-to-alls alone, on buffers of the layer's size
                impl.all_to_all(received, sent)
                impl.all_to_all(sent, received)

    def capture():
        return impl.capture(shape)

    return {"layer": graph_of(forward, side, capture), "alltoall": graph_of(exchanges, side, capture)}, out


def agreement(reference: torch.Tensor, output: torch.Tensor, prefix: str = "") -> dict:
    """Whether ``output`` agrees with ``reference`` on every rank (``BOUND``), bit for bit, and the largest
    difference (collective)."""
    ref, got = reference.float(), output.float()
    diff = (got - ref).abs().max().item()
    scale = max(ref.abs().max().item(), 1e-30)
    verdicts = exchange_plain([diff <= BOUND * scale, bool(torch.equal(got, ref)), diff])
    return {
        f"{prefix}agree": all(v[0] for v in verdicts),
        f"{prefix}bitwise": all(v[1] for v in verdicts),
        f"{prefix}max_abs_diff": max(v[2] for v in verdicts),
    }


def exchange_plain(value) -> list:
    """``value`` from every rank (plain JSON through the process group's store, never a pickle)."""
    from executor.gpu.bootstrap import all_gather_plain

    return all_gather_plain(value, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256", help="tokens per rank, comma-separated")
    p.add_argument("--experts", type=int, default=8, help="experts in all (a multiple of the EP ranks)")
    p.add_argument("--ffn", type=int, default=1408, help="each expert's intermediate size")
    p.add_argument("--capacity-factor", type=float, default=1.0, help="places per expert: ceil(2·tokens·f / E)")
    p.add_argument("--iters", type=int, default=50, help="timed replays per graph and backend")
    p.add_argument(
        "--backend",
        default="nccl,weft,weft_a2a",
        help="comma-separated, taking turns in one job: nccl (around dist.all_to_all_single), weft "
        "(comm.expert_exchange: fused dispatch and combine on one host), weft_a2a (around comm.all_to_all_single)",
    )
    p.add_argument("--layers", type=int, default=1, help="layers in a row in each graph; times are per layer")
    p.add_argument(
        "--exchange-copies",
        action="store_true",
        help="also time the layer with its exchanges as local copies (local_ms: the layer without communication); "
        "not --local, which torchrun takes for its own --local-* options",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timing, N replays of each backend's layer graph under torch's profiler: device time per "
        "layer by kernel family and the top kernels (layer_kernels in the JSON; as tp_decode.py's --profile)",
    )
    p.add_argument(
        "--routing", choices=("shared", "lean"), default="shared", help="lean: the routing in fewer kernels (torch)"
    )
    p.add_argument(
        "--no-pdl",
        choices=("weft",),
        default="",
        help="weft: its kernels launch without programmatic dependent launch (as tp_decode.py's --no-pdl)",
    )
    p.add_argument(
        "--weft-late-trigger",
        action="store_true",
        help="weft's compiled kernels let the next programmatic launch start at their end, not their start",
    )
    p.add_argument("--json", help="results file (rank 0; default bench/results/moe_layer_<EP>x<gpu>.json)")
    args = p.parse_args()

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    if args.layers < 1:
        raise SystemExit(f"moe_layer: --layers {args.layers}: at least 1")
    if args.experts % world:
        raise SystemExit(f"moe_layer: --experts {args.experts} must be a multiple of the {world} EP ranks")
    weights = make_weights(args.experts, args.ffn, rank, args.experts // world, device)
    names = args.backend.split(",")
    unknown = sorted(set(names) - {"nccl", "weft", "weft_a2a"})
    if unknown:
        raise SystemExit(f"moe_layer: --backend {args.backend}: unknown {', '.join(unknown)}")
    backends, comm = {}, None
    if "nccl" in names:
        backends["nccl"] = nccl_backend()
    if {"weft", "weft_a2a"} & set(names):
        from executor import Communicator

        comm = Communicator.from_process_group(programmatic=args.no_pdl != "weft", late_trigger=args.weft_late_trigger)
        if "weft" in names:
            backends["weft"] = weft_backend(comm)
        if "weft_a2a" in names:
            backends["weft_a2a"] = weft_a2a_backend(comm)
    if args.exchange_copies:
        backends["local"] = local_backend()
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        shape = Shape(world, args.experts, args.ffn, tokens, args.capacity_factor)
        row = run_tokens(
            shape, weights, backends, args.iters, device, args.layers, args.routing == "lean", args.profile
        )
        if comm is not None:
            plan = comm.plan_for("alltoall", shape.alltoall_bytes, torch.bfloat16)
            row["weft_a2a_plan"] = plan.name if plan is not None else "nccl (no plan)"
            row["weft_paths"] = dict(comm.paths)
        rows.append(row)
        if rank == 0:
            print(json.dumps({k: v for k, v in row.items() if "raw" not in k}), flush=True)
    if rank == 0:
        slug = torch.cuda.get_device_name().replace("NVIDIA ", "").replace(" ", "").lower()
        path = Path(args.json or f"bench/results/moe_layer_{world}x{slug}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "kind": "moe_layer",
            "ep": world,
            "hidden": HIDDEN,
            "experts": args.experts,
            "ffn": args.ffn,
            "top_k": moe.TOP_K,
            "capacity_factor": args.capacity_factor,
            "dtype": "bf16",
            "mode": "graph",
            "bound": f"max |weft - nccl| <= {BOUND} * max |nccl| (expected: bit-identical)",
            "machine": {"gpu": torch.cuda.get_device_name(), "gpus": world, "host": platform.node()},
            "versions": {
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "cuda": torch.version.cuda,
                "python": platform.python_version(),
            },
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "iters": args.iters,
            "layers": args.layers,  # per graph; *_ms are per layer, *_raw_ms per replay (of all of them)
            "routing": args.routing,
            "no_pdl": [args.no_pdl] if args.no_pdl else [],  # as tp_decode's JSON names it
            "weft_late_trigger": args.weft_late_trigger,
            "rows": rows,
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written to {path}", flush=True)
    if comm is not None:
        comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
