"""The result tables of the README and docs/*.md are generated from bench/results and stay so: each sits between
markers naming the command that prints it (bench/readme_tables.py rewrites them), and here each must equal that
command's output."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLES = _tool()
PAGES = {page.relative_to(ROOT).as_posix(): page.read_text(encoding="utf-8") for page in TABLES.DOCS}
BLOCKS = [(name, command, table) for name, text in PAGES.items() for command, table in TABLES.blocks(text)]


def test_every_results_table_is_generated():
    assert len(BLOCKS) >= 19  # the 17 tables of the README before docs/ (2026-11-27), and the README's 2 copies
    assert "README.md" in {name for name, _, _ in BLOCKS} and "docs/performance.md" in {name for name, _, _ in BLOCKS}
    for name, text in PAGES.items():
        generated = "".join(table for page, _, table in BLOCKS if page == name)
        for header in (
            "| size | NCCL µs |",
            "| topology | collective | wall (s) of limit |",
            "| topology | size | milp",
            "| topology | GPUs | bound + trees",
            "| batch | step, NCCL → weft /",
        ):
            assert text.count(header) == generated.count(header), (name, header)  # none typed outside the markers


@pytest.mark.parametrize("page,command,table", BLOCKS, ids=[f"{page}: {command}" for page, command, _ in BLOCKS])
def test_the_table_is_its_commands_output(page, command, table):
    assert TABLES.run(command) == table, f"{page} is stale: run `python bench/readme_tables.py` ({command})"


def test_every_table_names_a_committed_results_file():
    for _, command, _ in BLOCKS:
        files = [w for w in command.split() if w.startswith("bench/results/")]
        assert files and all((ROOT / f).is_file() for f in files), command


def test_regenerating_restores_a_table_edited_by_hand():
    page, _, table = BLOCKS[-1]
    text = TABLES.regenerate(PAGES[page].replace(table, "| stale |\n", 1))
    assert text == PAGES[page]


RESULTS = ROOT / "bench" / "results"


def test_results_keep_one_file_per_experiment_under_a_stable_name():
    # superseded jobs live in git history (bench/NOTES.md says where), not as _v1 … _v10, _v5e_a beside the latest
    assert [p.name for p in RESULTS.iterdir() if re.search(r"_v\d", p.name)] == []


def test_every_results_file_is_named_where_it_is_used_and_every_link_resolves():
    named = "".join(
        p.read_text(encoding="utf-8")
        for p in [
            *TABLES.DOCS,
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
    for name, text in PAGES.items():
        for link in re.findall(r"\]\(((?:\.\./)?bench/results/[^)#]+)\)", text):
            assert ((ROOT / name).parent / link).exists(), (name, link)


def test_the_compiled_kernel_figures_are_those_of_their_results_file():
    """README and docs/codegen-executor.md give compiled kernels as 0.79–0.90× the interpreter's time per plan: at each
    size of bench/results/compiled_ab_2xh200/ar_compiled.json, the median over plans of compiled / interpreted."""
    import json
    import statistics

    doc = json.loads((ROOT / "bench" / "results" / "compiled_ab_2xh200" / "ar_compiled.json").read_text())
    medians = []
    for row in doc["rows"]:
        times = row["median_us"]
        kernels = [k for k in times if k.startswith("weft:") and k + "+compiled" in times]
        pairs = [(times[k], times[k + "+compiled"]) for k in kernels]
        medians.append(statistics.median(c / i for i, c in pairs))
    low, high = f"{min(medians):.2f}", f"{max(medians):.2f}"
    assert (low, high) == ("0.79", "0.90")
    assert f"{low}–{high}× the interpreter's time per plan" in PAGES["README.md"].replace("\n  ", " ")
