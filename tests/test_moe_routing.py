"""The MoE layer's index math (examples/moe_routing.py) on the CPU: routing, capacity, and dispatch -> expert-parallel
all-to-all -> experts -> all-to-all -> combine reproducing a dense reference, with numpy playing every rank."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import moe_routing as moe  # noqa: E402

HIDDEN, FFN = 16, 24


def _experts(count: int, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(rng.standard_normal((HIDDEN, FFN)) / 4, rng.standard_normal((FFN, HIDDEN)) / 4) for _ in range(count)]


def _mlp(h: np.ndarray, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    up, down = weights
    return np.maximum(h @ up, 0.0) @ down


def _all_to_all(sends: list[np.ndarray]) -> list[np.ndarray]:
    """torch.distributed's equal-split all_to_all_single over every rank's send buffer: block j of rank i's input
    becomes block i of rank j's output."""
    ranks = len(sends)
    blocks = [np.split(s, ranks) for s in sends]
    return [np.concatenate([blocks[i][j] for i in range(ranks)]) for j in range(ranks)]


def _expert_parallel(xs, logits, experts, ranks: int, cap: int) -> list[np.ndarray]:
    """The layer as examples/moe_layer.py runs it, with numpy as every rank and ``_all_to_all`` as the exchange."""
    count, ids = len(experts), np.arange(len(experts))
    local = count // ranks
    routed = [moe.route(lg, ids, np) for lg in logits]
    rows = [moe.assign(e, ids, cap) for e, _ in routed]
    sends = []
    for x, r in zip(xs, rows, strict=True):
        buffer = np.full((count * cap + 1, HIDDEN), np.nan)  # stale values everywhere: dispatch must clear them
        moe.dispatch(buffer, x, r)
        sends.append(buffer[: count * cap])
    outputs = []
    for rank, received in enumerate(_all_to_all(sends)):
        batch = moe.expert_major(received, ranks, local, cap)
        done = np.stack([_mlp(batch[e], experts[rank * local + e]) for e in range(local)])
        outputs.append(moe.token_major(done, ranks, cap))
    results = []
    for back, r, (_, gates) in zip(_all_to_all(outputs), rows, routed, strict=True):
        returned = np.concatenate([back, np.zeros((1, HIDDEN))])
        results.append(moe.combine(returned, r, gates, count, cap))
    return results


def _dense(x, logits, experts, dropped=None) -> np.ndarray:
    """Every token through its two experts, weighted by the softmax of their two logits; ``dropped`` (T, 2) masks
    claims that got no place."""
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        order = np.argsort(-logits[t], kind="stable")[:2]
        gates = np.exp(logits[t, order] - logits[t, order].max())
        gates /= gates.sum()
        for k, e in enumerate(order):
            if dropped is None or not dropped[t, k]:
                out[t] += gates[k] * _mlp(x[t : t + 1], experts[e])[0]
    return out


@pytest.mark.parametrize("ranks, count, tokens", [(2, 8, 1), (2, 8, 13), (4, 8, 32), (4, 16, 5)])
def test_dispatch_all_to_all_combine_reproduces_the_dense_layer(ranks, count, tokens):
    rng = np.random.default_rng(ranks * 100 + tokens)
    experts = _experts(count, rng)
    xs = [rng.standard_normal((tokens, HIDDEN)) for _ in range(ranks)]
    logits = [rng.standard_normal((tokens, count)) for _ in range(ranks)]
    cap = tokens * 2  # room for every claim: nothing is dropped
    for got, x, lg in zip(_expert_parallel(xs, logits, experts, ranks, cap), xs, logits, strict=True):
        np.testing.assert_allclose(got, _dense(x, lg, experts), rtol=1e-10, atol=1e-10)


def test_a_full_expert_drops_later_claims_and_second_choices_first():
    ids = np.arange(4)
    # tokens 0-2 choose expert 0 first; token 3 chooses expert 1 first and expert 0 second
    logits = np.array([[5.0, 4.0, 0.0, 0.0], [5.0, 0.0, 4.0, 0.0], [5.0, 0.0, 0.0, 4.0], [0.0, 5.0, 0.0, 0.0]])
    experts, _ = moe.route(logits, ids, np)
    rows = moe.assign(experts, ids, capacity=2)
    trash = 4 * 2
    assert experts[:, 0].tolist() == [0, 0, 0, 1]
    # expert 0 takes tokens 0 and 1 (first choices, token order); token 2's first claim is dropped
    assert rows[:, 0].tolist() == [0, 1, trash, 2]
    # token 0's second choice (expert 1) queues behind token 3's first choice there; token 3's second choice
    # (expert 0) finds it full
    assert rows[:, 1].tolist() == [3, 4, 6, trash]


