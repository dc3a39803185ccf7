"""``weft topo``: list, show, validate, export; bad input is one stderr line, exit code 2, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topologies import load_topology
from topologies.catalog import build, entries
from weft.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "topologies" / "two_workstations.json"


def run(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, doc: object, name: str = "topo.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def example_doc() -> dict:
    return json.loads(EXAMPLE.read_text())


# ---- list and show ------------------------------------------------------------------------------


def test_list_prints_every_entry_with_its_parameters():
    code, out, _ = run(["topo", "list"])
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == [e.name for e in entries()]
    assert "nodes=1,gpus=8" in next(line for line in lines if line.startswith("hgx_h100"))


def test_list_json_gives_names_parameters_and_descriptions():
    code, out, _ = run(["topo", "list", "--json"])
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0
    assert rows["hgx_h200"]["params"]["gpus"] == {"default": 8, "min": 1, "max": 8, "help": "GPUs per node"}
    assert rows["switch"]["aliases"] == ["hub_and_spoke"]
    assert "450 GB/s" in rows["hgx_h100"]["description"]


def test_show_summarizes_ranks_hosts_switches_links_and_fingerprint():
    code, out, _ = run(["topo", "show", "hgx_h100:nodes=2"])
    topology = build("hgx_h100:nodes=2")
    assert code == 0
    assert topology.fingerprint in out
    assert "16 on 2 hosts" in out
    assert "n0.nvswitch, n1.nvswitch, ib" in out
    assert "16 rank->switch   18 × 25 GB/s = 450 GB/s" in out


def test_show_json_prints_the_topology_file():
    code, out, _ = run(["topo", "show", "dgx1", "--json"])
    assert code == 0
    assert json.loads(out) == build("dgx1").to_json()


def test_show_reads_topology_files_too():
    code, out, _ = run(["topo", "show", str(EXAMPLE)])
    assert code == 0
    assert "two_workstations" in out
    assert "sharing   4 groups" in out


# ---- validate and export ------------------------------------------------------------------------


def test_validate_prints_ok_and_the_fingerprint():
    code, out, err = run(["topo", "validate", str(EXAMPLE)])
    assert code == 0
    assert out.startswith("ok ")
    assert load_topology(EXAMPLE).fingerprint in out
    assert err == ""


def test_export_writes_a_file_that_validates_with_the_same_fingerprint(tmp_path):
    target = tmp_path / "h200.json"
    code, out, _ = run(["topo", "export", "hgx_h200:nodes=2,gpus=4", "-o", str(target)])
    assert code == 0
    assert load_topology(target).fingerprint == build("hgx_h200:nodes=2,gpus=4").fingerprint
    assert run(["topo", "validate", str(target)])[0] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["h200.json"]


def test_export_of_a_bad_spec_writes_nothing(tmp_path):
    target = tmp_path / "never.json"
    code, _, err = run(["topo", "export", "hgx_h100:nodes=0", "-o", str(target)])
    assert code == 2
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_export_to_a_missing_directory_is_one_line(tmp_path):
    code, _, err = run(["topo", "export", "dgx1", "-o", str(tmp_path / "no" / "such" / "x.json")])
    assert code == 2
    assert err.count("\n") == 1
    assert "cannot write" in err


def test_extra_topo_commands_plug_in_through_register(monkeypatch):
    seen = []

    def register(topo_subparsers):
        p = topo_subparsers.add_parser("bound")
        p.set_defaults(func=lambda args: seen.append("bound") or 0)

    monkeypatch.setitem(sys.modules, "weft.cli.topo.bound", types.SimpleNamespace(register=register))
    assert run(["topo", "bound"])[0] == 0
    assert seen == ["bound"]


# ---- bad input: exit 2, one line naming the file and field --------------------------------------


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    assert err.count("\n") == 1 and err.endswith("\n")
    assert err.startswith("weft: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_malformed_json(tmp_path):
    path = write(tmp_path, '{"format": "weft.topology/1", "nranks": 2,', "broken.json")
    code, _, err = run(["topo", "validate", str(path)])
    assert_one_line_error(code, err, "broken.json", "not valid JSON: line 1")


def test_unknown_rank_in_a_link(tmp_path):
    doc = example_doc()
    doc["links"][3]["dst"] = 9
    code, _, err = run(["topo", "validate", str(write(tmp_path, doc, "unknown_rank.json"))])
    assert_one_line_error(code, err, "unknown_rank.json", "links[3] (3->9).dst", "rank 9 does not exist (4 ranks)")


def test_negative_bandwidth(tmp_path):
    doc = example_doc()
    doc["links"][1]["bandwidth"] = -25
    code, _, err = run(["topo", "validate", str(write(tmp_path, doc, "negative.json"))])
    assert_one_line_error(code, err, "negative.json", "links[1] (1->0).bandwidth", "-25")


def test_duplicate_link(tmp_path):
    doc = example_doc()
    doc["links"].append(dict(doc["links"][0]))
    code, _, err = run(["topo", "validate", str(write(tmp_path, doc, "duplicate.json"))])
    assert_one_line_error(code, err, "duplicate.json", "links[12] (0->1)", "duplicate link")


def test_disconnected_topology_names_the_unreachable_pair(tmp_path):
    doc = example_doc()
    doc["links"] = [link for link in doc["links"] if link["src"] != 3 and link["dst"] != 3]
    doc["sharing"] = doc["sharing"][:2]
    code, _, err = run(["topo", "validate", str(write(tmp_path, doc, "islands.json"))])
    assert_one_line_error(code, err, "islands.json", "rank 0 cannot reach rank 3")


def test_unknown_field(tmp_path):
    doc = example_doc()
    doc["links"][0]["speed"] = 25
    code, _, err = run(["topo", "validate", str(write(tmp_path, doc, "field.json"))])
    assert_one_line_error(code, err, "field.json", "links[0]", "unknown field 'speed'")


def test_missing_file(tmp_path):
    code, _, err = run(["topo", "validate", str(tmp_path / "absent.json")])
    assert_one_line_error(code, err, "absent.json", "cannot read")


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ("nosuch", ("topology spec 'nosuch'", "unknown topology")),
        ("hgx_h100:racks=2", ("topology spec 'hgx_h100:racks=2'", "racks: unknown parameter")),
        ("hgx_h100:nodes=0", ("topology spec 'hgx_h100:nodes=0': nodes: must be >= 1",)),
    ],
)
@pytest.mark.parametrize("command", ["show", "export"])
def test_bad_catalog_spec(tmp_path, command, spec, fragments):
    argv = ["topo", command, spec] + (["-o", str(tmp_path / "x.json")] if command == "export" else [])
    code, out, err = run(argv)
    assert_one_line_error(code, err, *fragments)
    assert out == ""


def test_missing_sub_command_is_a_usage_error():
    code, _, err = run(["topo"])
    assert_one_line_error(code, err, "weft topo")


# ---- corrupted files never crash ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every location in a JSON document, as a tuple of keys and indexes."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += _paths(value, prefix + (i,))
    return found


@st.composite
def corrupted_documents(draw) -> object:
    """The example file with a few of its fields dropped, replaced by random JSON values, or retyped."""
    doc = example_doc()
    for _ in range(draw(st.integers(1, 3))):
        locations = [p for p in _paths(doc) if p]
        if not locations:
            return draw(json_values)
        where = draw(st.sampled_from(locations))
        parent = doc
        for key in where[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["drop", "replace", "stringify", "negate"]))
        if action == "drop":
            del parent[where[-1]]
        elif action == "replace":
            parent[where[-1]] = draw(json_values)
        elif action == "stringify":
            parent[where[-1]] = json.dumps(parent[where[-1]])
        elif isinstance(parent[where[-1]], (int, float)) and not isinstance(parent[where[-1]], bool):
            parent[where[-1]] = -parent[where[-1]]
    return doc


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(corrupted_documents(), json_values))
def test_corrupted_topology_files_exit_0_or_2_with_one_line(doc):
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), doc, "corrupt.json")
        code, out, err = run(["topo", "validate", str(path)])
    assert code in (0, 2)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("weft: error: topology ")
        assert "corrupt.json" in err
    else:
        assert err == "" and out.startswith("ok ")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_bytes_as_a_topology_file_exit_2_with_one_line(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), text, "noise.json")
        code, _, err = run(["topo", "validate", str(path)])
    assert code in (0, 2)
    if code == 2:
        assert err.count("\n") == 1 and "noise.json" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["synth", "allreduce", "-t", "hgx_h200:gpus=1", "--method", "direct"],
        ["topo", "bound", "hgx_h200:gpus=1", "allgather"],
        ["tune", "allreduce", "-t", "hgx_h200:gpus=1"],
    ],
)
def test_a_one_rank_topology_has_no_collective(argv, tmp_path):
    """One GPU is a valid machine to describe (``topo show``), but no collective runs on it: one line naming the
    topology, not a division by zero in the cost report."""
    code, out, err = run(argv + ["-o", str(tmp_path / "x.json")] if argv[0] == "synth" else argv)
    assert_one_line_error(code, err, "topology hgx_h200:gpus=1", "at least 2")
    assert out == "" and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("bandwidth", [1e308, 5e-324])
def test_a_link_bandwidth_beyond_any_fabric_is_one_line_not_an_overflow(tmp_path, bandwidth):
    doc = example_doc()
    doc["links"][0]["bandwidth"] = bandwidth
    path = write(tmp_path, doc)
    for argv in (["topo", "validate", str(path)], ["synth", "allreduce", "-t", str(path), "--method", "ring"]):
        code, _, err = run(argv)
        assert_one_line_error(code, err, str(path), "links[0]", ".bandwidth: must be a number of GB/s from 1e-06")
