"""The README's result tables are generated from bench/results and stay so: each sits between markers naming
the command that prints it (bench/readme_tables.py rewrites them), and here each must equal that command's output."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _tool():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLES = _tool()
BLOCKS = TABLES.blocks(README)


def test_every_results_table_is_generated():
    assert len(BLOCKS) >= 11
    generated = "".join(table for _, table in BLOCKS)
    for header in (
        "| size | NCCL µs |",
        "| topology | collective | wall (s) of limit |",
        "| topology | size | milp",
        "| topology | GPUs | bound + trees",
        "| batch | step, NCCL → weft /",
    ):
        assert README.count(header) == generated.count(header) > 0, header  # none typed outside the markers


@pytest.mark.parametrize("command,table", BLOCKS, ids=[command for command, _ in BLOCKS])
def test_the_readme_table_is_its_commands_output(command, table):
    assert TABLES.run(command) == table, f"README.md is stale: run `python bench/readme_tables.py` ({command})"


def test_every_table_names_a_committed_results_file():
    for command, _ in BLOCKS:
        files = [w for w in command.split() if w.startswith("bench/results/")]
        assert files and all((ROOT / f).is_file() for f in files), command


def test_regenerating_restores_a_table_edited_by_hand():
    command, table = BLOCKS[0]
    text = TABLES.regenerate(README.replace(table, "| stale |\n", 1))
    assert text == README


RESULTS = ROOT / "bench" / "results"


def test_results_keep_one_file_per_experiment_under_a_stable_name():
    # superseded jobs live in git history (bench/NOTES.md says where), not as _v1 … _v10, _v5e_a beside the latest
    assert [p.name for p in RESULTS.iterdir() if re.search(r"_v\d", p.name)] == []


def test_every_results_file_is_named_where_it_is_used_and_every_link_resolves():
    named = "".join(
        p.read_text(encoding="utf-8")
        for p in [
            ROOT / "README.md",
            ROOT / "bench" / "NOTES.md",
            *ROOT.glob("bench/*.py"),
            *ROOT.glob("tests/*.py"),
            *ROOT.glob("examples/*.py"),
        ]
    )
    orphans = [
        p.name
        for p in RESULTS.iterdir()
        if p.name not in named and not (p.suffix == ".png" and p.with_suffix(".json").exists())
    ]
    assert orphans == []
    for link in re.findall(r"\]\((bench/results/[^)#]+)\)", README):
        assert (ROOT / link).exists(), link
