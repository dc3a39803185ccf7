"""The synthesis tables (docs/synthesis.md) are generated from the committed results by the bench scripts'
--markdown."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from _docs import docs_text

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "bench" / "results"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "script,result",
    [("trees_scale", "trees_scale.json"), ("milp_bench", "milp_allgather.json"), ("smt_scale", "smt_scale.json")],
)
def test_the_docs_hold_the_generated_table(script, result):
    table = _bench(script).markdown(json.loads((RESULTS / result).read_text()))
    assert table in docs_text()


def test_no_committed_synthesis_result_is_above_its_bound():
    for name in ("trees_scale.json", "milp_allgather.json", "smt_scale.json"):
        for row in json.loads((RESULTS / name).read_text())["rows"]:
            assert row["pct_of_bound"] is None or row["pct_of_bound"] <= 100.0 + 1e-6, (name, row)


def test_hgx_1024_trees_reach_90_percent_at_1gb_within_60_s():
    rows = json.loads((RESULTS / "trees_scale.json").read_text())["rows"]
    big = next(r for r in rows if r["nranks"] == 1024)
    assert big["pct_of_bound"] >= 90.0 and big["solve_s"] <= 60.0 and big["verified"]
