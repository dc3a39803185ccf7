"""The performance tables of the README and docs/ are generated from the committed results, never typed by hand."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from _docs import docs_text

from weft.cli import main
from weft.plots import bench_table
from weft.results import ResultsError

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "bench" / "results"
IN_DOCS = [
    "gpu_allreduce_bf16_graph_2xh200.json",
    "gpu_reducescatter_bf16_graph_2xh200.json",
    "gpu_allgather_bf16_graph_2xh200.json",
    "gpu_allreduce_bf16_graph_4xh200.json",
    "gpu_reducescatter_bf16_graph_4xh200.json",
    "gpu_allgather_bf16_graph_4xh200.json",
    "gpu_allreduce_bf16_graph_2xh100.json",
    "gpu_allreduce_bf16_graph_4xh100.json",
]


@pytest.mark.parametrize("name", IN_DOCS)
def test_the_docs_hold_the_generated_table(name):
    assert bench_table(RESULTS / name) in docs_text()


def test_a_row_shows_every_implementation_and_marks_the_fastest(tmp_path):
    doc = {
        "collective": "allreduce",
        "nranks": 2,
        "rows": [
            {
                "size": 1 << 20,
                "nccl_us": 20.0,
                "symm_us": 10.0,
                "weft_us": 12.5,
                "wrong": 0,
                "plan": "direct-allreduce-hgx_h200:gpus=2-simple-x64-2s",
            }
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    row = bench_table(path).splitlines()[2]
    assert row == (
        "| 1MB | 20.00 | **10.00** | – | **10.00** (symm-mem) | 12.50 | 0.62 | 1.25 | 84 (52) "
        "| direct simple-x64-2s | 0 / – |"
    )


def test_a_row_names_the_best_peer_timed_and_counts_every_peers_wrong_results(tmp_path):
    doc = {
        "collective": "allreduce",
        "nranks": 2,
        "rows": [
            {
                "size": 1 << 20,
                "nccl_us": 20.0,
                "symm_us": 10.0,
                "weft_us": 12.5,
                "flashinfer_us": 6.0,
                "wrong": 0,
                "best_peer": "flashinfer:oneshot",
                "best_peer_us": 6.0,
                "plan": "direct-allreduce-hgx_h200:gpus=2-ll-x64",
                "peers_wrong": {"flashinfer:oneshot": 0, "flashinfer:auto": 1, "symm:one_shot": 2},
            }
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    row = bench_table(path).splitlines()[2]
    assert row == (
        "| 1MB | 20.00 | 10.00 | **6.00** | **6.00** (FlashInfer oneshot) | 12.50 | 0.62 | 2.08 | 84 (52) "
        "| direct ll-x64 | 0 / 3 |"
    )


def test_weft_plot_bench_markdown_prints_it(capsys):
    assert main(["plot", "bench", str(RESULTS / IN_DOCS[0]), "--markdown"]) == 0
    assert capsys.readouterr().out == bench_table(RESULTS / IN_DOCS[0])


COMPILED = RESULTS / "compiled_2xh200_s9"
MERGED = [COMPILED / f"gpu_allreduce_bf16_graph_2xh200_compiled_{part}.json" for part in ("small", "large", "huge")]


def test_the_docs_hold_the_table_merged_from_the_jobs_of_one_benchmark():
    table = bench_table(MERGED)
    assert table in docs_text() and len(table.splitlines()) == 2 + 10  # 1 KB to 256 MB, one row a size


def _bench_file(path: Path, sizes: list[int], machine: str = "NVIDIA H200") -> str:
    rows = [{"size": s, "nccl_us": 10.0 + s / 1e4, "weft_us": 5.0 + s / 1e4, "wrong": 0} for s in sizes]
    doc = {"collective": "allreduce", "dtype": "bf16", "mode": "graph", "nranks": 2, "machine": machine, "rows": rows}
    path.write_text(json.dumps(doc))
    return str(path)


def test_weft_plot_bench_merges_the_files_of_one_benchmark_in_size_order(tmp_path, capsys):
    large = _bench_file(tmp_path / "large.json", [1 << 20, 4 << 20])
    small = _bench_file(tmp_path / "small.json", [1024, 1 << 16])
    assert main(["plot", "bench", large, small, "--markdown"]) == 0
    sizes = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert sizes == ["| 1KB", "| 64KB", "| 1MB", "| 4MB"]
    png = tmp_path / "merged.png"
    assert main(["plot", "bench", small, large, "-o", str(png)]) == 0 and png.stat().st_size > 0


@pytest.mark.parametrize(
    "second,message",
    [
        (dict(sizes=[1 << 16, 1 << 20]), "rows: size 65536 is also in"),
        (dict(sizes=[1 << 20], machine="NVIDIA H100 80GB HBM3"), "machine: 'NVIDIA H100 80GB HBM3', where"),
    ],
)
def test_files_of_two_benchmarks_or_a_size_twice_are_refused_in_one_line(second, message, tmp_path, capsys):
    small = _bench_file(tmp_path / "small.json", [1024, 1 << 16])
    other = _bench_file(tmp_path / "other.json", **second)
    png = tmp_path / "merged.png"
    assert main(["plot", "bench", small, other, "-o", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"other.json: {message}" in err and not png.exists()


def test_a_file_without_rows_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("{}")
    with pytest.raises(ResultsError, match="rows"):
        bench_table(path)


# ---- weft plot: every committed benchmark still plots; a malformed file is one line naming the file and field ----

PLOTTED = sorted(
    p.name
    for pattern in ("gpu_*.json", "kernel_trace*.json", "milp_allgather.json", "trees_scale*.json")
    for p in RESULTS.glob(pattern)
)
GOOD_ROW = {"size": 1024, "nccl_us": 10.0, "symm_us": None, "weft_us": 8.0, "wrong": 0, "plan": "direct-ll-x1"}
GOOD_FRONTIER = {
    "format": "weft.frontier/1",
    "topology": "ring:n=4",
    "collective": "allgather",
    "lp_bound": 1.5,
    "points": [{"steps": 2, "rounds": 3, "chunks": 2, "rounds_per_chunk": 1.5}],
}


def run(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", PLOTTED)
def test_every_committed_benchmark_plots(name, tmp_path):
    code, out, err = run(["plot", "bench", str(RESULTS / name), "-o", str(tmp_path / "p.png")])
    assert (code, err) == (0, "")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_frontier_from_weft_synth_plots(tmp_path):
    assert run(["synth", "allgather", "-t", "ring:n=4", "--method", "smt", "--pareto", "-o", str(tmp_path)])[0] == 0
    code, out, err = run(["plot", "frontier", str(tmp_path / "frontier.json"), "-o", str(tmp_path / "f.png")])
    assert (code, err) == (0, "")
    assert (tmp_path / "f.png").stat().st_size > 0


@pytest.mark.parametrize(
    "change, field",
    [
        ({"rows": [7]}, "rows[0]: must be an object"),
        ({"rows": [{"nccl_us": 3.0}]}, "rows[0].size: missing"),
        ({"rows": [{**GOOD_ROW, "size": -1}]}, "rows[0].size: must be a size in bytes"),
        ({"nranks": "abc"}, "nranks: must be an integer"),
        ({"nranks": 0}, "nranks: must be an integer"),
        ({"rows": [{**GOOD_ROW, "nccl_us": "abc"}]}, "rows[0].nccl_us: must be a time in µs"),
        ({"rows": [{**GOOD_ROW, "weft_us": 5e-324}]}, "rows[0].weft_us: must be a time in µs"),
        ({"rows": [{**GOOD_ROW, "plan": 7}]}, "rows[0].plan: must be a plan name"),
        ({"rows": [{**GOOD_ROW, "wrong": "none"}]}, "rows[0].wrong: must be an integer"),
        ({"collective": ["allreduce"]}, "collective: must be a string"),
        ({"machine": 3}, "machine: must be a string or an object"),
        ({"rows": [{**GOOD_ROW, "median_us": [1, 2]}]}, "rows[0].median_us: must be an object"),
        ({"rows": [{**GOOD_ROW, "median_us": {"nccl": True}}]}, "rows[0].median_us.nccl: must be a time in µs"),
        ({"rows": [{**GOOD_ROW, "median_us": {"nccl": 0}}]}, "rows[0].median_us.nccl: must be a time in µs"),
        ({"rows": [{**GOOD_ROW, "median_us": {"weft:x": float("-inf")}}]}, "rows[0].median_us.weft:x: must be a time"),
        ({"rows": [{**GOOD_ROW, "median_us": {"nccl": float("nan")}}]}, "rows[0].median_us.nccl: must be a time in µs"),
        ({"rows": [{**GOOD_ROW, "best_peer": 3}]}, "rows[0].best_peer: must be an implementation's name"),
        ({"rows": [{**GOOD_ROW, "best_peer_us": -1}]}, "rows[0].best_peer_us: must be a time in µs"),
        (
            {"rows": [{**GOOD_ROW, "peers_wrong": {"vllm:custom_ar": "no"}}]},
            "rows[0].peers_wrong.vllm:custom_ar: must be",
        ),
    ],
)
@pytest.mark.parametrize("markdown", [[], ["--markdown"]])
def test_a_malformed_benchmark_is_one_line_naming_the_file_and_field(change, field, markdown, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"collective": "allreduce", "nranks": 2, "rows": [GOOD_ROW], **change}))
    code, out, err = run(["plot", "bench", str(path), "-o", str(tmp_path / "p.png"), *markdown])
    assert code == 2 and out == ""
    assert err.startswith(f"weft: error: bench results {path}: {field}")
    assert err.count("\n") == 1
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"format": "weft.frontier/2"}, "format: must be 'weft.frontier/1'"),
        ({"points": []}, "points: must be a non-empty list"),
        ({"points": ["x"]}, "points[0]: must be an object"),
        ({"points": [{"rounds_per_chunk": 1.5}]}, "points[0].steps: missing"),
        ({"points": [{"steps": 1e308, "rounds_per_chunk": 1.5}]}, "points[0].steps: must be an integer"),
        ({"points": [{"steps": 2, "rounds_per_chunk": "1.5"}]}, "points[0].rounds_per_chunk: must be a number"),
        ({"points": [{"steps": 2, "rounds": [], "rounds_per_chunk": 1.5}]}, "points[0].rounds: must be an integer"),
        ({"lp_bound": {"value": 1.5}}, "lp_bound: must be a number"),
        ({"lp_bound": float("inf")}, "lp_bound: must be a number"),
    ],
)
def test_a_malformed_frontier_is_one_line_naming_the_file_and_field(change, field, tmp_path):
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps({**GOOD_FRONTIER, **change}))
    code, out, err = run(["plot", "frontier", str(path), "-o", str(tmp_path / "f.png")])
    assert code == 2 and out == ""
    assert err.startswith(f"weft: error: frontier {path}: {field}")
    assert err.count("\n") == 1
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize(
    "kind, text, message",
    [
        ("bench", "[1, 2]", "bench results {}: (top level): must be an object"),
        ("bench", "{", "bench results {}: not valid JSON"),
        ("frontier", "{}", "frontier {}: format: must be 'weft.frontier/1', got None"),
    ],
)
def test_the_error_names_the_kind_of_file(kind, text, message, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(text)
    code, _, err = run(["plot", kind, str(path)])
    assert code == 2 and err.startswith("weft: error: " + message.format(path))


@pytest.mark.parametrize("target, fragment", [("p", "-o: must name a .png file"), ("missing/p.png", "cannot write")])
def test_a_plot_that_cannot_be_written_is_one_line_and_leaves_nothing(target, fragment, tmp_path):
    """matplotlib appended '.png' to a bare name ('-o /tmp' wrote /tmp.png) and raised on a missing folder."""
    code, out, err = run(["plot", "bench", str(RESULTS / PLOTTED[0]), "-o", str(tmp_path / target)])
    assert code == 2 and out == "" and err.count("\n") == 1 and fragment in err
    assert list(tmp_path.iterdir()) == []
