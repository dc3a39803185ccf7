"""Topologies: the fabric model, its file format, and the built-in catalog.

The ground floor of weft: imports nothing else of ours.
"""

from __future__ import annotations

from pathlib import Path

from topologies.errors import TopologyError, UnreachableError
from topologies.io import load_topology, parse_topology, save_topology
from topologies.topology import FORMAT, Link, SharingGroup, Topology, Vertex
from weftcore.errors import WeftError

__all__ = [
    "FORMAT",
    "Link",
    "SharingGroup",
    "Topology",
    "Vertex",
    "TopologyError",
    "UnreachableError",
    "WeftError",
    "load_topology",
    "parse_topology",
    "save_topology",
    "resolve",
]


def _is_file(spec: str) -> bool:
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):  # a name too long for a path is a catalog spec, or nothing
        return False


def resolve(spec: str) -> Topology:
    """A topology from a catalog spec (``hgx_h100:nodes=2``) or a file path (``my_fabric.json``)."""
    if spec.endswith(".json") or _is_file(spec):
        return load_topology(spec)
    from topologies.catalog import build

    return build(spec)
