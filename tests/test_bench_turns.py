"""executor.gpu.bench.turns: the order in which implementations take turns in each round of timing (the all-reduce
bench, bench/norm_peers.py, examples/tp_decode.py), a Williams design."""

from __future__ import annotations

import doctest
from collections import Counter

import pytest

from executor.gpu import bench
from executor.gpu.bench import turns

DECODE = ["flashinfer-fused", "nccl", "weft", "weft-fused", "weft-fused-norm"]


@pytest.mark.parametrize(
    "names,rounds,times",
    [(DECODE, 20, 4), (DECODE[1:], 4, 1), (["nccl", "weft"], 6, 3), ([f"weft:{k}" for k in range(30)], 30, 1)],
)
def test_each_takes_every_place_and_follows_every_other_equally_often(names, rounds, times):
    """Over a whole design (len(names) rounds, twice that for an odd count) every implementation is first, second,
    ... equally often and follows each other one equally often: with one fixed order one implementation always came
    first after another kind of graph and each other one always after the same neighbour."""
    orders = [turns(names, i) for i in range(rounds)]
    assert all(sorted(o) == sorted(names) for o in orders)
    places = Counter((name, o.index(name)) for o in orders for name in o)
    pairs = Counter((o[k - 1], o[k]) for o in orders for k in range(1, len(o)))
    assert set(places.values()) == {times} and len(places) == len(names) ** 2
    assert set(pairs.values()) == {times} and len(pairs) == len(names) * (len(names) - 1)


def test_one_or_no_implementation_is_its_own_order_and_the_example_holds():
    assert turns([], 3) == [] and turns(["nccl"], 3) == ["nccl"]
    assert doctest.testmod(bench).attempted >= 1 and doctest.testmod(bench).failed == 0
