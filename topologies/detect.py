"""``weft topo detect``: this machine's Topology from NVML, so a job finds the plans made for its fabric.

NVML's answers are first read into plain facts (``MachineFacts``), which tests record and replay; the
topology is then chosen from the facts. A fabric the catalog knows is built by the catalog, so detection and
the catalog give the same fingerprint. Otherwise the GPUs' NVLink lanes become direct links (25 GB/s per
NVLink 4 lane; 20 for NVLink 3) and pairs without NVLink get a PCIe link (a path through the host bridge).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.errors import TopologyError
from topologies.topology import Link, Topology
from weftcore.jsonfile import read_json

# Per-lane, per-direction NVLink bandwidth by GPU family (GB/s): NVLink 4 (Hopper) and NVLink 3 (Ampere).
LANE_GBPS = {"H200": 25.0, "H100": 25.0, "A100": 25.0, "V100": 25.0}
PCIE_GBPS = 25.0  # PCIe 4.0 x16, per direction, after protocol overhead
NVLINK_US, PCIE_US = 0.7, 1.5
NVSWITCH_BOARDS = {"H200": "hgx_h200", "H100": "hgx_h100"}


@dataclass(frozen=True)
class GpuFacts:
    name: str
    pci_bus_id: str
    nvlink_remotes: tuple[str, ...]  # the PCI bus id at the far end of each active NVLink lane


@dataclass(frozen=True)
class MachineFacts:
    gpus: tuple[GpuFacts, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "weft.nvml-facts/1",
            "gpus": [
                {"name": g.name, "pci_bus_id": g.pci_bus_id, "nvlink_remotes": list(g.nvlink_remotes)}
                for g in self.gpus
            ],
        }

    @staticmethod
    def from_json(doc: Any, source: str) -> MachineFacts:
        try:
            return MachineFacts(
                tuple(
                    GpuFacts(str(g["name"]), str(g["pci_bus_id"]), tuple(str(r) for r in g["nvlink_remotes"]))
                    for g in doc["gpus"]
                )
            )
        except (KeyError, TypeError) as e:
            raise TopologyError(f"nvml facts {source}: gpus: malformed ({e})") from None


def read_facts(nvml: Any = None) -> MachineFacts:
    """Ask NVML (the ``pynvml`` module from nvidia-ml-py, or any object with its functions)."""
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            raise TopologyError("topo detect: nvidia-ml-py is not installed (pip install 'weft[gpu]')") from None
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError has many subclasses; any of them means no usable driver
        raise TopologyError(f"topo detect: NVML is unavailable on this machine: {e}") from None
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            remotes = []
            # nvidia-ml-py names the remote-PCI query with or without _v2, depending on its version.
            remote_pci = (
                getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or nvml.nvmlDeviceGetNvLinkRemotePciInfo
            )
            for lane in range(nvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, lane) != nvml.NVML_FEATURE_ENABLED:
                        continue
                    # some nvidia-ml-py releases name it without _v2 (the one on the 2xH200 machines does)
                    remote_pci = (
                        getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None)
                        or nvml.nvmlDeviceGetNvLinkRemotePciInfo
                    )
                    remotes.append(_bus_id(remote_pci(handle, lane).busId))
                except nvml.NVMLError:
                    continue  # the lane does not exist on this GPU
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append(
                GpuFacts(
                    name.decode() if isinstance(name, bytes) else str(name),
                    _bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
                    tuple(remotes),
                )
            )
        return MachineFacts(tuple(gpus))
    finally:
        nvml.nvmlShutdown()


def _bus_id(raw: Any) -> str:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.lower().lstrip("0") or "0"


def _family(name: str) -> str | None:
    return next((f for f in LANE_GBPS if f in name.upper()), None)


def topology_from_facts(facts: MachineFacts) -> Topology:
    """The catalog entry for a known board, else direct NVLink lanes plus PCIe."""
    from topologies.catalog import build

    n = len(facts.gpus)
    if n == 0:
        raise TopologyError("topo detect: NVML reports no GPUs")
    families = {_family(g.name) for g in facts.gpus}
    gpu_ids = {g.pci_bus_id: i for i, g in enumerate(facts.gpus)}
    switched = all(g.nvlink_remotes and not any(r in gpu_ids for r in g.nvlink_remotes) for g in facts.gpus)
    family = families.pop() if len(families) == 1 else None
    if family in NVSWITCH_BOARDS and n <= 8 and (switched or _all_pairs_nvlink(facts, gpu_ids)):
        # NVSwitch boards, and slices of them that a VM shows as direct NV18 pairs, are the catalog's board.
        return build(f"{NVSWITCH_BOARDS[family]}:gpus={n}" if n != 8 else NVSWITCH_BOARDS[family])
    return _direct_topology(facts, gpu_ids, family)


def _all_pairs_nvlink(facts: MachineFacts, gpu_ids: dict[str, int]) -> bool:
    n = len(facts.gpus)
    return all(
        {gpu_ids[r] for r in g.nvlink_remotes if r in gpu_ids} == set(range(n)) - {i} for i, g in enumerate(facts.gpus)
    )


def _direct_topology(facts: MachineFacts, gpu_ids: dict[str, int], family: str | None) -> Topology:
    lane = LANE_GBPS.get(family or "", 20.0)
    links = []
    for a, g in enumerate(facts.gpus):
        lanes: dict[int, int] = {}
        for remote in g.nvlink_remotes:
            if remote in gpu_ids and gpu_ids[remote] != a:
                lanes[gpu_ids[remote]] = lanes.get(gpu_ids[remote], 0) + 1
        for b in range(len(facts.gpus)):
            if b == a:
                continue
            if b in lanes:
                links.append(Link(a, b, lane, NVLINK_US, lanes[b]))
            else:
                links.append(Link(a, b, PCIE_GBPS, PCIE_US))
    return Topology(
        "detected", len(facts.gpus), tuple(links), description=f"detected: {len(facts.gpus)} × {facts.gpus[0].name}"
    )


def detect(nvml: Any = None) -> Topology:
    """This machine's Topology."""
    return topology_from_facts(read_facts(nvml))


def load_facts(path: str | Path) -> MachineFacts:
    return MachineFacts.from_json(read_json(path, "nvml facts", TopologyError), str(path))
