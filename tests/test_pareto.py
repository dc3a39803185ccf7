"""The size frontier: the fastest schedule per size range, and plans that cover every size once committed."""

from __future__ import annotations

import itertools
import json

from schedules.collectives import Collective
from schedules.cost import predict_us
from synth.pareto import SIZES, candidates, frontier
from topologies.catalog import build
from weft.cli import main


def test_frontier_ranges_tile_the_sizes_and_hold_the_fastest_schedule():
    topo = build("hgx_h100")
    pool = candidates(topo, Collective("allreduce", 8), chunk_options=(1, 2))
    points = frontier(pool, topo)
    assert points[0].min_bytes == 0 and points[-1].max_bytes == 0
    for a, b in itertools.pairwise(points):
        assert b.min_bytes == a.max_bytes + 1
    for n in SIZES:
        owner = next(p for p in points if p.min_bytes <= n and (p.max_bytes == 0 or n <= p.max_bytes))
        assert predict_us(owner.schedule, topo, n) == min(predict_us(s, topo, n) for s in pool)
    assert len({p.schedule.content_hash for p in points}) == len(points) >= 2


def test_pareto_commit_serves_every_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEFT_REGISTRY", str(tmp_path / "reg"))
    assert main(["synth", "allreduce", "-t", "fully_connected:n=4", "--method", "pareto", "--commit"]) == 0
    capsys.readouterr()
    for size in ("1KB", "64KB", "4MB", "1GB"):
        assert main(["registry", "select", "-t", "fully_connected:n=4", "allreduce", "--size", size, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["entry"]


def test_line3_allreduce_frontier_meets_in_the_middle_at_large_sizes(tmp_path, capsys):
    # reduce-scatter then all-gather reaches 75% on a line of three; reduce into the middle rank and copy back
    assert (
        main(
            [
                "synth",
                "allreduce",
                "-t",
                "line:n=3",
                "--method",
                "pareto",
                "--size",
                "1GB",
                "--json",
                "-o",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    largest = next(r for r in rows if r["meta"]["options"]["max_bytes"] == 0)
    assert largest["meta"]["solver"] == "reduce-broadcast"
    assert largest["pct_of_bound_by_size"]["1GB"] >= 90.0
    assert any(op == "reduce" for step in largest["steps"] for *_, op in step["sends"])
