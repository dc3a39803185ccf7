"""The built-in topology catalog: generators with real link figures, and ``build(spec)`` to call them by name.

A spec is a name with optional integer parameters: ``dgx1``, ``ring:n=16``, ``hgx_h200:nodes=2,gpus=4``. A built
topology is named by its spec with the defaults left out, so ``resolve(topology.name)`` builds it again.

>>> build("hgx_h100:nodes=2").nranks
16

Modeling choices (the same for every entry):

- ``bandwidth`` is GB/s per lane per direction and ``count`` the number of lanes (NVLinks, xGMI links), so a
  link's capacity is the fabric's per-direction figure for that pair.
- NVSwitch: one switch vertex per host (``n0.nvswitch``) stands for the whole switch tray. Each GPU has one link
  to it and one back, each carrying all of the GPU's NVLink lanes. The tray is non-blocking, so one vertex loses
  nothing; contention shows on the per-GPU links. ``gpus`` below 8 models a slice of an 8-GPU board (a VM or a
  container with 2 or 4 of its GPUs): the survivors keep their full NVSwitch bandwidth.
- InfiniBand: one switch vertex ``ib`` joins all hosts, standing for a non-blocking fat tree. Single-host
  topologies have no ``ib``.
- NICs: where every GPU has its own NIC (DGX A100, HGX H100/H200, MI300X: rail-optimized, one NIC per GPU), the
  NIC is the GPU<->ib link itself. Where several GPUs share one NIC (NDv2: one per node; DGX-2: one per GPU pair;
  MI250: one per package), the NIC is a pair of vertices, its send side ``n0.nic0.tx`` and its receive side
  ``n0.nic0.rx``: the GPUs reach them over PCIe, and their links to and from ``ib`` are the bottleneck the GPUs
  share. Split in two so that the NIC never relays between two GPUs of its own host.
- Ranks are host-major: rank = host × GPUs per host + local GPU; ``hosts`` maps each rank to its host.
- Latencies (µs) are per hop, so a path's α is the sum over its links. GPU-to-GPU inside a host is 0.3 µs and
  GPU-to-GPU across InfiniBand 2.6 µs: the α that TACCL profiled on NDv2 and DGX-2 ("alpha" and "remote_alpha" in
  microsoft/taccl, taccl/examples/topo/topo-ndv2-1MB.json and topo-dgx2-1MB.json). A switched path splits its α
  over its hops (GPU->NVSwitch->GPU = 0.15 + 0.15).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from topologies.errors import TopologyError
from topologies.topology import Link, Topology, Vertex
from weftcore.jsonfile import short_repr

# α per hop, µs (see the module docstring for the source).
NVLINK_US = 0.3
IB_US = 2.6
PCIE_US = 0.25
# xGMI: no published per-hop α; we assume NVLink's, since both are direct SerDes links between GPU dies.
XGMI_US = NVLINK_US
# Abstract fabrics (ring, torus, ...) use one NVLink 2 lane: 25 GB/s per direction, SCCL's unit link.
UNIT_GBPS = 25.0
# Every parameter's maximum keeps a topology within this many ranks, so a typo cannot build millions of links.
MAX_RANKS = 16384


@dataclass(frozen=True)
class Param:
    """An integer parameter of a catalog entry, with its default and allowed range."""

    name: str
    default: int
    minimum: int
    maximum: int
    help: str


@dataclass(frozen=True)
class Entry:
    """One catalog entry: a generator, its parameters, and what it models."""

    name: str
    generator: Callable[..., Topology]
    params: tuple[Param, ...]
    description: str
    aliases: tuple[str, ...] = ()

    @property
    def default_spec(self) -> str:
        return self.name


# ---- building blocks ----------------------------------------------------------------------------

# A fabric stamps one host's part of a topology: (host, its ranks) -> (links, switch vertices).
Fabric = Callable[[int, range], tuple[list[Link], list[str]]]


def _doc(builder: Callable[..., object]) -> str:
    """A builder's docstring, its catalog description."""
    return builder.__doc__ or ""


