"""Issue 20 item 9: plots a user can read, and a default output that never replaces a committed file."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from weft import plots
from weft.cli import main

ROOT = Path(__file__).parent.parent
RESULT = ROOT / "bench" / "results" / "gpu_allgather_bf16_graph_2xh200.json"
FRONTIER = {
    "format": "weft.frontier/1",
    "topology": "dgx1",
    "collective": "allgather",
    "lp_bound": 1.1666666666666667,
    "points": [
        {"steps": 2, "rounds": 3, "chunks": 2, "rounds_per_chunk": 1.5},
        {"steps": 3, "rounds": 7, "chunks": 6, "rounds_per_chunk": 7 / 6},
    ],
}


@pytest.mark.parametrize("x, text", [(7 / 6, "7/6"), (1.5, "3/2"), (2.0, "2"), (0.1234567891, "0.123457")])
def test_a_bound_reads_as_its_ratio(x, text):
    assert plots.fraction(x) == text


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plots draw, kept instead of written."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, plt, out: figures.append(fig) or out)
    return figures


def test_the_frontier_names_its_bound_as_a_fraction_explains_its_labels_and_ticks_whole_steps(drawn, tmp_path):
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps(FRONTIER))
    plots.plot_frontier(path, tmp_path / "f.png")
    ax = drawn[0].axes[0]
    drawn[0].canvas.draw()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "bandwidth bound 7/6 rounds per chunk" in legend
    assert "(steps, rounds, chunks) of each schedule" in legend
    assert [t.get_text() for t in ax.texts] == ["(2,3,2)", "(3,7,6)"]
    steps = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert steps and all(float(t).is_integer() for t in steps)


def test_the_bench_plot_size_labels_never_overlap(drawn, tmp_path):
    plots.plot_bench(RESULT, tmp_path / "b.png")
    fig = drawn[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        assert len(boxes) >= 4
        assert all(a.x1 <= b.x0 or a.y1 <= b.y0 for a, b in pairwise(boxes)), "x labels overlap"


@pytest.mark.parametrize("n", [1, 5, 8, 9, 13, 30])
def test_size_ticks_are_few_distinct_and_end_at_the_largest(n):
    sizes = [1024 << i for i in range(n)]
    ticks = plots.size_ticks(sizes)
    assert len(ticks) <= 8 and len(set(ticks)) == len(ticks) and ticks[-1] == sizes[-1]
    assert set(ticks) <= set(sizes)


def test_weft_plot_bench_by_default_writes_to_the_current_directory_and_never_replaces_a_file(
    tmp_path, monkeypatch, capsys
):
    """It wrote beside its input: plotting a committed result overwrote the tracked PNG."""
    committed = RESULT.with_suffix(".png")
    before = committed.read_bytes() if committed.exists() else None
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "bench", str(RESULT)]) == 0
    assert capsys.readouterr().out == f"wrote {RESULT.stem}.png\n"
    assert (tmp_path / f"{RESULT.stem}.png").stat().st_size > 0
    assert (committed.read_bytes() if committed.exists() else None) == before
    (tmp_path / f"{RESULT.stem}.png").write_bytes(b"mine")
    assert main(["plot", "bench", str(RESULT)]) == 2
    err = capsys.readouterr().err
    assert "exists; name the PNG with -o to replace it" in err and err.count("\n") == 1
    assert (tmp_path / f"{RESULT.stem}.png").read_bytes() == b"mine"
