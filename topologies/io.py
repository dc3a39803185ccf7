"""Reading and writing ``weft.topology/1`` files, with errors that name the file and field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from topologies.errors import TopologyError, UnreachableError
from topologies.topology import FORMAT, Link, SharingGroup, Topology, _is_number
from weftcore.jsonfile import read_json, short_repr, write_text

TOP_LEVEL_FIELDS = frozenset({"format", "name", "description", "nranks", "switches", "hosts", "links", "sharing"})


Fail = Callable[[str, str], TopologyError]  # (field, reason) -> the error naming the file


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file."""
    return parse_topology(read_json(path, "topology", TopologyError), str(path))


def save_topology(topo: Topology, path: str | Path) -> None:
    write_text(path, json.dumps(topo.to_json(), indent=2) + "\n", "topology", TopologyError)


def parse_topology(data: object, source: str) -> Topology:
    """Build a Topology from decoded JSON; every problem names ``source`` and the field."""

    def fail(field: str, reason: str) -> TopologyError:
        return TopologyError(f"topology {source}: {field}: {reason}")

    if not isinstance(data, dict):
        raise fail("(top level)", f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - TOP_LEVEL_FIELDS)
    if unknown:
        raise fail(short_repr(unknown[0]), f"unknown field (a topology has {', '.join(sorted(TOP_LEVEL_FIELDS))})")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise fail("format", f"must be '{FORMAT}', got {short_repr(fmt)}")
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise fail("name", f"must be a string, got {short_repr(name)}")
    nranks = data.get("nranks")
    if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1:
        raise fail("nranks", f"must be a positive integer, got {short_repr(nranks)}")
    switches = _list(data, "switches", fail)
    hosts = _list(data, "hosts", fail)
    raw_links = data.get("links")
    if not isinstance(raw_links, list):
        raise fail("links", "must be a list of links")
    links = tuple(_link(item, i, fail) for i, item in enumerate(raw_links))
    sharing = tuple(_group(item, i, fail) for i, item in enumerate(_list(data, "sharing", fail)))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("description", "must be a string")
    try:
        return Topology(name, nranks, links, tuple(switches), sharing, tuple(hosts), description)
    except TopologyError as e:
        detail = str(e).removeprefix(f"topology {name}: ")  # the name may itself hold ": "
        kind = UnreachableError if isinstance(e, UnreachableError) else TopologyError
        raise kind(f"topology {source}: {detail}") from None


def _list(data: dict[str, Any], key: str, fail: Fail) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise fail(key, f"must be a list, got {type(value).__name__}")
    return value


def _number(item: dict[str, Any], key: str, where: str, fail: Fail, default: float | None = None) -> float:
    value = item.get(key, default)
    if not _is_number(value):
        raise fail(f"{where}.{key}", f"must be a number, got {short_repr(value)}")
    return cast(float, value)  # _is_number checked it


def _link(item: object, i: int, fail: Fail) -> Link:
    where = f"links[{i}]"
    if not isinstance(item, dict):
        raise fail(where, "must be an object with src, dst, bandwidth, latency")
    for key in ("src", "dst"):
        if key not in item:
            raise fail(f"{where}.{key}", "is missing")
    count = item.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool):
        raise fail(f"{where}.count", f"must be a positive integer, got {short_repr(count)}")
    unknown = set(item) - {"src", "dst", "bandwidth", "latency", "count"}
    if unknown:
        raise fail(f"{where}", f"unknown field {short_repr(sorted(unknown)[0])}")
    return Link(
        item["src"],
        item["dst"],
        _number(item, "bandwidth", where, fail),
        _number(item, "latency", where, fail, 0.0),
        count,
    )


def _group(item: object, i: int, fail: Fail) -> SharingGroup:
    where = f"sharing[{i}]"
    if not isinstance(item, dict) or not isinstance(item.get("links"), list):
        raise fail(where, "must be an object with 'links' (a list of [src, dst]) and 'bandwidth'")
    keys = []
    for j, pair in enumerate(item["links"]):
        if not isinstance(pair, list) or len(pair) != 2:
            raise fail(f"{where}.links[{j}]", f"must be [src, dst], got {short_repr(pair)}")
        keys.append((pair[0], pair[1]))
    unknown = set(item) - {"links", "bandwidth"}
    if unknown:
        raise fail(where, f"unknown field {short_repr(sorted(unknown)[0])}")
    return SharingGroup(tuple(keys), _number(item, "bandwidth", where, fail))
