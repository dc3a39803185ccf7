"""The switch-free form as arrays: every rank pair joined through switches, its link and its sharing groups.

``Topology.without_switches`` builds Link and SharingGroup objects from these; verification and the cost
model read the arrays directly, since at 1024 ranks the form has a million links and building a Python
object for each took most of the time. The lowest-latency switch paths come from one scipy Dijkstra over
every source rank at once: a rank is split into a sending and a receiving vertex so that no path relays
through a rank, and each hop adds ``HOP_US`` to its latency so that, of two paths of equal latency, the one
with fewer hops wins (the tie-break the form has always had).

>>> from topologies.catalog import build
>>> form = switch_free_arrays(build("hgx_h100:nodes=2"))
>>> len(form.src), len(form.group_bandwidth)
(240, 64)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from topologies.topology import Link, Topology, Vertex

HOP_US = 1e-9  # far below any latency a fabric states, far above float error at µs scale


@dataclass(frozen=True, eq=False)
class SwitchFreeArrays:
    """Links of the switch-free form (direct rank links first, then switch paths by (src, dst)), and its sharing
    groups in CSR form over those links (``group_ptr``, ``group_links``: link positions, sorted per group)."""

    src: np.ndarray
    dst: np.ndarray
    bandwidth: np.ndarray
    count: np.ndarray
    latency: np.ndarray
    group_ptr: np.ndarray
    group_links: np.ndarray
    group_bandwidth: np.ndarray


def switch_free_arrays(topo: Topology) -> SwitchFreeArrays:
    """The switch-free form of ``topo`` (a Topology with switches) as arrays."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    n, switches = topo.nranks, topo.switches
    index = {s: 2 * n + i for i, s in enumerate(switches)}
    nv = 2 * n + len(switches)

    def out_id(v: Vertex) -> int:
        return v if isinstance(v, int) else index[v]

    def in_id(v: Vertex) -> int:
        return n + v if isinstance(v, int) else index[v]

    links = topo.links
    direct = [i for i, link in enumerate(links) if isinstance(link.src, int) and isinstance(link.dst, int)]
    routed = [i for i, link in enumerate(links) if not (isinstance(link.src, int) and isinstance(link.dst, int))]
    lat = np.array([link.latency for link in links], float)
    cap = np.array([link.bandwidth for link in links], float) * np.array([link.count for link in links], float)
    u = np.array([out_id(links[i].src) for i in routed], np.int64)
    v = np.array([in_id(links[i].dst) for i in routed], np.int64)
    graph = csr_matrix((lat[routed] + HOP_US, (u, v)), shape=(nv, nv))
    _, pred = dijkstra(graph, directed=True, indices=np.arange(n), return_predecessors=True)
    order = np.argsort(u * nv + v)
    edge_keys, edge_link = (u * nv + v)[order], np.array(routed, np.int64)[order]

    # every reachable (src, dst) pair not joined directly, in (src, dst) order
    direct_keys = {(links[i].src, links[i].dst) for i in direct}
    reach = pred[:, n : 2 * n] >= 0
    np.fill_diagonal(reach, False)
    ps, pd = np.nonzero(reach)
    keep = (
        np.fromiter(((a, b) not in direct_keys for a, b in zip(ps.tolist(), pd.tolist(), strict=True)), bool, len(ps))
        if direct_keys
        else np.ones(len(ps), bool)
    )
    ps, pd = ps[keep], pd[keep]
    # walk each pair's path back from its receiving vertex to its source's sending vertex (whose id is the rank)
    node, live, hops = n + pd, np.ones(len(ps), bool), []
    while live.any():
        prev = pred[ps, node].astype(np.int64)
        at = np.minimum(np.searchsorted(edge_keys, prev * nv + node), len(edge_keys) - 1)
        hops.append(np.where(live, edge_link[at], -1))
        node = np.where(live, prev, node)
        live &= prev != ps
    rev = np.column_stack(hops) if hops else np.zeros((len(ps), 0), np.int64)  # no pair routed through switches
    length = (rev >= 0).sum(axis=1)
    rows = np.arange(len(ps))[:, None]
    cols = length[:, None] - 1 - np.arange(rev.shape[1])[None, :]
    fwd = np.where(cols >= 0, rev[rows, np.maximum(cols, 0)], -1)  # the path's links from the source on
    path_latency = np.zeros(len(ps))
    narrowest = np.full(len(ps), np.inf)
    for k in range(fwd.shape[1]):
        valid = fwd[:, k] >= 0
        path_latency = path_latency + np.where(valid, lat[np.maximum(fwd[:, k], 0)], 0.0)
        narrowest = np.minimum(narrowest, np.where(valid, cap[np.maximum(fwd[:, k], 0)], np.inf))

    nd = len(direct)
    src = np.concatenate([np.array([links[i].src for i in direct], np.int64), ps])
    dst = np.concatenate([np.array([links[i].dst for i in direct], np.int64), pd])
    bandwidth = np.concatenate([np.array([links[i].bandwidth for i in direct], float), narrowest])
    count = np.concatenate([np.array([links[i].count for i in direct], np.int64), np.ones(len(ps), np.int64)])
    latency = np.concatenate([lat[direct], path_latency])
    groups = _groups(topo, links, direct, fwd, nd, src, dst, cap)
    return SwitchFreeArrays(src, dst, bandwidth, count, latency, *groups)


