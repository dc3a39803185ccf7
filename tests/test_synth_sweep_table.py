"""A --size sweep prices every row's schedule at every swept size, so no column is left empty."""

from __future__ import annotations

import json

from weft.cli import main


def test_a_sweep_fills_every_size_column_for_every_row(tmp_path, capsys):
    assert (
        main(
            ["synth", "allgather", "-t", "ring:n=4", "--method", "trees", "--size", "1KB,1MB,64MB", "-o", str(tmp_path)]
        )
        == 0
    )
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trees-")]
    assert len(table) == 3
    for row in table:
        assert " - " not in row, row


def test_a_sweeps_json_has_each_rows_percent_at_every_size(tmp_path, capsys):
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
                "1KB,64MB",
                "-o",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [sorted(r["pct_of_bound_by_size"]) for r in rows] == [["1GB", "1KB", "1MB", "64MB"]] * 2


def test_a_method_whose_solver_is_not_installed_is_one_line(monkeypatch, capsys):
    """On the GPU machines OR-Tools and z3 are absent: `--method smt` said so in a traceback."""
    import sys

    for name in [m for m in sys.modules if m == "synth.smt" or m.startswith(("synth.smt.", "ortools"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ortools", None)  # import ortools now fails as where it is not installed
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "smt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weft: error: weft synth: --method smt needs ortools, which is not installed here")
    assert err.count("\n") == 1
