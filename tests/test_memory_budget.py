"""Small inputs never exhaust memory (issues 41, 38.1, 39.5): each case of the audit runs through ``weft`` in one
child process under an address-space limit (RLIMIT_AS, 3 GiB), and either is refused in one line (exit 2, no
traceback) or finishes within the limit.

The cases share one child (one interpreter start for all of them); each records its exit code, its stderr and
its own seconds, measured from the case's start, so a loaded machine's slow start counts for none of them."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from fabrics import ring_files

from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]
MILP = ROOT / "tests" / "fixtures" / "schedules" / "milp_allgather_dgx1_c4.json"
LIMIT = 3 << 30
CASE_S = 20.0  # generous: each refusal takes well under a second here (see the note of issue 41)

DRIVER = r"""
import contextlib, io, json, sys, time, traceback
from weft.cli import main
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    start = time.monotonic()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except BaseException:
        code, err = -1, io.StringIO(traceback.format_exc())
    results[name] = {"code": code, "err": err.getvalue(), "seconds": time.monotonic() - start}
print(json.dumps(results))
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _results_file(folder: Path, name: str, plan: str, nranks: int) -> Path:
    path = folder / name
    path.write_text(json.dumps({"nranks": nranks, "rows": [{"size": 1024, "median_us": {f"weft:{plan}": 5.0}}]}))
    return path


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("budget")
    schedule, plan = ring_files(tmp)
    doc = json.loads(plan.read_text())
    doc.pop("weft")
    huge = dict(doc, min_message_size=2**64 - 1024, max_message_size=2**64 - 1)
    (tmp / "min_size.json").write_text(json.dumps(huge))
    doc["gpus"][0]["scratch_chunks"] = 2**24
    (tmp / "scratch.json").write_text(json.dumps(doc))
    tiny = json.loads(schedule.read_text())  # the audit's few-hundred-byte schedule of 16M chunks and no sends
    tiny.pop("hash")
    tiny.pop("symmetries", None)  # the audit's schedule is a plain list of (no) steps
    tiny.update(collective={"name": "allgather", "nranks": 4, "chunks": 1 << 22}, steps=[])
    (tmp / "tiny.json").write_text(json.dumps(tiny))
    os.mkfifo(tmp / "fifo.json")
    argv = {
        "compile --instances 256": [
            "compile",
            str(MILP),
            "-t",
            "dgx1",
            "--instances",
            "256",
            "-o",
            str(tmp / "x256.json"),
        ],
        "compile --instances 4": ["compile", str(MILP), "-t", "dgx1", "--instances", "4", "-o", str(tmp / "x4.json")],
        "direct on hypercube:d=14": [
            "synth",
            "allreduce",
            "-t",
            "hypercube:d=14",
            "--method",
            "direct",
            "-o",
            str(tmp / "d.json"),
        ],
        "--chunks 1000000 on dgx1": [
            "synth",
            "allreduce",
            "-t",
            "dgx1",
            "--method",
            "ring",
            "--chunks",
            "1000000",
            "-o",
            str(tmp / "c.json"),
        ],
        "scratch_chunks 2^24": ["verify", str(tmp / "scratch.json")],
        "min_message_size 2^64-1024": ["verify", str(tmp / "min_size.json")],
        "16M-chunk schedule": ["verify", str(tmp / "tiny.json"), "-t", "ring:n=4"],
        "calibrate /dev/zero": ["topo", "calibrate", "dgx1", "/dev/zero"],
        "calibrate a FIFO": ["topo", "calibrate", "dgx1", str(tmp / "fifo.json")],
        "calibrate a trees plan": [
            "topo",
            "calibrate",
            "dgx1",
            str(_results_file(tmp, "trees.json", "trees-allreduce-dgx1-simple-x1", 8)),
        ],
        "calibrate a ring on 4096 ranks": [
            "topo",
            "calibrate",
            "ring:n=4096",
            str(_results_file(tmp, "ring.json", "ring-allreduce-ring:n=4096-simple-x1", 4096)),
        ],
        "calibrate x9999 instances": [
            "topo",
            "calibrate",
            "dgx1",
            str(_results_file(tmp, "x.json", "ring-allreduce-dgx1-simple-x9999", 8)),
        ],
    }
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("WEFT_MEMORY_LIMIT", None)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(argv)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


