"""Per-step fabric loads: how many chunks each step puts on each link and each sharing group.

Both ``verify`` (capacity) and ``cost`` (time) need these counts on the topology's switch-free form, which
for a 1024-rank switched fabric has a million links; counting them with numpy over the whole schedule at
once keeps a million-send schedule in seconds where per-send dictionary lookups took half a minute.

Links are indexed by their position in ``FabricIndex.link_keys`` (``src * nranks + dst``, sorted); each
link lists the sharing groups it belongs to in CSR form (``group_ptr``/``group_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from operator import attrgetter
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from topologies.topology import SharingGroup, Topology


class IndexedFabric(Protocol):
    """What a FabricIndex reads of its fabric: a Topology, or a switched one's view of its switch-free form."""

    @property
    def name(self) -> str: ...

    @property
    def nranks(self) -> int: ...

    @property
    def sharing(self) -> tuple[SharingGroup, ...]: ...


@dataclass(frozen=True, eq=False)
class FabricIndex:
    """The switch-free form's links and sharing groups as arrays."""

    topology: IndexedFabric
    link_keys: np.ndarray
    latency: np.ndarray
    capacity: np.ndarray
    group_ptr: np.ndarray
    group_ids: np.ndarray
    group_bandwidth: np.ndarray

    @property
    def nlinks(self) -> int:
        return len(self.link_keys)

    @property
    def unit_bandwidth(self) -> float:
        """The smallest link or sharing-group capacity (``Topology.unit_bandwidth`` of the switch-free form)."""
        caps = np.concatenate([self.capacity, self.group_bandwidth])
        return float(caps.min()) if len(caps) else 1.0

    @property
    def ngroups(self) -> int:
        return len(self.group_bandwidth)

    def has_links(self, src: ArrayLike, dst: ArrayLike) -> np.ndarray:
        """Whether each src->dst is a link (array-likes of ranks)."""
        return self.link_index(np.asarray(src, np.int64), np.asarray(dst, np.int64)) >= 0

    def link_index(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The index of each link src->dst, or -1 where the fabric has no such link."""
        keys = src.astype(np.int64) * self.topology.nranks + dst
        where = np.minimum(np.searchsorted(self.link_keys, keys), max(self.nlinks - 1, 0))
        found = (self.link_keys[where] == keys) if self.nlinks else np.zeros(len(keys), bool)
        return np.where(found, where, -1)


@lru_cache(maxsize=4)
def index_fabric(topology: Topology) -> FabricIndex:
    """Index the topology's switch-free form (from its arrays: no Link object per rank pair is built)."""
    if topology.switches:
        return _index_switched(topology)
    fabric = topology
    n = fabric.nranks
    # one C-level pass over the Link objects; ranks are exact as floats far beyond MAX_RANKS
    table = np.array(list(map(attrgetter("src", "dst", "latency", "bandwidth", "count"), fabric.links)), float).reshape(
        -1, 5
    )
    keys = table[:, 0].astype(np.int64) * n + table[:, 1].astype(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, latency, capacity = keys[order], table[order, 2], table[order, 3] * table[order, 4]
    sizes = np.array([len(g.links) for g in fabric.sharing], np.int64)
    pairs = np.fromiter(
        chain.from_iterable(chain.from_iterable(g.links for g in fabric.sharing)), np.int64, 2 * int(sizes.sum())
    ).reshape(-1, 2)
    member_links = np.searchsorted(keys, pairs[:, 0] * n + pairs[:, 1])
    bandwidth = np.array([g.bandwidth for g in fabric.sharing], float)
    return _indexed(fabric, keys, latency, capacity, member_links, sizes, bandwidth)


def _index_switched(topology: Topology) -> FabricIndex:
    from topologies.switch_free import switch_free_arrays

    form = switch_free_arrays(topology)
    keys = form.src * topology.nranks + form.dst
    order = np.argsort(keys, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return _indexed(
        _SwitchFreeView(topology),
        keys[order],
        form.latency[order],
        (form.bandwidth * form.count)[order],
        rank[form.group_links],
        np.diff(form.group_ptr),
        form.group_bandwidth,
    )


def _indexed(
    fabric: IndexedFabric,
    keys: np.ndarray,
    latency: np.ndarray,
    capacity: np.ndarray,
    member_links: np.ndarray,
    sizes: np.ndarray,
    bandwidth: np.ndarray,
) -> FabricIndex:
    member_groups = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    by_link = np.argsort(member_links, kind="stable")
    group_ptr = np.zeros(len(keys) + 1, np.int64)
    np.cumsum(np.bincount(member_links, minlength=len(keys)), out=group_ptr[1:])
    return FabricIndex(fabric, keys, latency, capacity, group_ptr, member_groups[by_link], bandwidth)


class _SwitchFreeView:
    """What a FabricIndex reads of its fabric (name, nranks, unit bandwidth, sharing groups), with the
    switch-free Topology built only if a sharing group is named in a message."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology
        self.name = topology.name + "~linksharing"
        self.nranks = topology.nranks

    @property
    def sharing(self) -> tuple[SharingGroup, ...]:
        return self._topology.without_switches().sharing


@dataclass(frozen=True, eq=False)
class Loads:
    """Chunk counts: one row per (step, link) and per (step, sharing group) that carries anything."""

    link_step: np.ndarray
    link: np.ndarray
    link_count: np.ndarray
    group_step: np.ndarray
    group: np.ndarray
    group_count: np.ndarray


def count_loads(fabric: FabricIndex, step: np.ndarray, link: np.ndarray) -> Loads:
    """Count the sends per (step, link) and per (step, group); every entry of ``link`` must be a real link."""
    nlinks = max(fabric.nlinks, 1)
    keys, counts = np.unique(step * nlinks + link, return_counts=True)
    link_step, link_u = keys // nlinks, keys % nlinks
    starts = fabric.group_ptr[link_u]
    lengths = fabric.group_ptr[link_u + 1] - starts
    firsts = np.cumsum(lengths) - lengths
    member = np.repeat(starts - firsts, lengths) + np.arange(lengths.sum())
    groups = fabric.group_ids[member]
    ngroups = max(fabric.ngroups, 1)
    group_keys, inverse = np.unique(np.repeat(link_step, lengths) * ngroups + groups, return_inverse=True)
    group_count = np.bincount(inverse, weights=np.repeat(counts, lengths), minlength=len(group_keys))
    return Loads(link_step, link_u, counts, group_keys // ngroups, group_keys % ngroups, group_count.astype(np.int64))
