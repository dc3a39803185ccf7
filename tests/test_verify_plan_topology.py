"""`weft verify PLAN -t TOPO` checks the plan against that fabric, in the user's words; the SMT walk that stops
short of the LP bound says where it stopped."""

from __future__ import annotations

import pytest

from weft.cli import main


@pytest.fixture(scope="module")
def dgx1_plan(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("plan")
    assert main(["synth", "allgather", "-t", "dgx1", "--method", "ring", "--compile", "-o", str(folder)]) == 0
    return str(next(folder.glob("*.plan.json")))


def test_a_plan_verifies_against_its_own_fabric(dgx1_plan, capsys):
    capsys.readouterr()
    assert main(["verify", dgx1_plan, "-t", "dgx1"]) == 0
    assert "ok on the reference executor, for topology dgx1" in capsys.readouterr().out


def test_a_plan_for_another_fabric_of_as_many_ranks_fails_naming_the_fabric_typed(dgx1_plan, capsys):
    capsys.readouterr()
    assert main(["verify", dgx1_plan, "-t", "hgx_h200"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "not hgx_h200 (topo-" in out


def test_a_plan_for_another_rank_count_fails(dgx1_plan, capsys):
    capsys.readouterr()
    assert main(["verify", dgx1_plan, "-t", "ring:n=4"]) == 1
    assert "the plan has 8 ranks, ring:n=4 has 4" in capsys.readouterr().out


def test_an_smt_walk_stopped_by_the_chunk_cap_names_the_cap():
    from schedules.collectives import Collective
    from synth import smt
    from topologies.catalog import build

    ring = build("ring:n=4")  # the LP bound, 3/2 rounds per chunk, needs 2 chunks per rank
    frontier = smt.pareto(ring, Collective("allgather", 4), smt.SmtOptions(max_chunks=1, time_limit=30))
    assert not frontier.complete
    assert frontier.stopped == "chunks per rank capped at 1 (max_chunks) and steps at 6"


def test_registry_commit_for_another_fabric_names_the_fabric_typed(dgx1_plan, tmp_path, capsys):
    capsys.readouterr()
    assert main(["registry", "commit", dgx1_plan, "-t", "hgx_h200", "--registry", str(tmp_path / "r")]) == 2
    assert "not hgx_h200 (topo-" in capsys.readouterr().err
