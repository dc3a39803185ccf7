"""Inference integration without GPUs: which registry plan a job picks, and which topology keys the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.inference.plans import PlanChoice, disagreement, fixed_reduction_order, safe_back_to_back
from executor.inference.topology import board_spec, machine_topology
from registry.index import Mode
from registry.store import Registry
from topologies.catalog import build
from topologies.detect import load_facts, topology_from_facts
from topologies.errors import TopologyError
from weft import publish
from weft.pipeline import compile_and_verify
from weft.synthesis import synthesize

MINE, OTHER = "hgx_h200:gpus=2", "fully_connected:n=2"
FACTS = Path(__file__).parent / "fixtures" / "nvml"
COMMITTED = Path(__file__).parent.parent / "bench"


def _commit(registry: str, spec: str, method: str, nranks_spec: str | None = None, protocol: str = "ll"):
    topology = build(nranks_spec or spec)
    schedule = synthesize(topology, "allreduce", method)
    plan = compile_and_verify(schedule, topology, protocol=protocol)
    return publish.commit(plan, topology, registry, schedule)


@pytest.fixture(scope="module")
def registry() -> str:
    """A registry holding a one-shot all-reduce for this machine and one for another fabric of two ranks."""
    location = "memory://inference-cpu-two-fabrics"
    _commit(location, MINE, "direct")
    _commit(location, OTHER, "direct")
    return location


def test_entries_of_another_topology_are_never_candidates(registry):
    choice = PlanChoice(Registry(registry), build(MINE).fingerprint, 2)
    assert {e.key.topology for e in choice.entries} == {build(MINE).fingerprint}
    assert len(Registry(registry).entries()) == 2


@settings(max_examples=40, deadline=None)
@given(words=st.integers(1, 1 << 18))
def test_the_chosen_plan_is_always_this_topologys(registry, words):
    mine = build(MINE)
    plan = PlanChoice(Registry(registry), mine.fingerprint, 2).plan("allreduce", 4 * words, "bf16")
    if plan is not None:
        assert plan.weft.topology == mine.fingerprint


def test_a_registry_with_only_another_topologys_plans_gives_nccl():
    location = "memory://inference-cpu-other-only"
    _commit(location, OTHER, "direct")
    choice = PlanChoice(Registry(location), build(MINE).fingerprint, 2)
    assert choice.plan("allreduce", 64 << 10, "bf16") is None


def test_sizes_past_every_plans_range_have_no_plan(registry):
    choice = PlanChoice(Registry(registry), build(MINE).fingerprint, 2)
    assert choice.plan("allreduce", 64 << 10, "bf16") is not None
    assert choice.plan("allreduce", 4 << 20, "bf16") is None  # LL plans stop at 1 MB
    assert choice.plan("allgather", 64 << 10, "bf16") is None


def test_one_shot_sums_have_a_fixed_order_only_on_two_ranks():
    two = compile_and_verify(synthesize(build("hgx_h200:gpus=2"), "allreduce", "direct"), build("hgx_h200:gpus=2"))
    four = compile_and_verify(synthesize(build("hgx_h200:gpus=4"), "allreduce", "direct"), build("hgx_h200:gpus=4"))
    ring = compile_and_verify(synthesize(build("hgx_h200:gpus=4"), "allreduce", "ring"), build("hgx_h200:gpus=4"))
    assert (fixed_reduction_order(two), fixed_reduction_order(four), fixed_reduction_order(ring)) == (True, False, True)


def test_deterministic_mode_skips_one_shot_plans_on_four_ranks():
    location = "memory://inference-cpu-deterministic"
    spec = "hgx_h200:gpus=4"
    _commit(location, spec, "direct")
    _commit(location, spec, "ring", protocol="ll")
    fingerprint = build(spec).fingerprint
    fast = PlanChoice(Registry(location), fingerprint, 4).plan("allreduce", 64 << 10, "bf16")
    fixed = PlanChoice(Registry(location), fingerprint, 4, deterministic=True).plan("allreduce", 64 << 10, "bf16")
    assert fast.weft.solver == "direct" and fixed.weft.solver == "ring"


def test_the_torch_board_guess_matches_nvml_detection():
    detected = topology_from_facts(load_facts(FACTS / "h200x2_nv18.json"))
    assert build(board_spec("NVIDIA H200", 2)).fingerprint == detected.fingerprint


def test_unknown_gpus_get_no_board_guess():
    assert board_spec("NVIDIA L40S", 2) is None and board_spec("NVIDIA H100 80GB HBM3", 16) is None


def test_weft_topology_with_another_rank_count_is_refused():
    with pytest.raises(TopologyError, match="WEFT_TOPOLOGY hgx_h200:gpus=4: nranks: 4 ranks, but the job has 2"):
        machine_topology(2, "hgx_h200:gpus=4")


def test_weft_topology_names_the_registry_key():
    assert machine_topology(2, MINE).fingerprint == build(MINE).fingerprint


def test_a_plan_that_writes_peer_outputs_runs_back_to_back_only_with_its_proof():
    topology = build(MINE)
    ll = compile_and_verify(synthesize(topology, "allgather", "direct"), topology, protocol="ll")
    simple = compile_and_verify(synthesize(topology, "allgather", "direct"), topology, protocol="simple")
    assert safe_back_to_back(ll) and safe_back_to_back(simple)  # the reference executor ran it back to back
    record = dict(simple.weft.verification)
    unproven = [
        simple.with_meta(verification={**record, "back_to_back": 1}),
        simple.with_meta(verification={**record, "ok": False}),
        simple.with_meta(verification={**record, "plan_hash": "0" * 16}),
        simple.with_meta(verification=None),
    ]
    assert not any(safe_back_to_back(p) for p in unproven)


def test_a_double_scratch_simple_plan_needs_three_launches_of_proof():
    topology = build(MINE)
    schedule = synthesize(topology, "allreduce", "direct")
    plan = compile_and_verify(schedule, topology, protocol="simple", double_scratch=True)
    assert plan.weft.verification["back_to_back"] == 3 and safe_back_to_back(plan)
    assert not safe_back_to_back(plan.with_meta(verification={**plan.weft.verification, "back_to_back": 2}))


def test_proven_simple_plans_in_the_registry_are_chosen():
    location = "memory://inference-cpu-simple-only"
    _commit(location, MINE, "direct", protocol="simple")
    plan = PlanChoice(Registry(location), build(MINE).fingerprint, 2).plan("allreduce", 64 << 10, "bf16")
    assert plan is not None and plan.protocol == "Simple"


def test_the_committed_2xh200_registry_runs_its_fastest_measured_plan_per_decode_size():
    """Decode sizes (batch 1-64 of hidden 8192, bf16) are bench sizes: the plan chosen there is the eligible entry
    with the smallest measured time at exactly that size, and it is a measured one."""
    registry = Registry(str(COMMITTED / "registry_h200x2"))
    choice = PlanChoice(registry, build("hgx_h200:gpus=2").fingerprints, 2)
    for batch in (1, 4, 16, 64):
        nbytes = batch * 8192 * 2
        chosen = choice.plan("allreduce", nbytes, "bf16")
        times = {
            e.plan.content_hash: e.measured_us[nbytes]
            for e in choice.entries
            if e.key.collective == "allreduce" and nbytes in (e.measured_us or {})
        }
        assert len(times) >= 10 and chosen.content_hash in times
        assert times[chosen.content_hash] == min(times.values())
    # an entry that is not safe back to back is never eligible, however fast it was measured
    assert all(safe_back_to_back(e.plan) for e in choice.entries)


@pytest.mark.slow  # re-proves every committed plan on the reference executor: the slow tier (issue 35)
@pytest.mark.parametrize("name", ["registry_h200x2", "registry_h200x4", "registry_a2a_h200x2", "registry_a2a_h200x4"])
@pytest.mark.usefixtures("prove_once")  # the run proves each committed plan once (test_registry_roundtrip too)
def test_every_entry_of_the_committed_registries_verifies(name):
    """What the GPU jobs select from is proven: the plan, its launch safety back to back, its verification record."""
    report = publish.verify_registry(str(COMMITTED / name))
    assert report["bad"] == 0, [r for r in report["entries"] if not r["ok"]][:3]


def test_with_ll128_the_committed_2xh200_registry_runs_lines_only_where_they_measured_faster():
    registry = Registry(str(COMMITTED / "registry_h200x2"))
    choice = PlanChoice(registry, build("hgx_h200:gpus=2").fingerprints, 2, ll128=True)
    for batch in (1, 4, 16, 64):
        nbytes = batch * 8192 * 2
        plan, mode = choice.choose("allreduce", nbytes, "bf16")
        lines = mode.lines
        entry = next(e for e in choice.entries if e.plan.content_hash == plan.content_hash)
        table = entry.measured_ll128_us if lines else entry.measured_us
        assert nbytes in table and not (lines and plan.protocol != "LL")
        best = min(
            min(t[nbytes] for t in (e.measured_us, e.measured_ll128_us) if nbytes in t)
            for e in choice.entries
            if e.key.collective == "allreduce" and nbytes in {**e.measured_us, **e.measured_ll128_us}
        )
        assert table[nbytes] == best


@pytest.mark.parametrize("nranks", [2, 4])
def test_the_committed_all_to_all_registries_serve_each_benched_size_with_its_fastest_measured_plan(nranks):
    """bench/registry_a2a_h200x<N> holds the times `weft bench alltoall --record` measured on N H200s
    (bench/results/gpu_alltoall_bf16_graph_<N>xh200.json): at every size of that run, with and without LL128 lines,
    the torch-facing choice is the entry measured fastest there, as for all-reduce."""
    import json

    rows = json.loads((COMMITTED / "results" / f"gpu_alltoall_bf16_graph_{nranks}xh200.json").read_text())["rows"]
    registry = Registry(str(COMMITTED / f"registry_a2a_h200x{nranks}"))
    for ll128 in (False, True):
        choice = PlanChoice(registry, build(f"hgx_h200:gpus={nranks}").fingerprints, nranks, ll128=ll128)
        for nbytes in [r["size"] for r in rows]:
            plan, mode = choice.choose("alltoall", nbytes, "bf16")
            lines = mode.lines
            entry = next(e for e in choice.entries if e.plan.content_hash == plan.content_hash)
            tables = [(e, e.measured_us) for e in choice.entries] + (
                [(e, e.measured_ll128_us) for e in choice.entries] if ll128 else []
            )
            best = min(t[nbytes] for _, t in tables if nbytes in t)
            assert (entry.measured_ll128_us if lines else entry.measured_us)[nbytes] == best, nbytes


def test_the_committed_4xh200_registry_has_fixed_order_plans_for_deterministic_mode():
    choice = PlanChoice(
        Registry(str(COMMITTED / "registry_h200x4")), build("hgx_h200:gpus=4").fingerprints, 4, deterministic=True
    )
    assert {e.plan.weft.solver for e in choice.entries if e.key.collective == "allreduce"} == {"ring", "twoshot"}
    assert choice.plan("allreduce", 64 << 10, "bf16") is not None


def test_an_executor_with_ll128_lines_chooses_by_the_times_measured_with_them():
    location = "memory://inference-cpu-ll128"
    ll = _commit(location, MINE, "direct")
    simple = _commit(location, MINE, "direct", protocol="simple")
    registry, size = Registry(location), 1 << 20
    registry.record_timing(ll.id, size, 14.5)  # LL16 packets
    registry.record_timing(simple.id, size, 10.7)
    registry.record_timing(ll.id, size, 9.3, ll128=True)
    fingerprint = build(MINE).fingerprint
    assert PlanChoice(registry, fingerprint, 2).plan("allreduce", size, "bf16").protocol == "Simple"
    assert PlanChoice(registry, fingerprint, 2, ll128=True).plan("allreduce", size, "bf16").protocol == "LL"
    assert PlanChoice(registry, fingerprint, 2, ll128=True).lines("allreduce", size, "bf16")
    assert not PlanChoice(registry, fingerprint, 2).lines("allreduce", size, "bf16")
    # where the packets measured faster, the same plan runs without lines
    registry.record_timing(ll.id, 1024, 3.5)
    registry.record_timing(ll.id, 1024, 4.0, ll128=True)
    registry.record_timing(simple.id, 1024, 8.0)
    small = PlanChoice(registry, fingerprint, 2, ll128=True)
    assert small.choose("allreduce", 1024, "bf16") == (ll.plan, Mode())


def test_an_executor_that_compiles_plans_chooses_by_the_times_measured_compiled():
    location = "memory://inference-cpu-compiled"
    ll = _commit(location, MINE, "direct")
    simple = _commit(location, MINE, "direct", protocol="simple")
    registry, size = Registry(location), 4096
    registry.record_timing(ll.id, size, 4.6)  # interpreted
    registry.record_timing(simple.id, size, 4.2)
    registry.record_timing(ll.id, size, 3.8, ll128=True, compiled=True)  # its own kernel, with lines
    registry.record_timing(simple.id, size, 3.9, compiled=True)
    fingerprint = build(MINE).fingerprint
    # an executor that compiles nothing never counts compiled times; one that moves no lines, none with lines
    assert PlanChoice(registry, fingerprint, 2, ll128=True).choose("allreduce", size, "bf16") == (simple.plan, Mode())
    assert PlanChoice(registry, fingerprint, 2, compiled=True).choose("allreduce", size, "bf16") == (
        simple.plan,
        Mode(compiled=True),
    )
    both = PlanChoice(registry, fingerprint, 2, ll128=True, compiled=True)
    assert both.choose("allreduce", size, "bf16") == (ll.plan, Mode(lines=True, compiled=True))
    assert both.lines("allreduce", size, "bf16") and both.mode("allreduce", size, "bf16").compiled
    # ranks that disagree on whether they compile must not agree on a basis
    assert both.basis() != PlanChoice(registry, fingerprint, 2, ll128=True).basis()
    # Registry.select says the same to `weft registry select`
    picked = registry.select(fingerprint, "allreduce", size, "bf16", 2, ll128=True, compiled=True)
    assert picked.entry.id == ll.id and picked.lines and picked.compiled and picked.time_us == 3.8
    assert not registry.select(fingerprint, "allreduce", size, "bf16", 2, ll128=True).compiled


def test_ranks_agree_on_plans_only_when_every_view_is_the_same():
    # both communicators (one host, several hosts) ask this of every rank's [topology, PlanChoice.basis] or its reason
    same = [["hgx", ["a", "b"]], ["hgx", ["a", "b"]]]
    assert disagreement(same) == ""
    assert "different topologies, registry entries" in disagreement([["hgx", ["a", "b"]], ["hgx", ["a"]]])
    assert "different topologies" in disagreement([["hgx", ["a"]], ["dgx", ["a"]]])
    assert (
        disagreement([["hgx", ["a"]], "the plan registry cannot be read: x"]) == "the plan registry cannot be read: x"
    )


def test_ranks_whose_registries_differ_only_in_recorded_times_disagree():
    # the same entries with another measured time pick another plan (or LL128 lines) at some size on one rank only,
    # and the ranks' launches then wait for each other's packets until the timeout: weft must not start at all
    fingerprint = build(MINE).fingerprint
    locations = ["memory://inference-cpu-times-a", "memory://inference-cpu-times-b"]
    for location in locations:
        entry = _commit(location, MINE, "direct")
    Registry(locations[1]).record_timing(entry.id, 64 << 10, 9.5)
    a, b = (PlanChoice(Registry(loc), fingerprint, 2).basis() for loc in locations)
    assert a != b and a == PlanChoice(Registry(locations[0]), fingerprint, 2).basis()
    assert "recorded times" in disagreement([[fingerprint, a], [fingerprint, b]])
    assert disagreement([[fingerprint, a], [fingerprint, a]]) == ""
