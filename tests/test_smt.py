"""The SMT synthesizer: every schedule it returns verifies; unsat, unknown and bad options are reported."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slowdown import idle_s

from schedules.collectives import NAMES, Collective
from schedules.verify import require_valid, verify
from synth import smt
from synth.errors import SynthesisError, Unknown, Unsat
from synth.smt import dual as smt_dual
from synth.smt.bound import rounds_per_chunk_bound, steps_bound
from synth.smt.symmetry import symmetry_levels
from topologies.catalog import build
from weft.cli import main

RING4 = build("ring:n=4")
FC4 = build("fully_connected:n=4")
DGX1 = build("dgx1")
ONE_WORKER = smt.SmtOptions(workers=1, time_limit=30)


def _options(**kw) -> smt.SmtOptions:
    return smt.SmtOptions(workers=1, time_limit=30, **kw)


@pytest.mark.parametrize("topology", [RING4, FC4], ids=["ring4", "fc4"])
@pytest.mark.parametrize("name", NAMES)
def test_least_steps_schedule_verifies_on_small_topologies(topology, name):
    schedule = smt.solve(topology, Collective(name, 4, 1, 1), ONE_WORKER)
    assert verify(schedule, topology).ok
    assert schedule.meta.solver == "smt"


@pytest.mark.parametrize(
    "name,steps", [("allgather", 1), ("alltoall", 1), ("broadcast", 1), ("reduce", 1), ("allreduce", 2)]
)
def test_fully_connected_needs_one_step_per_phase(name, steps):
    assert smt.solve(FC4, Collective(name, 4), ONE_WORKER).nsteps == steps


@pytest.mark.parametrize("name", ["allgather", "broadcast", "gather", "scatter", "reducescatter", "reduce"])
def test_dgx1_two_step_instance_verifies(name):
    schedule = smt.solve(DGX1, Collective(name, 8, 1, 3), _options(steps=2, rounds=2))
    require_valid(schedule, DGX1)
    assert (schedule.nsteps, schedule.total_rounds) == (2, 2)


def test_dgx1_alltoall_needs_a_step_more_than_its_diameter_at_one_round_per_step():
    schedule = smt.solve(DGX1, Collective("alltoall", 8), ONE_WORKER)
    require_valid(schedule, DGX1)
    assert steps_bound(DGX1, Collective("alltoall", 8)) == 2
    assert (schedule.nsteps, schedule.total_rounds) == (3, 3)


def test_dgx1_reducescatter_with_two_chunks_is_the_reversed_allgather():
    schedule = smt.solve(DGX1, Collective("reducescatter", 8, 2), _options(steps=2, rounds=3))
    require_valid(schedule, DGX1)
    assert {s.op for step in schedule.steps for s in step.sends} == {"reduce"}


def test_dgx1_allreduce_is_reducescatter_then_allgather_and_verifies():
    schedule = smt.solve(DGX1, Collective("allreduce", 8, 2), _options(steps=4, rounds=6))
    require_valid(schedule, DGX1)
    ops = [{s.op for s in step.sends} for step in schedule.steps]
    assert ops == [{"reduce"}, {"reduce"}, {"copy"}, {"copy"}]


def test_allreduce_of_halves_with_different_chunk_counts_verifies():
    rs = smt.solve(DGX1, Collective("reducescatter", 8, 1), _options(steps=2, rounds=2))
    ag = smt.solve(DGX1, Collective("allgather", 8, 2), _options(steps=2, rounds=3))
    schedule = smt_dual.allreduce(rs, ag)
    assert schedule.collective.chunks == 2 and schedule.total_rounds == 4 + 3
    require_valid(schedule, DGX1)


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["allgather", "alltoall", "scatter", "reducescatter", "reduce"]), factor=st.integers(1, 3))
def test_splitting_chunks_keeps_a_schedule_valid(name, factor):
    schedule = smt.solve(RING4, Collective(name, 4), ONE_WORKER)
    scaled = smt_dual.scale_chunks(schedule, factor)
    assert scaled.collective.chunks == factor and scaled.total_rounds == factor * schedule.total_rounds
    require_valid(scaled, RING4)


def test_unsat_instance_names_the_instance():
    with pytest.raises(Unsat, match=r"\(S=1, R=1, C=1\) is unsat"):
        smt.solve(RING4, Collective("allgather", 4), _options(steps=1))


def test_dgx1_two_steps_cannot_reach_the_bandwidth_bound():
    with pytest.raises(Unsat):
        smt.solve(DGX1, Collective("allgather", 8, 6), _options(steps=2, rounds=7))


def test_time_limit_gives_unknown_not_a_hang():
    options = smt.SmtOptions(steps=3, rounds=7, time_limit=0.3, workers=1, symmetry=False)
    with pytest.raises(Unknown, match="unknown"):
        smt.solve(DGX1, Collective("allgather", 8, 6), options)


@pytest.mark.parametrize("kw", [{"steps": 0}, {"steps": 3, "rounds": 2}, {"time_limit": 0}, {"max_chunks": -1}])
def test_bad_options_are_rejected(kw):
    with pytest.raises(SynthesisError):
        smt.solve(RING4, Collective("allgather", 4), smt.SmtOptions(**kw))


def test_lp_bound_on_dgx1_allgather_is_seven_sixths():
    assert rounds_per_chunk_bound(DGX1, Collective("allgather", 8)) == Fraction(7, 6)


def test_lp_bound_on_bidirectional_ring_allgather_is_three_halves():
    assert rounds_per_chunk_bound(RING4, Collective("allgather", 4)) == Fraction(3, 2)


def test_dgx1_symmetry_group_keeps_links_and_chunk_owners():
    group = symmetry_levels(DGX1, Collective("allgather", 8))[0]
    assert len(group.elements) == 4
    for sigma, tau in group.elements:
        assert all(DGX1.link(sigma[link.src], sigma[link.dst]).count == link.count for link in DGX1.links)
        assert all(tau[r] == sigma[r] for r in range(8))


def test_rooted_symmetry_fixes_the_root():
    for group in symmetry_levels(RING4, Collective("broadcast", 4, 1, 2)):
        assert all(sigma[2] == 2 for sigma, _ in group.elements)


def test_ring_pareto_frontier_reaches_the_lp_bound():
    frontier = smt.pareto(RING4, Collective("allgather", 4), ONE_WORKER)
    assert frontier.complete and frontier.lp_bound == Fraction(3, 2)
    assert [(p.steps, p.rounds_per_chunk) for p in frontier.points] == [(2, Fraction(3, 2))]
    for point in frontier.points:
        require_valid(point.schedule, RING4)
        assert set(point.predicted_us) == {"1KB", "1MB", "1GB"}


def test_allreduce_frontier_sums_both_halves():
    frontier = smt.pareto(RING4, Collective("allreduce", 4), ONE_WORKER)
    assert frontier.lp_bound == Fraction(3)
    assert [(p.steps, p.rounds_per_chunk) for p in frontier.points] == [(4, Fraction(3))]
    require_valid(frontier.points[0].schedule, RING4)


def test_allreduce_frontier_on_a_fabric_that_is_its_own_reverse_walks_once():
    lines: list[str] = []
    frontier = smt.pareto(RING4, Collective("allreduce", 4), ONE_WORKER, lines.append)
    assert sum(": at least" in line for line in lines) == 1  # the allgather walk; reducescatter is its reverse
    assert any("reducescatter on ring:n=4: the allgather frontier run backwards" in line for line in lines)
    schedule = frontier.points[0].schedule
    half = len(schedule.steps) // 2
    assert all(s.op == "reduce" for st in schedule.steps[:half] for s in st.sends)
    assert all(s.op == "copy" for st in schedule.steps[half:] for s in st.sends)


def test_pareto_walk_reports_each_point_and_the_time_left():
    lines: list[str] = []
    smt.pareto(RING4, Collective("allgather", 4), ONE_WORKER, lines.append)
    point = next(line for line in lines if "frontier point 1:" in line)
    assert "(S=2, R=3, C=2), R/C 3/2 (the LP bound)" in point and "of the time limit of 30 s left" in point


def test_dgx1_allgather_frontier_matches_sccl():
    """SCCL's end points: 2 steps (the diameter) and the 7/6 bound at (S=3, R=7, C=6); ~7 s on 2 cores."""
    frontier = smt.pareto(DGX1, Collective("allgather", 8), smt.SmtOptions(time_limit=300))
    ends = [(p.steps, p.rounds, p.chunks) for p in frontier.points]
    assert ends == [(2, 3, 2), (3, 7, 6)] and frontier.complete
    assert frontier.points[-1].rounds_per_chunk == frontier.lp_bound == Fraction(7, 6)
    for point in frontier.points:
        require_valid(point.schedule, DGX1)


