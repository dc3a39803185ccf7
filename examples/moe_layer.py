"""An expert-parallel mixture-of-experts decode layer, with NCCL's or weft's all-to-all, under CUDA graphs.

Each rank holds ``--tokens`` tokens of hidden 4096 (bf16) and E / EP of the E experts (a SwiGLU MLP each,
hidden -> ``--ffn`` -> hidden). The layer, as Tutel and GShard run it: a router (replicated, fp32) picks each token's
top-2 experts with softmax gates over the two; each expert takes at most ``capacity`` tokens per rank
(ceil(2 · tokens · factor / E), first choices before second); the claims fill a fixed-shape dispatch buffer; one
all-to-all sends each rank its experts' rows (dispatch); the experts run as one batched matmul per weight; a second
all-to-all brings the outputs back (combine); each token sums its two outputs by their gates. The index math is
examples/moe_routing.py (tested on the CPU against a dense layer: tests/test_moe_routing.py).

The backends run in the same job, on the same weights and tokens, and take turns replay by replay: NCCL
(``dist.all_to_all_single``) and weft (``comm.all_to_all_single``, captured inside ``comm.capture``, so its plans
read and write the captured tensors). For each token count the script reports the layer's latency, tokens/s (all
ranks' tokens over the layer time), and the all-to-all share (a graph of the two exchanges alone, on the same
buffers, over the layer's time), and checks that the outputs agree: both backends move the same bytes and the
experts then run the same kernels on the same rows, so they must be bit-identical; a row fails (``agree`` false)
past max |weft - nccl| > 1e-2 · max |nccl| (``BOUND``), and ``bitwise`` says whether they were identical.

    WEFT_REGISTRY=REG WEFT_TOPOLOGY=hgx_h200:gpus=4 torchrun --nproc-per-node 4 examples/moe_layer.py \
        --tokens 1,2,4,8,16,32,64,128,256 [--layers 8] --json bench/results/moe_layer_4xh200.json

``--layers N`` captures N layers in a row in each graph and reports times per layer: the ranks' launch skew, which
the first all-to-all of a replay absorbs, then weighs once per N layers, as in a model. ``--routing lean`` runs the
layer in 28 kernels instead of 54 (moe_routing's torch-only functions: top-k, a one-hot running count, one indexed
copy, one gather), nearer a production layer's fused routing; the same claims and rows.
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


Exchange = Callable[[torch.Tensor, torch.Tensor], None]  # all_to_all_single(output, input)


class Layer:
    """One MoE layer at one token count: its weights, its fixed buffers, and ``forward(x, exchange)``."""

    def __init__(self, shape: Shape, weights: tuple[torch.Tensor, ...], device, lean: bool = False):
        """``lean``: the routing in fewer kernels (moe_routing's torch-only functions), as a production layer runs
        it; the same claims and rows (the gates may differ in the last bit)."""
        self.shape, self.lean = shape, lean
        self.router, self.gate_up, self.down = weights
        self.ids = torch.arange(shape.experts, device=device)
        self.send = torch.zeros(shape.rows + 1, HIDDEN, device=device, dtype=torch.bfloat16)  # + the trash row
        self.received = torch.zeros(shape.rows, HIDDEN, device=device, dtype=torch.bfloat16)
        self.returned = torch.zeros(shape.rows + 1, HIDDEN, device=device, dtype=torch.bfloat16)  # trash row: 0
        self.outputs = torch.zeros(shape.rows, HIDDEN, device=device, dtype=torch.bfloat16)  # the exchanges alone

    def forward(self, x: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        s = self.shape
        logits = x.float() @ self.router
        if self.lean:
            experts, gates = moe.route_topk(logits)
            rows = moe.assign_onehot(experts, s.experts, s.capacity)
            moe.dispatch_once(self.send, x, rows)
        else:
            experts, gates = moe.route(logits, self.ids, torch)
            rows = moe.assign(experts, self.ids, s.capacity)
            moe.dispatch(self.send, x, rows)
        exchange(self.received, self.send[: s.rows])
        batch = moe.expert_major(self.received, s.ranks, s.local, s.capacity)
        gate, up = torch.bmm(batch, self.gate_up).chunk(2, dim=-1)
        done = torch.bmm(F.silu(gate) * up, self.down)
        exchange(self.returned[: s.rows], moe.token_major(done, s.ranks, s.capacity))
        combine = moe.combine_gather if self.lean else moe.combine
        return combine(self.returned, rows, gates, s.experts, s.capacity).to(x.dtype)

    def exchanges(self, exchange: Exchange) -> None:
        """The layer's two all-to-alls alone, on buffers of the same sizes."""
        exchange(self.received, self.send[: self.shape.rows])
        exchange(self.outputs, self.received)


@dataclass(frozen=True)
class Backend:
    exchange: Exchange
    capture: Callable[[Shape], contextlib.AbstractContextManager]  # around each graph's warm-up and capture


def nccl_backend() -> Backend:
    return Backend(lambda out, inp: dist.all_to_all_single(out, inp), lambda shape: contextlib.nullcontext())


def local_backend() -> Backend:
    """The exchanges as local copies of the same bytes: the layer's time without communication (``--local``), so
    that each backend's layer time less this one is what its exchanges cost inside the layer."""
    return Backend(lambda out, inp: out.copy_(inp), lambda shape: contextlib.nullcontext())


def weft_backend(comm) -> Backend:
    return Backend(comm.all_to_all_single, lambda shape: comm.capture(alltoall_sizes=[shape.alltoall_bytes]))


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
    graphs, results, made = {}, {}, {}
    side = torch.cuda.Stream()
    for name, impl in backends.items():
        layer = made[name] = Layer(shape, weights, device, lean)
        out: dict[str, Any] = {}

        def forward(layer=layer, out=out, impl=impl):
            y = x
            for _ in range(layers):
                y = layer.forward(y, impl.exchange)
            out["y"] = y

        def exchanges(layer=layer, impl=impl):
            for _ in range(layers):
                layer.exchanges(impl.exchange)

        def capture(impl=impl):
            return impl.capture(shape)

        graphs[name] = {
            "layer": graph_of(forward, side, capture),
            "alltoall": graph_of(exchanges, side, capture),
        }
        results[name] = out
    times: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in g} for name, g in graphs.items()}
    for _ in range(iters):
        for kind in ("layer", "alltoall"):
            for name, g in graphs.items():
                times[name][kind].append(time_replay(g[kind]))
    kernels = {name: profile_step(g["layer"], profile) for name, g in graphs.items()} if profile else {}
    for g in graphs.values():
        g["layer"].replay()
    torch.cuda.synchronize()
    row: dict[str, Any] = {
        "tokens": shape.tokens,
        "ep": shape.ranks,
        "experts": shape.experts,
        "capacity": shape.capacity,
        "alltoall_bytes": shape.alltoall_bytes,
        "layers": layers,
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
    if "nccl" in results and "weft" in results:
        ref, got = results["nccl"]["y"].float(), results["weft"]["y"].float()
        diff = (got - ref).abs().max().item()
        scale = max(ref.abs().max().item(), 1e-30)
        verdicts = exchange_plain([diff <= BOUND * scale, bool(torch.equal(got, ref)), diff])
        row.update(
            {
                "speedup": row["nccl_ms"] / row["weft_ms"],
                "agree": all(v[0] for v in verdicts),
                "bitwise": all(v[1] for v in verdicts),
                "max_abs_diff": max(v[2] for v in verdicts),
            }
        )
    return row


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
    p.add_argument("--backend", choices=("nccl", "weft", "both"), default="both")
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
    backends, comm = {}, None
    if args.backend in ("nccl", "both"):
        backends["nccl"] = nccl_backend()
    if args.backend in ("weft", "both"):
        from executor import Communicator

        comm = Communicator.from_process_group(programmatic=args.no_pdl != "weft", late_trigger=args.weft_late_trigger)
        backends["weft"] = weft_backend(comm)
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
            row["weft_plan"] = plan.name if plan is not None else "nccl (no plan)"
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
