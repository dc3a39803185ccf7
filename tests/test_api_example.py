"""The Python API takes the CLI's sizes and defaults, commits in one call, and prints plans in one line;
examples/api.py (the README's API section) runs as written."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

import weft
from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_the_example_runs_and_prints_one_short_line_per_result(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["api.py", str(tmp_path / "registry")])
    runpy.run_path(str(ROOT / "examples" / "api.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all(len(line) < 240 for line in lines)
    assert lines[-1].startswith("Selection('ring-allreduce-dgx1-simple-x4', entry ")


def test_the_api_trees_schedule_at_1gb_is_the_clis(tmp_path, capsys):
    out = tmp_path / "trees.json"
    assert (
        main(["synth", "allgather", "-t", "hgx_h100:nodes=2", "--method", "trees", "--size", "1GB", "-o", str(out)])
        == 0
    )
    capsys.readouterr()
    cli = json.loads(out.read_text())
    api = weft.synthesize("hgx_h100:nodes=2", "allgather", "trees", size="1GB")
    assert api.collective.chunks == cli["collective"]["chunks"] > 1
    assert api.content_hash == weft.load_schedule(out).content_hash


def test_the_api_milp_takes_the_clis_default_chunks():
    from weft.synthesis import milp_options

    topo = weft.catalog("ndv2:nodes=1")
    collective = weft.Collective("allgather", topo.nranks)
    assert milp_options(topo, collective, weft.parse_bytes("1GB"), None).chunks == 4
    assert milp_options(topo, collective, weft.parse_bytes("1GB"), 2).chunks == 2


def test_registry_commit_without_a_proof_points_at_weft_commit(tmp_path):
    topo = weft.catalog("ring:n=4")
    plan = weft.compile(weft.synthesize(topo, "allgather"), topo)
    with pytest.raises(weft.CheckFailed, match=r"weft\.commit\(plan, topology"):
        weft.Registry(str(tmp_path)).commit(plan)
    entry = weft.commit(plan, topo, weft.Registry(str(tmp_path)))
    assert weft.select("ring:n=4", "allgather", "1MB", str(tmp_path)).entry.id == entry.id


def test_a_schedule_and_a_plan_print_in_one_line():
    topo = weft.catalog("hgx_h200")
    schedule = weft.synthesize(topo, "allreduce", "direct")
    assert repr(schedule).startswith("Schedule('direct-allreduce-hgx_h200', allreduce, 8 ranks,")
    plan = weft.compile(schedule, topo)
    assert "\n" not in repr(plan) and len(repr(plan)) < 160 and "Op(" not in repr(plan)
