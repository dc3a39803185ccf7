"""The README's performance tables are generated from the committed results, never typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weft.cli import main
from weft.plots import PlotError, bench_table

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "bench" / "results"
IN_README = ["gpu_allreduce_bf16_graph_2xh200.json", "gpu_reducescatter_bf16_graph_2xh200.json",
             "gpu_allgather_bf16_graph_2xh200.json", "gpu_allreduce_bf16_graph_4xh200.json",
             "gpu_reducescatter_bf16_graph_4xh200.json", "gpu_allgather_bf16_graph_4xh200.json"]


@pytest.mark.parametrize("name", IN_README)
def test_the_readme_holds_the_generated_table(name):
    assert bench_table(RESULTS / name) in (ROOT / "README.md").read_text()


def test_a_row_shows_every_implementation_and_marks_the_fastest(tmp_path):
    doc = {"collective": "allreduce", "nranks": 2, "rows": [
        {"size": 1 << 20, "nccl_us": 20.0, "symm_us": 10.0, "weft_us": 12.5, "wrong": 0,
         "plan": "direct-allreduce-hgx_h200:gpus=2-simple-x64-2s"}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    row = bench_table(path).splitlines()[2]
    assert row == "| 1MB | 20.00 | **10.00** | 12.50 | 0.62 | 84 (52) | direct simple-x64-2s | 0 |"


def test_weft_plot_bench_markdown_prints_it(capsys):
    assert main(["plot", "bench", str(RESULTS / IN_README[0]), "--markdown"]) == 0
    assert capsys.readouterr().out == bench_table(RESULTS / IN_README[0])


def test_a_file_without_rows_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("{}")
    with pytest.raises(PlotError, match="rows"):
        bench_table(path)