def test_dropped_claims_add_nothing_and_match_the_masked_dense_layer():
    rng = np.random.default_rng(7)
    ranks, count, tokens = 2, 4, 12
    experts = _experts(count, rng)
    xs = [rng.standard_normal((tokens, HIDDEN)) for _ in range(ranks)]
    logits = [rng.standard_normal((tokens, count)) * 3 for _ in range(ranks)]
    cap = moe.capacity(tokens, count, factor=0.5)
    ids = np.arange(count)
    for got, x, lg in zip(_expert_parallel(xs, logits, experts, ranks, cap), xs, logits, strict=True):
        dropped = moe.kept(moe.assign(moe.route(lg, ids, np)[0], ids, cap), count, cap) == 0
        assert dropped.any()  # the case under test: some claims found their expert full
        np.testing.assert_allclose(got, _dense(x, lg, experts, dropped), rtol=1e-10, atol=1e-10)


def test_the_dispatch_buffer_is_exactly_the_all_to_all_input():
    """Rank-major experts: the first E·C rows split into `ranks` equal blocks, block j holding rank j's experts."""
    ids, cap, ranks = np.arange(8), 3, 4
    rows = moe.assign(np.array([[7, 0], [2, 5]]), ids, cap)
    assert [r // (cap * 8 // ranks) for r in rows.reshape(-1)] == [3, 0, 1, 2]


# The lean routing (torch only) against the shared code. They need torch, not a GPU: marked gpu so that the GPU
# machines (where torch is) run them with the rest of `pytest -m gpu`.


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, count, cap", [(1, 8, 1), (13, 8, 2), (64, 8, 16), (256, 16, 20)])
def test_the_lean_routing_claims_the_same_rows_and_outputs_as_the_shared_code(tokens, count, cap):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(tokens + count)
    logits, ids = torch.randn(tokens, count, generator=gen), torch.arange(count)
    experts, gates = moe.route(logits, ids, torch)
    lean_experts, lean_gates = moe.route_topk(logits)
    assert torch.equal(lean_experts, experts)
    torch.testing.assert_close(lean_gates, gates, rtol=1e-6, atol=1e-6)
    rows = moe.assign(experts, ids, cap)
    assert torch.equal(moe.assign_onehot(experts, count, cap), rows)  # drops included (cap < claims at 13 and 256)
    x = torch.randn(tokens, HIDDEN, generator=gen)
    shared, lean = (torch.full((count * cap + 1, HIDDEN), float("nan")) for _ in range(2))
    moe.dispatch(shared, x, rows)
    moe.dispatch_once(lean, x, rows)
    assert torch.equal(lean[:-1], shared[:-1])  # the trash row aside: whichever dropped claim landed last
    returned = torch.randn(count * cap + 1, HIDDEN, generator=gen)
    returned[-1] = 0  # as the layer keeps it
    torch.testing.assert_close(
        moe.combine_gather(returned, rows, gates, count, cap), moe.combine(returned, rows, gates, count, cap)
    )


@pytest.mark.gpu
def test_the_layer_runs_lean_without_a_host_sync_and_as_the_shared_code_does():
    torch = pytest.importorskip("torch")
    import moe_layer
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):  # every op the layer runs: none may read a value back to the host
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    cpu = torch.device("cpu")
    shape = moe_layer.Shape(ranks=1, experts=8, ffn=64, tokens=37, factor=1.0)  # capacity 10: some claims drop
    weights = moe_layer.make_weights(8, 64, 0, 8, cpu)
    x = torch.randn(37, moe_layer.HIDDEN, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)

    from executor.inference.experts import PlainExperts

    def experts():  # one rank: the all-to-all is a copy
        return PlainExperts(moe_layer.layout(shape), lambda out, inp: out.copy_(inp), cpu)

    shared = moe_layer.Layer(shape, weights, cpu).forward(x, experts())
    with Ops() as ops:
        lean = moe_layer.Layer(shape, weights, cpu, lean=True).forward(x, experts())
    assert not {"_local_scalar_dense", "item", "nonzero"} & set(ops.names), ops.names
    torch.testing.assert_close(lean.float(), shared.float(), rtol=0, atol=2e-2)
