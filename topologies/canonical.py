"""The canonical form of a topology, which its fingerprint hashes: the same fabric whatever its switches are called.

Ranks keep their numbers (a plan is per rank), but switches are renamed by structure: the order of the switches
is the one whose written form (links, sharing groups, hosts, with switch ``i`` written as ``i``) sorts first.
Colour refinement (each switch told apart by the ranks and coloured switches it links to) fixes that order at
once on every catalog fabric; switches it cannot tell apart are tried in each order (individualization, as nauty
does), except where two of them are twins (swapping them leaves the fabric unchanged), where one order is enough.
Two fabrics share a form exactly when one is the other with its switches renamed.

Fabrics without switches keep the form (and so the fingerprint) they had before switches were renamed; a fabric
with switches also keeps its older, name-dependent fingerprint (``legacy_bytes``) as an alias, so that plans and
registries recorded under it still serve it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topologies.topology import Topology, Vertex


def _num(x: float) -> float | int:
    """Normalize a number so that 25, 25.0 and 25.0000000001 hash alike."""
    r = round(float(x), 6)
    return int(r) if r == int(r) else r


def _written(topo: Topology, switch: Callable[[str], str | int]) -> bytes:
    """The fabric's content as sorted JSON, each switch written as ``switch(name)``."""

    def vkey(v: Vertex) -> list[int | str]:
        return [0, f"{v:09d}"] if isinstance(v, int) else [1, switch(v)]

    links = sorted(
        [vkey(link.src), vkey(link.dst), _num(link.bandwidth), _num(link.latency), link.count] for link in topo.links
    )
    sharing = sorted([sorted([vkey(s), vkey(d)] for s, d in g.links), _num(g.bandwidth)] for g in topo.sharing)
    switches = sorted(switch(s) for s in topo.switches)
    content = {
        "nranks": topo.nranks,
        "switches": switches,
        "hosts": list(topo.hosts),
        "links": links,
        "sharing": sharing,
    }
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode()


def legacy_bytes(topo: Topology) -> bytes:
    """The form fingerprints hashed before switch names stopped counting (switches by name)."""
    return _written(topo, lambda s: s)


def canonical_bytes(topo: Topology) -> bytes:
    """The fabric's form with switches renamed by structure (see the module docstring)."""
    if not topo.switches:
        return legacy_bytes(topo)
    return min(_written(topo, order.__getitem__) for order in _orders(topo))


# ---- colour refinement --------------------------------------------------------------------------


def _refine(topo: Topology, colour: dict[str, int]) -> dict[str, int]:
    """Split switch colours by what each switch links to, until no colour splits further."""
    while True:
        label = partial(_label, colour)
        signature = {
            s: (
                colour[s],
                tuple(
                    sorted(
                        (">", label(link.dst), _num(link.bandwidth), _num(link.latency), link.count)
                        for link in topo.out_links[s]
                    )
                ),
                tuple(
                    sorted(
                        ("<", label(link.src), _num(link.bandwidth), _num(link.latency), link.count)
                        for link in topo.in_links[s]
                    )
                ),
            )
            for s in colour
        }
        ranked = {sig: i for i, sig in enumerate(sorted(set(signature.values())))}
        refined = {s: ranked[signature[s]] for s in colour}
        if len(ranked) == len(set(colour.values())):
            return refined
        colour = refined


def _label(colour: dict[str, int], v: Vertex) -> tuple[int, int]:
    """A vertex as refinement sees it: a rank by number, a switch by its colour."""
    return (0, v) if isinstance(v, int) else (1, colour[v])


def _orders(topo: Topology) -> list[dict[str, int]]:
    """Every switch order that individualization reaches (switch name -> position), twins tried once."""
    leaves: list[dict[str, int]] = []
    pending = [_refine(topo, {s: 0 for s in topo.switches})]
    while pending:
        colour = pending.pop()
        cells: dict[int, list[str]] = {}
        for s, c in colour.items():
            cells.setdefault(c, []).append(s)
        tied = next((sorted(cells[c]) for c in sorted(cells) if len(cells[c]) > 1), None)
        if tied is None:
            leaves.append(colour)
            continue
        # the candidates must not depend on names: all of the cell, or one where the whole cell is twins
        tries = tied[:1] if all(_twins(topo, tied[0], other) for other in tied[1:]) else tied
        for s in tries:
            split = {v: 2 * c + (c == colour[s] and v != s) for v, c in colour.items()}
            pending.append(_refine(topo, split))
    return leaves


def _twins(topo: Topology, a: str, b: str) -> bool:
    """Whether swapping switches a and b maps the fabric onto itself."""
    swap = {a: b, b: a}

    def moved(v: Vertex) -> Vertex:
        return swap.get(v, v) if isinstance(v, str) else v

    links = {(link.src, link.dst, link.bandwidth, link.latency, link.count) for link in topo.links}
    if {(moved(s), moved(d), bw, lat, n) for s, d, bw, lat, n in links} != links:
        return False
    groups = {(frozenset(g.links), g.bandwidth) for g in topo.sharing}
    return {(frozenset((moved(s), moved(d)) for s, d in k), bw) for k, bw in groups} == groups