def _links(pairs: Iterable[tuple[Vertex, Vertex]], bandwidth: float, latency: float) -> list[Link]:
    """One link per distinct (src, dst); a pair listed k times becomes k bonded lanes."""
    return [Link(s, d, bandwidth, latency, count) for (s, d), count in Counter(pairs).items()]


def _both_ways(a: Vertex, b: Vertex, bandwidth: float, latency: float, count: int = 1) -> list[Link]:
    return [Link(a, b, bandwidth, latency, count), Link(b, a, bandwidth, latency, count)]


def _nvswitch(lane_gbps: float, lanes: int) -> Fabric:
    """A host's NVSwitch tray as one vertex, with every GPU's NVLink lanes to it and back."""

    def fabric(host: int, ranks: range) -> tuple[list[Link], list[str]]:
        if len(ranks) < 2:
            return [], []  # a lone GPU has nobody to talk to over NVLink
        tray = f"n{host}.nvswitch"
        return [link for r in ranks for link in _both_ways(r, tray, lane_gbps, NVLINK_US / 2, lanes)], [tray]

    return fabric


def _direct(lanes: dict[tuple[int, int], int], lane_gbps: float, latency: float) -> Fabric:
    """Direct GPU-GPU links inside a host, ``lanes`` given by local GPU index."""

    def fabric(host: int, ranks: range) -> tuple[list[Link], list[str]]:
        first = ranks.start
        return [
            link for (a, b), n in lanes.items() for link in _both_ways(first + a, first + b, lane_gbps, latency, n)
        ], []

    return fabric


def _rail_nics(nic_gbps: float) -> Fabric:
    """One NIC per GPU, modeled as the GPU<->ib link (GPU->NIC->switch->NIC->GPU is IB_US end to end)."""

    def fabric(host: int, ranks: range) -> tuple[list[Link], list[str]]:
        return [link for r in ranks for link in _both_ways(r, "ib", nic_gbps, IB_US / 2)], []

    return fabric


def _shared_nics(per_nic: int, pcie_gbps: float, nic_gbps: float) -> Fabric:
    """NICs, each shared by ``per_nic`` consecutive GPUs over PCIe, with their send and receive sides as two vertices.

    Two vertices, because a NIC moves data between its host and the wire, never from one local GPU to another:
    one vertex would offer a PCIe shortcut between local GPUs that no collective library takes.
    """

    def fabric(host: int, ranks: range) -> tuple[list[Link], list[str]]:
        links, nics = [], []
        for k, first in enumerate(range(ranks.start, ranks.stop, per_nic)):
            tx, rx = f"n{host}.nic{k}.tx", f"n{host}.nic{k}.rx"
            nics += [tx, rx]
            links += [Link(tx, "ib", nic_gbps, IB_US / 2 - PCIE_US), Link("ib", rx, nic_gbps, IB_US / 2 - PCIE_US)]
            for r in range(first, min(first + per_nic, ranks.stop)):
                links += [Link(r, tx, pcie_gbps, PCIE_US), Link(rx, r, pcie_gbps, PCIE_US)]
        return links, nics

    return fabric


def _combined(*fabrics: Fabric) -> Fabric:
    def fabric(host: int, ranks: range) -> tuple[list[Link], list[str]]:
        links, switches = [], []
        for part in fabrics:
            more_links, more_switches = part(host, ranks)
            links += more_links
            switches += more_switches
        return links, switches

    return fabric