# ---- the command line -----------------------------------------------------------------------------


def test_cli_unsat_exits_1_naming_the_instance(capsys):
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "smt", "--steps", "1"]) == 1
    assert "(S=1, R=1, C=1) is unsat" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--chunks", "0"],
        ["--root", "9"],
        ["--steps", "3", "--rounds", "2"],
        ["--pareto", "--steps", "2"],
    ],
)
def test_cli_bad_options_exit_2(argv, capsys):
    assert main(["synth", "broadcast", "-t", "ring:n=4", "--method", "smt", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_time_limit_exits_1_as_unknown(capsys):
    argv = [
        "synth",
        "allgather",
        "-t",
        "dgx1",
        "--method",
        "smt",
        "--steps",
        "3",
        "--rounds",
        "7",
        "--chunks",
        "6",
        "--time-limit",
        "0.3",
    ]
    assert main(argv) == 1
    assert "unknown" in capsys.readouterr().err


def test_cli_pareto_writes_schedules_and_frontier(tmp_path, capsys):
    out = tmp_path / "frontier"
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "smt", "--pareto", "-o", str(out)]) == 0
    doc = json.loads((out / "frontier.json").read_text())
    assert doc["format"] == "weft.frontier/1" and doc["lp_bound"] == 1.5
    point = doc["points"][0]
    assert (point["steps"], point["rounds"], point["chunks"]) == (2, 3, 2)
    assert (out / point["schedule_file"]).is_file()
    assert "(S=2, R=3, C=2): sat" in capsys.readouterr().err


