"""The README's CLI tour runs as written: every line of its code block, in order, in an empty folder (and so would
a '## CLI tour' section of a page under docs/, after the README's).

Each line is one test (its id is the line), so a README line that stops working fails by name. The tour runs
once per session through ``weft.cli.main`` in this process (an interpreter per line would cost half a second
each), with the line split as a shell splits it, in an empty folder where $HOME, $WEFT_REGISTRY and
$WEFT_SCHEDULES point: nothing from the repository is copied in. Lines whose comment says "needs GPUs" run on a
machine with two CUDA GPUs, "needs a GPU" with one; elsewhere they skip with "needs a GPU".
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from _docs import DOCS

from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]
GPU_MARK = re.compile(r"#.*\bneeds (a GPU|GPUs)\b")


def gpus_needed(line: str) -> int:
    """How many GPUs a tour line says it needs: 2 for "needs GPUs", 1 for "needs a GPU", else 0."""
    mark = GPU_MARK.search(line)
    return 0 if mark is None else 2 if mark.group(1) == "GPUs" else 1


def tour_lines(page: str) -> list[str]:
    """The command lines of the code blocks under '## CLI tour' (comment-only and blank lines left out); none where
    the page has no such section."""
    section = page.split("\n## CLI tour\n", 1)[1].split("\n## ", 1)[0] if "\n## CLI tour\n" in page else ""
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


LINES = [line for page in DOCS for line in tour_lines(page.read_text(encoding="utf-8"))]


@dataclass(frozen=True)
class Ran:
    code: int | None  # None: not run (a GPU line on a machine without GPUs)
    out: str


def _gpus() -> int:
    try:
        import cupy  # noqa: F401
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _run(argv: list[str]) -> Ran:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as e:  # --help and --version end through argparse
            code = e.code if isinstance(e.code, int) else 0
        except Exception:  # a crash fails its own line (with its traceback); the lines after it still run
            code = -1
            out.write(traceback.format_exc())
    return Ran(code, out.getvalue())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tour")


@pytest.fixture(scope="module")
def tour(folder) -> dict[str, Ran]:
    """Every line's outcome, the lines run in README order."""
    here = folder
    gpus = _gpus()
    ran = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(here)
        for name, value in {
            "HOME": here / "home",
            "XDG_DATA_HOME": here / "data",
            "XDG_CACHE_HOME": here / "cache",
            "WEFT_REGISTRY": here / "registry",
            "WEFT_SCHEDULES": here / "schedules",
            "WEFT_KERNEL_CACHE": here / "kernels",
            "MPLBACKEND": "Agg",
        }.items():
            mp.setenv(name, str(value))
        mp.delenv("WEFT_TOPOLOGY", raising=False)
        for line in LINES:
            argv = shlex.split(line, comments=True)
            if gpus_needed(line) > gpus:
                ran[line] = Ran(None, "")
                continue
            mp.setattr(sys, "argv", argv)  # `weft run` and `bench` start their ranks with this process's argv
            ran[line] = _run(argv[1:])
    return ran


def test_the_tour_is_the_readme_block_every_line_a_weft_command():
    assert len(LINES) >= 30
    for line in LINES:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "weft", line
        # placeholders and shell syntax would not run as written
        assert not any(
            w in ("|", "&&", ";") or w.startswith(("[", "$", "<")) or re.fullmatch(r"[A-Z_]+", w) for w in argv
        ), line


@pytest.mark.parametrize("line", LINES)
def test_the_readme_line_runs(tour, line):
    ran = tour[line]
    if ran.code is None:
        pytest.skip(f"needs a GPU: {line}")
    assert ran.code == 0, f"README tour line failed (exit {ran.code}): {line}\n{ran.out}"


def test_the_tour_lines_did_what_they_say(tour):
    out = {line.split("#")[0].strip(): ran.out for line, ran in tour.items()}
    assert out["weft --version"].startswith("weft ")
    assert "6263.494" not in out["weft topo bound hgx_h100:nodes=2 allgather --size 1GB"]  # dgx1's, not this
    assert re.search(
        r"bandwidth bound: [\d.]+ µs for 1GB \(algbw <= [\d.]+",
        out["weft topo bound hgx_h100:nodes=2 allgather --size 1GB"],
    )
    assert "ring-allreduce-dgx1-simple-x1" in out["weft registry select -t dgx1 allreduce --size 4MB"]
    assert out["weft registry remove ring-allreduce-dgx1-simple-x4"].startswith("removed ")
    assert "0 bad" in out["weft registry verify"]


def test_the_tour_names_no_file_of_the_repository():
    assert not [line for line in LINES if re.search(r"\s(bench|tests|examples)/", line)]


def test_the_gpu_lines_read_files_the_tour_wrote_before_them(tour, folder):
    """Without GPUs the run line is skipped, but the plan it names must be one that `weft tune` wrote."""
    for line in LINES:
        if gpus_needed(line) and " run " in f" {line} ":
            plan = next(w for w in shlex.split(line, comments=True) if w.endswith(".plan.json"))
            assert (folder / plan).is_file(), f"{plan} (named by: {line}) is not written by an earlier line"
