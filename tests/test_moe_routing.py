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
