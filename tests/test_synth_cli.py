"""`weft synth` says what it did: where it wrote, % of bound at the size asked for, sweeps in a process pool."""

from __future__ import annotations

import json
from pathlib import Path

from schedules.bounds import lower_bound_us
from schedules.cost import predict_us
from schedules.schedule import load_schedule
from topologies.catalog import build
from weft.cli import main


def test_without_o_the_schedule_lands_in_the_default_folder_and_its_path_is_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEFT_SCHEDULES", str(tmp_path / "default"))
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "trees", "--size", "1GB"]) == 0
    out = capsys.readouterr().out
    written = list((tmp_path / "default").glob("*.json"))
    assert len(written) == 1 and f"written to {written[0]}" in out


def test_a_frontier_refuses_a_file_name_before_solving(tmp_path, capsys):
    for method in (["--method", "smt", "--pareto"], ["--method", "pareto"]):
        code = main(["synth", "allgather", "-t", "ring:n=4", *method, "-o", str(tmp_path / "front.json")])
        assert code == 2
        assert "-o must name a folder" in capsys.readouterr().err
        assert not (tmp_path / "front.json").exists()


def test_pct_of_bound_is_at_the_size_asked_for(tmp_path):
    out = tmp_path / "m.json"
    assert (
        main(
            [
                "synth",
                "allgather",
                "-t",
                "ring:n=4",
                "--method",
                "milp",
                "--size",
                "4MB",
                "--time-limit",
                "5",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    schedule = load_schedule(out)
    topology = build("ring:n=4")
    expected = 100 * lower_bound_us(topology, schedule.collective, 4 << 20) / predict_us(schedule, topology, 4 << 20)
    assert abs(schedule.meta.pct_of_bound - expected) < 1e-6
    assert "4MB" in schedule.meta.predicted_us


def test_a_size_sweep_runs_in_a_process_pool_one_schedule_per_size(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert (
        main(
            [
                "synth",
                "allgather",
                "-t",
                "hgx_h100:nodes=2",
                "--method",
                "trees",
                "--size",
                "1MB,1GB",
                "--jobs",
                "2",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all(Path(r["written"]).exists() for r in rows)
    small, large = (r["collective"]["chunks"] for r in rows)
    assert small < large  # more waves at 1 GB: the pipeline fills
    assert rows[1]["meta"]["pct_of_bound"] >= 90.0


def test_a_sweep_needs_a_size_dependent_method_and_a_folder(tmp_path, capsys):
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "--size", "1MB,1GB"]) == 2
    assert "sweep" in capsys.readouterr().err
    assert (
        main(
            [
                "synth",
                "allgather",
                "-t",
                "ring:n=4",
                "--method",
                "trees",
                "--size",
                "1MB,1GB",
                "-o",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )
    assert "folder" in capsys.readouterr().err
