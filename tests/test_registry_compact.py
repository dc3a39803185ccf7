"""Compact registry entries (weft.registry-entry/2): written by every change, read beside the plain /1 files of
registries from before, and `weft registry compact` converts a registry without losing an entry, a plan or a time.

tests/fixtures/registry_v1 is two entries of bench/registry_h200x2 and their index rows as weft wrote them
before /2 (commit 45e591e), byte for byte."""

from __future__ import annotations

import base64
import json
import shutil
import zlib
from pathlib import Path

import pytest

from registry import pack as registry_pack
from registry.pack import PACKED_FIELD, PACKED_FORMAT, PLAIN_FORMAT
from registry.store import Registry, entry_text
from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "tests" / "fixtures" / "registry_v1"
H200X2 = "topo-57fe5eed9a547d8b"


@pytest.fixture
def weft(capsys):
    """``weft ARGS`` through the CLI's main: (exit code, stdout, stderr)."""

    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        said = capsys.readouterr()
        return code, said.out, said.err

    return call


@pytest.fixture
def old(tmp_path) -> Path:
    shutil.copytree(OLD, tmp_path / "registry")
    return tmp_path / "registry"


def _facts(registry: Path) -> dict[str, tuple]:
    """Per entry id: what selection, the verifier and the executors read (the plan whole, its hash, key, times)."""
    entries, bad = Registry(registry).load()
    assert bad == []
    return {
        e.id: (e.plan.content_hash, e.plan.to_json(), e.key, e.provenance, e.predicted_us, e.measured_us)
        for e in entries
    }


def _selections(registry: Path) -> list[tuple]:
    reg = Registry(registry)
    return [
        (s.entry.id if s.entry else None, s.basis, s.time_us, s.lines)
        for collective in ("allreduce", "reducescatter")
        for size in (1024, 65536, 1 << 20)
        for ll128 in (False, True)
        for s in [reg.select(H200X2, collective, size, "bf16", ll128=ll128)]
    ]


def test_the_fixture_is_the_plain_form_of_before():
    for path in (OLD / "entries").glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["format"] == PLAIN_FORMAT and doc["plan"]["gpus"] and PACKED_FIELD not in doc


def test_a_registry_from_before_still_selects_and_verifies(old, weft):
    reg = Registry(old)
    assert reg.index_problems() == []  # its index rows still describe its plain files
    chosen = reg.select(H200X2, "allreduce", 4096, "bf16")
    assert chosen.entry is not None and chosen.entry.id == "allreduce-2r-e63c895b2030"
    code, out, _ = weft("registry", "verify", "--registry", str(old))
    assert code == 0 and "2 ok, 0 bad" in out


def test_compact_keeps_every_entry_plan_hash_time_and_selection(old, weft):
    facts, selections = _facts(old), _selections(old)
    before = sum(p.stat().st_size for p in (old / "entries").glob("*.json"))
    code, out, err = weft("registry", "compact", "--registry", str(old))
    assert code == 0 and err == "" and out.startswith("compacted 2 of 2 entries: entry files ")
    for path in (old / "entries").glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["format"] == PACKED_FORMAT and "gpus" not in doc["plan"] and doc[PACKED_FIELD]
    assert _facts(old) == facts and _selections(old) == selections
    assert Registry(old).index_problems() == []
    assert sum(p.stat().st_size for p in (old / "entries").glob("*.json")) < 0.7 * before
    assert weft("registry", "compact", "--registry", str(old))[1].startswith("compacted 0 of 2 entries")


def test_any_change_writes_compact_entries(old):
    Registry(old).record_timing("reducescatter-2r-713f314aa879", 4096, 3.5)
    doc = json.loads((old / "entries" / "reducescatter-2r-713f314aa879.json").read_text())
    assert doc["format"] == PACKED_FORMAT and doc["timings"]["measured_us"]["4096"] == 3.5
    assert json.loads((old / "entries" / "allreduce-2r-e63c895b2030.json").read_text())["format"] == PLAIN_FORMAT


def test_a_compact_entry_shows_everything_but_the_ops_in_plain_json(old):
    entry = Registry(old).get("allreduce-2r-e63c895b2030")
    doc = json.loads(entry_text(entry))
    assert doc["key"]["collective"] == "allreduce" and doc["timings"]["measured_us"]
    assert doc["plan"]["name"] == entry.plan.name and doc["plan"]["weft"]["hash"] == entry.plan.content_hash
    assert json.loads(zlib.decompress(base64.b64decode(doc[PACKED_FIELD]))) == entry.plan.to_json()["gpus"]


@pytest.mark.parametrize(
    "packed, why",
    [
        ("not base64!", "not base64 of zlib data"),
        (base64.b64encode(b"not zlib").decode(), "not base64 of zlib data"),
        (base64.b64encode(zlib.compress(b"[1,")).decode(), "not valid JSON"),
        (base64.b64encode(zlib.compress(b"[]")[:-3]).decode(), "not one whole zlib stream"),
        (base64.b64encode(zlib.compress(b" " * 5000)).decode(), "inflates past"),
        (7, "must be a string"),
    ],
)
def test_a_damaged_packed_plan_is_one_line_and_the_other_entries_serve(old, weft, monkeypatch, packed, why):
    monkeypatch.setattr(registry_pack, "MAX_FILE_BYTES", 4096)  # a zlib bomb, small enough for a test
    assert weft("registry", "compact", "--registry", str(old))[0] == 0
    victim = old / "entries" / "reducescatter-2r-713f314aa879.json"
    victim.write_text(json.dumps(json.loads(victim.read_text()) | {PACKED_FIELD: packed}))
    entries, bad = Registry(old).load()
    assert [e.id for e in entries] == ["allreduce-2r-e63c895b2030"]
    assert len(bad) == 1 and PACKED_FIELD in bad[0] and why in bad[0] and "\n" not in bad[0]


def test_export_writes_compact_entries_that_import_reads(old, weft, tmp_path):
    assert weft("registry", "export", str(tmp_path / "out"), "--registry", str(old))[0] == 0
    exported = sorted((tmp_path / "out").glob("*-2r-*.json"))
    assert len(exported) == 2 and all(json.loads(p.read_text())["format"] == PACKED_FORMAT for p in exported)
    code, out, _ = weft("registry", "import", str(tmp_path / "out"), "--registry", str(tmp_path / "again"))
    assert code == 0 and _facts(tmp_path / "again").keys() == _facts(old).keys()
