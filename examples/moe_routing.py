"""The index math of an expert-parallel MoE layer (GShard/Tutel style), on numpy arrays or torch tensors alike.

A rank holds ``tokens`` rows of ``hidden``. The router picks each token's top-2 of E experts with softmax gates
over the two. Every expert takes at most ``capacity`` tokens from each rank: first choices claim places before
second choices (GShard's priority), in token order, and a claim past the capacity is dropped (the token keeps its
other expert, or passes through as zero). The claims become a fixed-shape dispatch buffer of E × capacity rows
(expert-major), one more row at the end where dropped claims land (the trash row), so the layer has one shape
whatever the routing, as a CUDA graph needs. Experts are numbered rank-major (expert e lives on rank
e // (E / ranks)), so the buffer's first E·capacity rows are exactly ``all_to_all_single``'s input: block j goes to
rank j. After the exchange a rank holds, for each of its experts, capacity rows from every rank
(``expert_major``); their outputs go back by the inverse exchange (``token_major``), and ``combine`` sums each
token's two expert outputs weighted by their gates.

Only operations that numpy and torch share are used (argmax, cumsum, sum, reshape, swapaxes, indexing), plus
``xp.exp`` and ``xp.stack`` from the module passed as ``xp``, so the CPU test runs the same code as the GPU layer.

>>> import numpy as np
>>> logits = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
>>> experts, gates = route(logits, np.arange(3), np)
>>> experts.tolist(), gates.sum(1).round(6).tolist()
([[0, 2], [1, 2]], [1.0, 1.0])
>>> assign(experts, np.arange(3), capacity=1).tolist()  # token 1's second claim on expert 2 comes too late
[[0, 2], [1, 3]]
"""

from __future__ import annotations

import math
from typing import Any

TOP_K = 2
MASK = 1e9  # subtracted from a chosen expert's logit to find the next; router logits are far smaller


def capacity(tokens: int, experts: int, factor: float = 1.0, top_k: int = TOP_K) -> int:
    """Places per expert for each rank's tokens: ceil(top_k · tokens · factor / experts), at least 1.

    >>> capacity(1, 8), capacity(256, 8), capacity(256, 8, factor=1.25)
    (1, 64, 80)
    """
    return max(1, math.ceil(top_k * tokens * factor / experts))


def route(logits: Any, expert_ids: Any, xp: Any) -> tuple[Any, Any]:
    """(experts (T, 2) int, gates (T, 2) float): each token's two highest-scoring experts, and the softmax of
    their two logits. ``expert_ids`` is 0..E-1 as an array of the same kind (and device) as ``logits``."""
    first = logits.argmax(1)
    first_hot = (first[:, None] == expert_ids[None, :]) * 1.0
    second = (logits - MASK * first_hot).argmax(1)
    second_hot = (second[:, None] == expert_ids[None, :]) * 1.0
    gap = (logits * second_hot).sum(1) - (logits * first_hot).sum(1)  # second's logit less first's: <= 0
    top = 1.0 / (1.0 + xp.exp(gap))
    return xp.stack([first, second], 1), xp.stack([top, 1.0 - top], 1)


def assign(experts: Any, expert_ids: Any, capacity: int) -> Any:
    """Each claim's row in the dispatch buffer, (T, 2): expert · capacity + its place among the expert's claims,
    or E · capacity (the trash row) where the expert is full. First choices claim before second choices."""
    tokens, k = experts.shape
    trash = expert_ids.shape[0] * capacity
    claims = experts.T.reshape(-1)  # choice-major: every token's first choice, then every second choice
    hot = (claims[:, None] == expert_ids[None, :]) * 1
    place = ((hot.cumsum(0) - hot) * hot).sum(1)  # earlier claims on the same expert
    fits = (place < capacity) * 1
    rows = (claims * capacity + place) * fits + trash * (1 - fits)
    return rows.reshape(k, tokens).T