def test_cli_pareto_defaults_to_a_longer_time_limit_and_prints_it(tmp_path, capsys):
    from weft.cli.synth import DEFAULT_TIME_LIMIT, SMT_PARETO_TIME_LIMIT

    assert SMT_PARETO_TIME_LIMIT >= 300 > DEFAULT_TIME_LIMIT
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "smt", "--pareto", "-o", str(tmp_path)]) == 0
    # the solver gets the command's deadline less a reserve for verifying and pricing (weft.cli.synth)
    assert SMT_PARETO_TIME_LIMIT - 10 <= _solver_limit(capsys.readouterr().err) <= SMT_PARETO_TIME_LIMIT
    assert (
        main(
            [
                "synth",
                "allgather",
                "-t",
                "ring:n=4",
                "--method",
                "smt",
                "--pareto",
                "--time-limit",
                "45",
                "-o",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert 45 - 10 <= _solver_limit(capsys.readouterr().err) <= 45


def _solver_limit(err: str) -> float:
    import re

    found = re.search(r"of the time limit of ([0-9.]+) s left", err)
    assert found, err
    return round(float(found.group(1)), 1)


@pytest.mark.parametrize("argv", [["--steps", "100000"], ["--chunks", "100000"]])
def test_an_encoding_too_large_to_write_down_in_time_is_refused_naming_the_options(argv, capsys):
    """Writing the formula down takes about 0.3 ms a send variable before z3 starts, so these would outlast any
    time limit (they ran for minutes): refused at once, in one line."""
    # the limit only guards: the refusal comes before any writing (a 3 s limit can run out first on a loaded machine)
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "smt", *argv, "--time-limit", "60"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "possible sends, more than the SMT encoding's 500000" in err
    assert "use fewer --chunks or --steps" in err


def test_a_formula_not_written_by_its_deadline_is_unknown_within_the_time_limit():
    """Below the size cap but past the limit (10000 steps take ~90 s to write down): unknown after the limit."""
    import time

    start = time.monotonic()
    with pytest.raises(Unknown, match="no answer within the time limit"):
        smt.solve(build("ring:n=4"), Collective("allgather", 4), smt.SmtOptions(steps=10000, time_limit=2, workers=1))
    assert time.monotonic() - start < 2 + idle_s(8)
