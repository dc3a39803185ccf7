"""Topology detection on recorded NVML answers."""

from __future__ import annotations

from pathlib import Path

from topologies.catalog import build
from topologies.detect import GpuFacts, MachineFacts, load_facts, read_facts, topology_from_facts
from weft.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


def test_two_h200s_on_nv18_are_the_catalog_board_slice():
    topo = topology_from_facts(load_facts(FIXTURES / "h200x2_nv18.json"))
    assert topo.fingerprint == build("hgx_h200:gpus=2").fingerprint


def test_eight_h100s_on_nvswitch_are_the_catalog_board():
    topo = topology_from_facts(load_facts(FIXTURES / "h100x8_nvswitch.json"))
    assert topo.fingerprint == build("hgx_h100").fingerprint


def test_gpus_without_nvlink_get_pcie_links():
    topo = topology_from_facts(load_facts(FIXTURES / "l40s_pcie.json"))
    assert topo.nranks == 2 and topo.link(0, 1).bandwidth == 25.0 and topo.link(0, 1).latency == 1.5


def test_unknown_gpus_keep_their_nvlink_lane_counts():
    facts = MachineFacts(
        (GpuFacts("Some GPU", "a:00.0", ("b:00.0",) * 4), GpuFacts("Some GPU", "b:00.0", ("a:00.0",) * 4))
    )
    topo = topology_from_facts(facts)
    assert topo.link(0, 1).count == 4 and topo.link(1, 0).count == 4


class FakeNvml:
    """pynvml's interface, answering from recorded facts (as the real module would on that machine)."""

    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def __init__(self, facts: MachineFacts):
        self.facts = facts

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.facts.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.facts.gpus[i]

    def nvmlDeviceGetName(self, h):
        return h.name.encode()

    def nvmlDeviceGetPciInfo(self, h):
        return type("Pci", (), {"busId": ("0000" + h.pci_bus_id).encode()})

    def nvmlDeviceGetNvLinkState(self, h, lane):
        if lane >= len(h.nvlink_remotes):
            raise self.NVMLError("not supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h, lane):
        return type("Pci", (), {"busId": "0000" + h.nvlink_remotes[lane]})


def test_reading_nvml_gives_back_the_recorded_facts():
    facts = load_facts(FIXTURES / "h200x2_nv18.json")
    assert read_facts(FakeNvml(facts)) == facts


class OlderNvml(FakeNvml):
    """nvidia-ml-py releases without the _v2 remote-PCI query."""

    nvmlDeviceGetNvLinkRemotePciInfo = FakeNvml.nvmlDeviceGetNvLinkRemotePciInfo_v2

    def __getattribute__(self, name):
        if name == "nvmlDeviceGetNvLinkRemotePciInfo_v2":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_older_nvml_without_the_v2_query_still_reads_the_lanes():
    facts = load_facts(FIXTURES / "h200x2_nv18.json")
    assert read_facts(OlderNvml(facts)) == facts


def test_cli_detect_replays_facts_and_writes_the_topology(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["topo", "detect", "--facts", str(FIXTURES / "h200x2_nv18.json"), "-o", str(out)]) == 0
    assert build("hgx_h200:gpus=2").fingerprint in capsys.readouterr().out
    assert main(["topo", "validate", str(out)]) == 0


def test_cli_detect_with_a_broken_facts_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "facts.json"
    bad.write_text('{"gpus": [{"name": 1}]}')
    assert main(["topo", "detect", "--facts", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "facts.json" in err