REFUSED = {
    "compile --instances 256": "the reference proof with --instances 256 needs about",
    "direct on hypercube:d=14": "268,419,072 sends, over the 8,000,000 this machine expands",  # before the build
    "--chunks 1000000 on dgx1": "at least 56000000 sends) needs about",
    "scratch_chunks 2^24": "the reference proof at",
    "min_message_size 2^64-1024": "min_message_size: must be an integer from 0 to 1152921504606846976",
    "calibrate /dev/zero": "results /dev/zero: cannot read: not a regular file",
    "calibrate a FIFO": "cannot read: not a regular file",
    "calibrate a trees plan": "no measured plan of this fabric",
    "calibrate a ring on 4096 ranks": "no measured plan of this fabric",
    "calibrate x9999 instances": "no measured plan of this fabric",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line_under_a_memory_limit(cases, case):
    got = cases[case]
    err = got["err"].strip()
    assert got["code"] == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, got
    assert REFUSED[case] in err and got["seconds"] < CASE_S, got


def test_a_schedule_of_16m_chunks_and_no_sends_fails_at_once(cases):
    """The audit's 300-byte schedule took 3 GB and 51 s: it cannot hold the sends it needs, so it fails unsimulated."""
    got = cases["16M-chunk schedule"]
    assert got["code"] == 1 and got["seconds"] < CASE_S, got


def test_a_plan_within_the_limit_still_compiles_and_proves(cases):
    got = cases["compile --instances 4"]
    assert got["code"] == 0, got


def test_the_refusal_names_the_flag_that_raises_the_budget(cases):
    assert "raise it with --memory-limit" in cases["compile --instances 256"]["err"]


def test_memory_limit_raises_the_budget_and_an_environment_budget_lowers_it(capsys, tmp_path, monkeypatch):
    argv = ["synth", "allgather", "-t", "dgx1", "--method", "ring", "--chunks", "100", "-o", str(tmp_path / "r.json")]
    assert main(["--memory-limit", "1MB"] + argv) == 2
    assert "needs about 2.14 MiB of memory, more than the budget of 1 MiB" in capsys.readouterr().err
    monkeypatch.setenv("WEFT_MEMORY_LIMIT", str(1 << 20))
    assert main(argv) == 2
    assert main(["--memory-limit", "1GB"] + argv) == 0


@pytest.mark.parametrize(
    "name", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter", "alltoall"]
)
def test_min_sends_is_a_lower_bound_of_every_baseline(name):
    """The count verify and synth refuse by: no verified schedule has fewer sends."""
    from schedules.collectives import collective_on
    from schedules.verify import verify
    from synth import baselines
    from synth.errors import SynthesisError
    from topologies import resolve

    checked = 0
    for spec in ("ring:n=4", "switch:n=5", "dgx1"):
        topology = resolve(spec)
        for chunks in (1, 3):
            collective = collective_on(
                name,
                spec,
                topology.nranks,
                chunks,
                root=1 if name in ("broadcast", "reduce", "gather", "scatter") else 0,
            )
            for method in ("ring", "direct", "twoshot", "rhd", "tree"):
                try:
                    schedule = getattr(baselines, method)(topology, collective)
                except SynthesisError:
                    continue
                if verify(schedule, topology).ok:
                    assert schedule.nsends >= collective.min_sends > 0, (spec, method, chunks)
                    checked += 1
    assert checked >= 3


def test_a_long_proof_reports_progress_and_a_short_one_is_quiet(tmp_path, capsys, monkeypatch):
    import weft.cli

    schedule, plan = ring_files(tmp_path)
    assert main(["verify", str(plan)]) == 0
    assert "reference:" not in capsys.readouterr().err
    monkeypatch.setattr(weft.cli, "PROGRESS_AFTER_S", 0.0)  # as if it were a proof of minutes
    assert main(["verify", str(plan)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("weft: reference: proving plan ring-allgather") and len(lines) == 1 + 9, lines