def _groups(
    topo: Topology,
    links: Sequence[Link],
    direct: list[int],
    fwd: np.ndarray,
    nd: int,
    src: np.ndarray,
    dst: np.ndarray,
    cap: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sharing groups over form-link positions: the file's groups, then each topology link that several switch
    paths cross (in order of first use), the tightest kept where two cover the same links."""
    n = topo.nranks
    pair, pos = np.nonzero(fwd >= 0)
    used = fwd[pair, pos]
    first = np.lexsort((pos, pair))  # (pair, position) order: the order paths were first walked
    used_sorted, pair_sorted = used[first], pair[first]
    by_link = np.argsort(used_sorted, kind="stable")
    link_of, members = used_sorted[by_link], pair_sorted[by_link] + nd
    starts = np.flatnonzero(np.r_[True, link_of[1:] != link_of[:-1]]) if len(link_of) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(link_of)]
    # candidate groups as (member positions, bandwidth)
    keys = src * n + dst
    candidates = []
    direct_pos = {(links[i].src, links[i].dst): j for j, i in enumerate(direct)}
    link_id = {link.key: i for i, link in enumerate(links)}
    # not strict: with no switch path at all, ``ends`` still holds its closing len(link_of)
    span = {int(link_of[a]): (a, b) for a, b in zip(starts.tolist(), ends.tolist(), strict=False)}
    for g in topo.sharing:
        parts = []
        for key in g.links:
            if key in direct_pos:
                parts.append(np.array([direct_pos[key]], np.int64))
            elif link_id.get(key) in span:
                a, b = span[link_id[key]]
                parts.append(members[a:b])
        if parts:
            candidates.append((np.unique(np.concatenate(parts)), g.bandwidth))
    # switch-side links in order of first use (the first (pair, position) that crosses each)
    order = sorted(span, key=lambda k: by_link[span[k][0]])
    for k in order:
        a, b = span[k]
        if b - a > 1:
            candidates.append((np.sort(members[a:b]), float(cap[k])))
    tightest: dict[bytes, int] = {}
    kept: list[tuple[np.ndarray, float]] = []
    for positions, bandwidth in candidates:
        # a group's links sorted as rank pairs, which is the order of their form positions' keys
        positions = positions[np.argsort(keys[positions], kind="stable")]
        tag = keys[positions].tobytes()
        if tag in tightest:
            i = tightest[tag]
            if bandwidth < kept[i][1]:
                kept[i] = (positions, bandwidth)
            continue
        tightest[tag] = len(kept)
        kept.append((positions, bandwidth))
    sizes = np.array([len(p) for p, _ in kept], np.int64)
    ptr = np.zeros(len(kept) + 1, np.int64)
    np.cumsum(sizes, out=ptr[1:])
    flat = np.concatenate([p for p, _ in kept]) if kept else np.zeros(0, np.int64)
    return ptr, flat, np.array([b for _, b in kept], float)