def _multi_host(name: str, description: str, nodes: int, gpus: int, node_fabric: Fabric, uplink: Fabric) -> Topology:
    """Stamp ``node_fabric`` once per host; with several hosts, add each host's ``uplink`` and the ib switch."""
    stamp = _combined(node_fabric, uplink) if nodes > 1 else node_fabric
    links: list[Link] = []
    switches: list[str] = []
    for host in range(nodes):
        more_links, more_switches = stamp(host, range(host * gpus, (host + 1) * gpus))
        links += more_links
        switches += more_switches
    if nodes > 1:
        switches.append("ib")
    hosts = tuple(r // gpus for r in range(nodes * gpus))
    return Topology(name, nodes * gpus, tuple(links), tuple(switches), (), hosts, description)


# ---- abstract fabrics ---------------------------------------------------------------------------


def ring(n: int = 8) -> Topology:
    """A bidirectional ring of n ranks, 25 GB/s per direction per link."""
    name = _checked("ring", n=n)
    pairs = [(r, (r + step) % n) for r in range(n) for step in (1, -1)]
    return Topology(name, n, tuple(_links(pairs, UNIT_GBPS, NVLINK_US)), description=_doc(ring))


def line(n: int = 8) -> Topology:
    """A chain of n ranks (a ring with one link cut), 25 GB/s per direction per link."""
    name = _checked("line", n=n)
    pairs = [p for r in range(n - 1) for p in ((r, r + 1), (r + 1, r))]
    return Topology(name, n, tuple(_links(pairs, UNIT_GBPS, NVLINK_US)), description=_doc(line))


def fully_connected(n: int = 8) -> Topology:
    """n ranks with a direct 25 GB/s link between every ordered pair."""
    name = _checked("fully_connected", n=n)
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    return Topology(name, n, tuple(_links(pairs, UNIT_GBPS, NVLINK_US)), description=_doc(fully_connected))


def switch(n: int = 8) -> Topology:
    """n ranks on one non-blocking switch (hub and spoke), 25 GB/s per rank per direction."""
    name = _checked("switch", n=n)
    links = [link for r in range(n) for link in _both_ways(r, "switch", UNIT_GBPS, NVLINK_US / 2)]
    return Topology(name, n, tuple(links), ("switch",), description=_doc(switch))


def torus2d(x: int = 4, y: int = 4) -> Topology:
    """An x-by-y 2D torus (rank = row × x + column), 25 GB/s per direction per link."""
    name = _checked("torus2d", x=x, y=y)
    pairs = []
    for row in range(y):
        for col in range(x):
            r = row * x + col
            pairs += [(r, row * x + (col + step) % x) for step in (1, -1)]
            pairs += [(r, ((row + step) % y) * x + col) for step in (1, -1)]
    return Topology(name, x * y, tuple(_links(pairs, UNIT_GBPS, NVLINK_US)), description=_doc(torus2d))


def hypercube(d: int = 3) -> Topology:
    """A d-dimensional hypercube of 2^d ranks (rank r links to r xor 2^k), 25 GB/s per direction."""
    name = _checked("hypercube", d=d)
    n = 1 << d
    pairs = [(r, r ^ (1 << k)) for r in range(n) for k in range(d)]
    return Topology(name, n, tuple(_links(pairs, UNIT_GBPS, NVLINK_US)), description=_doc(hypercube))


# ---- NVIDIA systems -----------------------------------------------------------------------------

# DGX-1 hybrid cube-mesh: NVLink lanes between GPU pairs, 2 = NV2, 1 = NV1. This is SCCL's dgx1 matrix
# (msccl-tools, msccl/topologies/nvidia.py) and NVIDIA's DGX-1 V100 system architecture whitepaper (figure 3):
# 0 1 3 2 and 4 5 7 6 are the NV2 chains of the two sockets, 0-4 and 2-6 join them with NV2 too.
DGX1_LANES = {
    (0, 1): 2,
    (0, 2): 1,
    (0, 3): 1,
    (0, 4): 2,
    (1, 2): 1,
    (1, 3): 2,
    (1, 5): 1,
    (2, 3): 2,
    (2, 6): 2,
    (3, 7): 1,
    (4, 5): 2,
    (4, 6): 1,
    (4, 7): 1,
    (5, 6): 1,
    (5, 7): 2,
    (6, 7): 2,
}
# NVLink 2 (V100): 25 GB/s per lane per direction (V100 whitepaper: 6 lanes, 300 GB/s bidirectional in all).
V100_LANE_GBPS = 25.0
# PCIe 3.0 x16: 15.75 GB/s per direction; PCIe 4.0 x16: 31.5 GB/s.
PCIE3_GBPS = 15.75
PCIE4_GBPS = 31.5


def dgx1() -> Topology:
    """NVIDIA DGX-1: 8×V100 in a hybrid cube-mesh, NV2 = 2 lanes, NV1 = 1 lane, 25 GB/s per lane."""
    links, _ = _direct(DGX1_LANES, V100_LANE_GBPS, NVLINK_US)(0, range(8))
    return Topology(_checked("dgx1"), 8, tuple(links), description=_doc(dgx1))


def ndv2(nodes: int = 1) -> Topology:
    """Azure NDv2: a DGX-1 cube-mesh per node and one 12.5 GB/s InfiniBand NIC per node, shared by its 8 GPUs."""
    # One 100 Gb/s EDR InfiniBand NIC per VM (Azure NDv2-series documentation; TACCL section 5), on PCIe 3.0.
    return _multi_host(
        _checked("ndv2", nodes=nodes),
        _doc(ndv2),
        nodes,
        8,
        _direct(DGX1_LANES, V100_LANE_GBPS, NVLINK_US),
        _shared_nics(8, PCIE3_GBPS, 12.5),
    )


def dgx2(nodes: int = 1) -> Topology:
    """NVIDIA DGX-2: 16×V100 on NVSwitch (6 lanes × 25 GB/s per GPU); one 12.5 GB/s NIC per GPU pair."""
    # DGX-2 datasheet: 12 NVSwitches, 6 NVLink 2 lanes per GPU; 8 × 100 Gb/s EDR InfiniBand NICs, each on the
    # PCIe 3.0 switch of a GPU pair.
    return _multi_host(
        _checked("dgx2", nodes=nodes),
        _doc(dgx2),
        nodes,
        16,
        _nvswitch(V100_LANE_GBPS, 6),
        _shared_nics(2, PCIE3_GBPS, 12.5),
    )


def dgx_a100(nodes: int = 1, gpus: int = 8) -> Topology:
    """NVIDIA DGX A100: up to 8×A100 on NVSwitch (300 GB/s per GPU per direction), one 25 GB/s NIC per GPU."""
    # DGX A100 system architecture whitepaper: NVLink 3, 12 lanes × 25 GB/s per GPU per direction; 8 × 200 Gb/s
    # HDR InfiniBand ConnectX-6 NICs for the compute fabric, one per GPU.
    return _multi_host(
        _checked("dgx_a100", nodes=nodes, gpus=gpus),
        _doc(dgx_a100),
        nodes,
        gpus,
        _nvswitch(25.0, 12),
        _rail_nics(25.0),
    )


def hgx_h100(nodes: int = 1, gpus: int = 8) -> Topology:
    """NVIDIA HGX H100: up to 8×H100 on NVSwitch (450 GB/s per GPU per direction), one 50 GB/s NIC per GPU."""
    # H100 whitepaper: NVLink 4, 18 lanes × 25 GB/s = 450 GB/s per GPU per direction through 4 NVSwitches.
    # DGX H100 user guide: 8 × 400 Gb/s NDR ConnectX-7 NICs, one per GPU.
    return _multi_host(
        _checked("hgx_h100", nodes=nodes, gpus=gpus),
        _doc(hgx_h100),
        nodes,
        gpus,
        _nvswitch(25.0, 18),
        _rail_nics(50.0),
    )


def hgx_h200(nodes: int = 1, gpus: int = 8) -> Topology:
    """NVIDIA HGX H200: up to 8×H200 on NVSwitch (450 GB/s per GPU per direction), one 50 GB/s NIC per GPU."""
    # H200 datasheet: the same NVLink 4 fabric as H100 (900 GB/s bidirectional per GPU) and 400 Gb/s NICs.
    return _multi_host(
        _checked("hgx_h200", nodes=nodes, gpus=gpus),
        _doc(hgx_h200),
        nodes,
        gpus,
        _nvswitch(25.0, 18),
        _rail_nics(50.0),
    )


# ---- AMD systems --------------------------------------------------------------------------------

# xGMI (Infinity Fabric) lanes between the 8 GCDs of a 4×MI250 node, from `rocm-smi --shownodesbw` on an MI250
# server (maxima of 200/100/50 GB/s = 4/2/1 lanes; Hugging Face optimum-amd, "AMD Instinct GPU connectivity"),
# matching the CDNA 2 whitepaper: the two GCDs of one package (0-1, 2-3, 4-5, 6-7) share 4 lanes.
MI250_LANES = {
    (0, 1): 4,
    (2, 3): 4,
    (4, 5): 4,
    (6, 7): 4,
    (0, 6): 2,
    (2, 4): 2,
    (0, 2): 1,
    (1, 3): 1,
    (1, 5): 1,
    (3, 7): 1,
    (4, 6): 1,
    (5, 7): 1,
}
# CDNA 2 whitepaper: an xGMI lane is 16 bits at 25 GT/s = 50 GB/s per direction.
MI250_LANE_GBPS = 50.0
# MI300X datasheet: 7 xGMI links per GPU, 128 GB/s bidirectional = 64 GB/s per direction each, fully connected.
MI300X_LINK_GBPS = 64.0


def mi250(nodes: int = 1) -> Topology:
    """AMD 4×MI250 node: 8 GCDs as ranks, xGMI 1, 2 or 4 lanes × 50 GB/s, one 25 GB/s NIC per MI250 package."""
    # One 200 Gb/s NIC per package (as on Frontier and LUMI: 4 × Slingshot-11 per node), on PCIe 4.0 x16,
    # shared by the package's 2 GCDs.
    return _multi_host(
        _checked("mi250", nodes=nodes),
        _doc(mi250),
        nodes,
        8,
        _direct(MI250_LANES, MI250_LANE_GBPS, XGMI_US),
        _shared_nics(2, PCIE4_GBPS, 25.0),
    )


def mi300x(nodes: int = 1) -> Topology:
    """AMD MI300X platform: 8 GPUs fully connected by xGMI (64 GB/s per link per direction), one 50 GB/s NIC each."""
    # 8 × 400 Gb/s NICs, one per GPU (AMD Instinct MI300 series cluster reference architecture guide).
    pairs = {(a, b): 1 for a in range(8) for b in range(a + 1, 8)}
    return _multi_host(
        _checked("mi300x", nodes=nodes),
        _doc(mi300x),
        nodes,
        8,
        _direct(pairs, MI300X_LINK_GBPS, XGMI_US),
        _rail_nics(50.0),
    )


# ---- the catalog --------------------------------------------------------------------------------


def _size(name: str, default: int, maximum: int, what: str, minimum: int = 2) -> Param:
    return Param(name, default, minimum, maximum, what)


NODES = Param("nodes", 1, 1, 1024, "hosts, joined by an InfiniBand switch")
GPUS = Param("gpus", 8, 1, 8, "GPUs per node")

ENTRIES: tuple[Entry, ...] = (
    Entry("ring", ring, (_size("n", 8, MAX_RANKS, "ranks"),), _doc(ring)),
    Entry("line", line, (_size("n", 8, MAX_RANKS, "ranks"),), _doc(line)),
    Entry("fully_connected", fully_connected, (_size("n", 8, 256, "ranks"),), _doc(fully_connected)),
    Entry("switch", switch, (_size("n", 8, MAX_RANKS, "ranks"),), _doc(switch), ("hub_and_spoke",)),
    Entry("torus2d", torus2d, (_size("x", 4, 128, "columns"), _size("y", 4, 128, "rows")), _doc(torus2d)),
    Entry("hypercube", hypercube, (_size("d", 3, 14, "dimensions", minimum=1),), _doc(hypercube)),
    Entry("dgx1", dgx1, (), _doc(dgx1)),
    Entry("ndv2", ndv2, (NODES,), _doc(ndv2)),
    Entry("dgx2", dgx2, (NODES,), _doc(dgx2)),
    Entry("dgx_a100", dgx_a100, (NODES, GPUS), _doc(dgx_a100)),
    Entry("hgx_h100", hgx_h100, (NODES, GPUS), _doc(hgx_h100)),
    Entry("hgx_h200", hgx_h200, (NODES, GPUS), _doc(hgx_h200)),
    Entry("mi250", mi250, (NODES,), _doc(mi250)),
    Entry("mi300x", mi300x, (NODES,), _doc(mi300x)),
)


def entries() -> tuple[Entry, ...]:
    """Every catalog entry, in listing order."""
    return ENTRIES


def entry(name: str) -> Entry:
    """The entry called ``name`` (or one of its aliases); TopologyError if there is none."""
    for e in ENTRIES:
        if name == e.name or name in e.aliases:
            return e
    known = ", ".join(e.name for e in ENTRIES)
    raise TopologyError(f"topology spec {name!r}: unknown topology {name!r} (known: {known})")


def catalog_specs(nodes: int | None = None) -> list[str]:
    """The default spec of every entry; with ``nodes``, the spec of every multi-node entry at that node count."""
    if nodes is None:
        return [e.default_spec for e in ENTRIES]
    return [f"{e.name}:nodes={nodes}" for e in ENTRIES if any(p.name == "nodes" for p in e.params)]


def build(spec: str) -> Topology:
    """The topology a spec names: ``name`` or ``name:key=value,key=value`` with integer values."""
    found, values = _parse(spec)
    return found.generator(**values)


def spec_size(spec: str) -> tuple[str, int] | None:
    """(the name ``build`` gives it, its rank count) for a spec of a generated fabric whose size follows from its
    parameters (ring, line, switch, fully connected, torus, hypercube), without building it: a command can
    refuse a 16,384-rank hypercube from its size at once; None for any other spec (TopologyError if it is bad)."""
    found, values = _parse(spec)
    if found.name not in _RANKS:
        return None
    given = {p.name: values.get(p.name, p.default) for p in found.params}
    return _checked(found.name, **given), _RANKS[found.name](given)


_RANKS: dict[str, Callable[[dict[str, int]], int]] = {
    "ring": lambda v: v["n"],
    "line": lambda v: v["n"],
    "fully_connected": lambda v: v["n"],
    "switch": lambda v: v["n"],
    "torus2d": lambda v: v["x"] * v["y"],
    "hypercube": lambda v: 1 << v["d"],
}


def _parse(spec: str) -> tuple[Entry, dict[str, int]]:
    """The entry a spec names and the values it gives (checked against the entry's ranges)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TopologyError(f"topology spec {spec!r}: empty (try 'weft topo list')")
    name, colon, rest = spec.strip().partition(":")
    try:
        found = entry(name)
    except TopologyError:
        known = ", ".join(e.name for e in ENTRIES)
        raise TopologyError(f"topology spec {spec!r}: unknown topology {name!r} (known: {known})") from None
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, text = (s.strip() for s in item.partition("="))
        _param(found, key, spec)
        if not eq:
            raise TopologyError(f"topology spec {spec!r}: {key}: needs a value ({key}=N)")
        if key in values:
            raise TopologyError(f"topology spec {spec!r}: {key}: given twice")
        try:
            values[key] = int(text)
        except ValueError:
            raise TopologyError(f"topology spec {spec!r}: {key}: must be an integer, got {short_repr(text)}") from None
    if colon and not values:
        raise TopologyError(f"topology spec {spec!r}: nothing after ':' (write {found.name}:key=value)")
    _check_values(found, values, spec)
    return found, values


def _param(found: Entry, key: str, spec: str) -> Param:
    for p in found.params:
        if p.name == key:
            return p
    takes = ", ".join(p.name for p in found.params) or "no parameters"
    raise TopologyError(f"topology spec {spec!r}: {key}: unknown parameter ({found.name} takes {takes})")


def _check_values(found: Entry, values: dict[str, int], spec: str) -> None:
    for key, value in values.items():
        p = _param(found, key, spec)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TopologyError(f"topology spec {spec!r}: {key}: must be an integer, got {value!r}")
        if value < p.minimum:
            raise TopologyError(f"topology spec {spec!r}: {key}: must be >= {p.minimum}")
        if value > p.maximum:
            raise TopologyError(f"topology spec {spec!r}: {key}: must be <= {p.maximum}")


def _checked(name: str, **values: int) -> str:
    """Check a generator's arguments against its entry; return the spec that names the result (defaults left out)."""
    found = entry(name)
    shown = {k: v for k, v in values.items() if v != _param(found, k, name).default}
    spec = name + (":" + ",".join(f"{k}={v}" for k, v in shown.items()) if shown else "")
    _check_values(found, values, spec)
    return spec
