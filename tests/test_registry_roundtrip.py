"""Export then import round-trips a registry exactly (issue 20): the committed bench/registry_h200x2 selects the
same plans with the same times afterwards, and keeps its measurements, predictions, options and NCCL's times.
Only the verification record is made afresh: import proves each plan again on the reference executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.store import Entry, Registry
from weft.cli import main

pytestmark = pytest.mark.slow  # every committed entry round-tripped: the slow tier, after the fast one (issue 35)

COMMITTED = Path(__file__).parent.parent / "bench" / "registry_h200x2"
H200X2 = "hgx_h200:gpus=2"
SIZES = ("1KB", "4KB", "64KB", "1MB", "4MB", "64MB", "1GB")


@pytest.fixture(scope="module")
def imported(tmp_path_factory, prove_once) -> Path:  # import proves every plan: once per run (tests/_cache.py)
    root = tmp_path_factory.mktemp("roundtrip")
    assert main(["registry", "export", str(root / "exported"), "--registry", str(COMMITTED)]) == 0
    assert (root / "exported" / "baselines.json").exists()
    assert main(["registry", "import", str(root / "exported"), "--registry", str(root / "imported")]) == 0
    return root / "imported"


def without_verification(doc: dict) -> dict:
    return {**doc, "provenance": {k: v for k, v in doc["provenance"].items() if k != "verification"}}


def test_every_entry_comes_back_with_its_timings_predictions_and_options(imported):
    before = {e.id: e for e in Registry(COMMITTED).entries()}
    after = {e.id: e for e in Registry(imported).entries()}
    assert after.keys() == before.keys() and len(after) == len(list((COMMITTED / "entries").glob("*.json")))
    for id, entry in before.items():
        assert without_verification(after[id].to_json()) == without_verification(entry.to_json())
        # the committed ones hold both, but for the row-owning plans of the fused norm, never benched alone
        assert after[id].predicted_us and (after[id].measured_us or entry.plan.name.split("-")[-1].startswith("rows"))
        assert after[id].provenance.get("options") == entry.provenance.get("options")
        assert after[id].provenance["verification"]["ok"]


def test_nccl_times_come_back(imported):
    assert json.loads((imported / "baselines.json").read_text()) == json.loads(
        (COMMITTED / "baselines.json").read_text()
    )


class ReadOnce(Registry):
    """A registry whose entries are read once, when it is made."""

    def __init__(self, location: Path) -> None:
        super().__init__(location)
        self.loaded = super().load()

    def load(self) -> tuple[list[Entry], list[str]]:
        return self.loaded


def answers(registry: Path) -> dict:
    """select's answer for every collective and size (the entries read once: selection itself is what is tested)."""
    from topologies import resolve
    from weft.units import parse_bytes

    reg = ReadOnce(registry)
    fingerprint = resolve(H200X2).fingerprints  # the committed registry keeps the fingerprint it was recorded under
    out = {}
    for collective in ("allreduce", "allgather", "reducescatter"):
        for size in SIZES:
            sel = reg.select(fingerprint, collective, parse_bytes(size))
            out[collective, size] = (sel.entry.id if sel.entry else None, sel.basis, sel.time_us, sel.lines)
    return out


def test_select_gives_the_same_plan_and_time_at_every_size(imported):
    before, after = answers(COMMITTED), answers(imported)
    assert after == before
    assert all(basis in ("measured", "nccl") for _, basis, _, _ in before.values())  # the measurements came along


def test_the_issue_example_selects_the_measured_ll_plan_after_import(imported, capsys):
    """Issue 20: 4KB allreduce changed from a measured LL plan to a predicted simple-x1 one after the round trip."""
    lines = []
    for registry in (COMMITTED, imported):
        assert (
            main(["registry", "select", "allreduce", "-t", H200X2, "--size", "4KB", "--registry", str(registry)]) == 0
        )
        lines.append(capsys.readouterr().out)
    assert lines[0] == lines[1] and " measured " in lines[0]


def test_list_tells_entries_apart(capsys):
    """Issue 20: each row names the topology, the plan (protocol, instances, threads), its sizes and best time."""
    assert main(["registry", "list", "--registry", str(COMMITTED)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["id", "collective", "ranks", "topology", "plan", "solver", "sizes", "best", "time"]
    row = next(r for r in rows if r.startswith("reducescatter-2r-f80376f883a1"))
    assert row.split() == [
        "reducescatter-2r-f80376f883a1",
        "reducescatter",
        "2",
        "hgx_h200:gpus=2",
        "ll-x1-t1024",
        "direct",
        "0B..1MB,",
        "2",
        "parts,",
        "granule",
        "8B",
        "3.64",
        "µs",
        "measured",
        "at",
        "1KB",
    ]
    assert rows[-1] == f"{len(list((COMMITTED / 'entries').glob('*.json')))} entries in {COMMITTED}"
    assert len({tuple(r.split()[3:]) for r in rows[1:-1]}) > 60  # rows differ beyond their ids


def test_show_starts_with_the_same_facts(capsys):
    assert main(["registry", "show", "reducescatter-2r-f80376f883a1", "--registry", str(COMMITTED)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "reducescatter-2r-f80376f883a1: reducescatter on 2 ranks of hgx_h200:gpus=2, plan "
        "direct-reducescatter-hgx_h200:gpus=2-ll-x1 (ll-x1-t1024), sizes 0B..1MB, 2 parts, granule 8B, "
        "best 3.64 µs "
        "measured at 1KB"
    )