def kept(rows: Any, experts: int, capacity: int) -> Any:
    """1 where a claim got a place, 0 where it was dropped (its row is the trash row)."""
    return (rows < experts * capacity) * 1


def dispatch(buffer: Any, x: Any, rows: Any) -> None:
    """Write each token into its claimed rows of ``buffer`` ((E · capacity + 1) × hidden); unclaimed rows are 0."""
    buffer[...] = 0
    for choice in range(rows.shape[1]):
        buffer[rows[:, choice]] = x


def expert_major(received: Any, ranks: int, local_experts: int, capacity: int) -> Any:
    """The all-to-all's output (ranks · local_experts · capacity rows, rank-major) as (local_experts,
    ranks · capacity, hidden): each local expert's rows from every rank, as one batch."""
    hidden = received.shape[-1]
    return (
        received.reshape(ranks, local_experts, capacity, hidden)
        .swapaxes(0, 1)
        .reshape(local_experts, ranks * capacity, hidden)
    )


def token_major(outputs: Any, ranks: int, capacity: int) -> Any:
    """The inverse of ``expert_major``: rank-major rows, the second all-to-all's input (a new contiguous array)."""
    local_experts, _, hidden = outputs.shape
    return outputs.reshape(local_experts, ranks, capacity, hidden).swapaxes(0, 1).reshape(-1, hidden)


def combine(returned: Any, rows: Any, gates: Any, experts: int, capacity: int) -> Any:
    """Each token's output: its kept experts' outputs (rows of ``returned``, (E · capacity + 1) × hidden) weighted
    by their gates; a dropped claim adds nothing."""
    weights = gates * kept(rows, experts, capacity)
    out = returned[rows[:, 0]] * weights[:, 0:1]
    for choice in range(1, rows.shape[1]):
        out = out + returned[rows[:, choice]] * weights[:, choice : choice + 1]
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The same layer in fewer kernels (torch only), nearer what a production MoE layer's routing costs. Under a CUDA graph
# each small kernel still costs a few microseconds: with the shared code above the layer runs 54 kernels at 4 tokens
# (route 21, assign 14, combine 8, dispatch 3), with these 28 (counted with a torch dispatch mode, views left out).
# Same claims and rows; tests/test_moe_routing.py checks them against the shared code.


def route_topk(logits: Any) -> tuple[Any, Any]:
    """``route`` in two kernels: torch's top-2 and the softmax of the two logits (the gates may differ from
    ``route``'s in the last bit: 1 / (1 + exp(gap)) against a softmax)."""
    top, experts = logits.topk(TOP_K, dim=1)
    return experts, top.softmax(1)


def assign_onehot(experts: Any, count: int, capacity: int) -> Any:
    """``assign`` with each claim's place read from a one-hot running count (torch; no host sync, as a CUDA graph
    capture needs: F.one_hot reads its input's range back to the host)."""
    import torch

    tokens, k = experts.shape
    claims = experts.T.reshape(-1)
    hot = torch.zeros(claims.shape[0], count, dtype=claims.dtype, device=claims.device).scatter_(1, claims[:, None], 1)
    place = (hot.cumsum(0) - hot).gather(1, claims[:, None])[:, 0]
    rows = (claims * capacity + place).masked_fill(place >= capacity, count * capacity)
    return rows.reshape(k, tokens).T


def dispatch_once(buffer: Any, x: Any, rows: Any) -> None:
    """``dispatch`` with every claim written by one indexed copy (torch; the trash row may take several)."""
    buffer.zero_()
    buffer[rows.T.reshape(-1)] = x.repeat(rows.shape[1], 1)


def combine_gather(returned: Any, rows: Any, gates: Any, experts: int, capacity: int) -> Any:
    """``combine`` as one gather and one weighted sum (torch; the trash row of ``returned`` must be zero, as the
    layer keeps it)."""
    weights = gates.masked_fill(rows >= experts * capacity, 0.0)
    return (returned[rows] * weights[..., None]).sum(1)
