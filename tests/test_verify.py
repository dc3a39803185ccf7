"""The independent verifier: correct schedules pass, each kind of broken schedule is caught and named."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from fabrics import mixed_fabric, random_steps
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules.collectives import Collective
from schedules.schedule import Schedule, Send, Step
from schedules.verify import CHECKS, MAX_LISTED, VerificationFailed, require_valid, verify
from topologies.topology import Link, SharingGroup, Topology
from weftcore.errors import CheckFailed

# ---- hand-built topologies and schedules ------------------------------------------------------------


def ring_topology(n: int, bandwidth: float = 25.0, latency: float = 1.0) -> Topology:
    """A unidirectional ring r -> r+1."""
    return Topology(f"ring{n}", n, tuple(Link(r, (r + 1) % n, bandwidth, latency) for r in range(n)))


def fully_connected(n: int, bandwidth: float = 25.0) -> Topology:
    return Topology(f"fc{n}", n, tuple(Link(s, d, bandwidth, 1.0) for s in range(n) for d in range(n) if s != d))


def star(n: int) -> Topology:
    """n ranks on one switch: the switch-free form shares each rank's uplink and downlink."""
    links = tuple(Link(r, "sw", 25.0, 0.5) for r in range(n)) + tuple(Link("sw", r, 25.0, 0.5) for r in range(n))
    return Topology(f"star{n}", n, links, switches=("sw",))


def ring_allgather(topo: Topology, chunks: int = 1, rounds: int | None = None) -> Schedule:
    """Rank r forwards, at step k, the slice that started on rank r-k; all of a slice's chunks at once."""
    n = topo.nranks
    steps = tuple(
        Step(
            rounds or chunks,
            tuple(Send(((r - k) % n) * chunks + j, r, (r + 1) % n) for r in range(n) for j in range(chunks)),
        )
        for k in range(n - 1)
    )
    return Schedule(Collective("allgather", n, chunks), topo.fingerprint, steps, "ring-allgather")


def direct_allreduce(topo: Topology) -> Schedule:
    """Every rank reduces chunk d straight into rank d, then rank d copies the sum to everyone."""
    n = topo.nranks
    scatter = Step(1, tuple(Send(d, r, d, "reduce") for r in range(n) for d in range(n) if r != d))
    gather = Step(1, tuple(Send(d, d, r) for d in range(n) for r in range(n) if r != d))
    return Schedule(Collective("allreduce", n), topo.fingerprint, (scatter, gather), "direct-allreduce")


def with_steps(schedule: Schedule, steps) -> Schedule:
    return replace(schedule, steps=tuple(steps))


def drop_send(schedule: Schedule, step: int, index: int) -> Schedule:
    steps = list(schedule.steps)
    sends = steps[step].sends
    steps[step] = Step(steps[step].rounds, sends[:index] + sends[index + 1 :])
    return with_steps(schedule, steps)


# ---- correct schedules ------------------------------------------------------------------------------


def test_ring_allgather_verifies():
    result = verify(ring_allgather(ring_topology(6)), ring_topology(6))
    assert result.ok and result.errors == () and result.checks == CHECKS


def test_direct_allreduce_verifies():
    result = verify(direct_allreduce(fully_connected(5)), fully_connected(5))
    assert result.ok and result.errors == ()


def test_require_valid_returns_the_verification():
    topo = ring_topology(4)
    assert require_valid(ring_allgather(topo), topo).checks == CHECKS


def test_rounds_buy_capacity():
    topo = ring_topology(4)
    assert verify(ring_allgather(topo, chunks=3, rounds=3), topo).ok


def test_broadcast_through_a_switch_within_group_capacity_verifies():
    topo = star(4)
    schedule = Schedule(
        Collective("broadcast", 4), topo.fingerprint, (Step(3, tuple(Send(0, 0, d) for d in (1, 2, 3))),)
    )
    assert verify(schedule, topo).ok


# ---- broken schedules, one rule each ------------------------------------------------------------------


def test_dropped_send_leaves_a_postcondition_unmet():
    topo = ring_topology(4)
    result = verify(drop_send(ring_allgather(topo), 2, 1), topo)
    # step 2 rank 1 would have forwarded chunk 3 to rank 2
    assert result.errors == ("postcondition: rank 2 lacks chunk(s) 3 (1 of 4)",)


def test_send_from_a_rank_that_lacks_the_chunk():
    topo = ring_topology(4)
    schedule = ring_allgather(topo)
    first = schedule.steps[0]
    broken = Step(1, (Send(2, 0, 1),) + first.sends[1:])
    result = verify(with_steps(schedule, (broken,) + schedule.steps[1:]), topo)
    assert result.errors[0] == "step 0 send [2, 0->1 copy]: rank 0 does not hold chunk 2"


def test_double_counted_reduction():
    topo = fully_connected(3)
    schedule = direct_allreduce(topo)
    again = Step(1, (Send(0, 1, 0, "reduce"),))
    result = verify(with_steps(schedule, schedule.steps[:1] + (again,) + schedule.steps[1:]), topo)
    assert result.errors == (
        "step 1 send [0, 1->0 reduce]: double-counted: rank 0 already holds the contribution of rank(s) 1 to chunk 0",
    )


def test_double_counted_within_one_step():
    topo = fully_connected(3)
    schedule = Schedule(
        Collective("reduce", 3),
        topo.fingerprint,
        (
            Step(1, (Send(0, 1, 2, "reduce"),)),
            Step(1, (Send(0, 1, 0, "reduce"), Send(0, 2, 0, "reduce"))),
        ),
    )
    result = verify(schedule, topo)
    assert len(result.errors) == 1
    assert (
        "double-counted: chunk 0 reaches rank 0 twice in this step with the contribution of rank(s) 1"
        in result.errors[0]
    )


def test_copy_and_reduce_into_one_chunk_in_one_step():
    topo = fully_connected(3)
    schedule = Schedule(
        Collective("reduce", 3), topo.fingerprint, (Step(1, (Send(0, 1, 0, "reduce"), Send(0, 2, 0, "copy"))),)
    )
    result = verify(schedule, topo)
    assert "rank 0 also receives [0, 1->0 reduce] for chunk 0 in this step" in result.errors[0]


def test_reduce_in_a_collective_that_does_not_combine():
    topo = ring_topology(2)
    schedule = Schedule(
        Collective("allgather", 2), topo.fingerprint, (Step(1, (Send(0, 0, 1, "reduce"), Send(1, 1, 0))),)
    )
    assert verify(schedule, topo).errors[0] == (
        "step 0 send [0, 0->1 reduce]: reduce in allgather, a collective that does not combine"
    )


def test_step_over_a_links_capacity():
    topo = ring_topology(4)
    result = verify(ring_allgather(topo, chunks=2, rounds=1), topo)
    assert result.errors[0] == (
        "step 0: link 0->1 carries 2 chunks, over its capacity of 1 (1 rounds x 1 chunks per round)"
    )
    assert len(result.errors) == 4 * 3  # every link, every step


def test_capacity_tolerates_float_rounding():
    # 61/7 chunks per round times 7 rounds is 60.99999999999999 in floats; the link still carries 61
    topo = Topology("odd", 2, (Link(0, 1, 61.0), Link(1, 0, 7.0)))
    schedule = Schedule(
        Collective("broadcast", 2, chunks=61), topo.fingerprint, (Step(7, tuple(Send(j, 0, 1) for j in range(61))),)
    )
    assert verify(schedule, topo).ok


def test_bonded_link_carries_more_per_round():
    # 0->1 is two bonded 25 GB/s lanes, 1->0 one 50 GB/s lane: each carries two 25 GB/s units per round
    lanes = Topology(
        "bonded", 3, (Link(0, 1, 25.0, 1.0, count=2), Link(1, 0, 50.0, 1.0), Link(1, 2, 25.0), Link(2, 1, 25.0))
    )
    schedule = Schedule(
        Collective("broadcast", 3, chunks=2),
        lanes.fingerprint,
        (Step(1, (Send(0, 0, 1), Send(1, 0, 1))), Step(1, (Send(0, 1, 2),)), Step(1, (Send(1, 1, 2),))),
    )
    assert verify(schedule, lanes).ok


def test_step_over_a_sharing_groups_capacity():
    topo = star(4)
    schedule = Schedule(
        Collective("broadcast", 4), topo.fingerprint, (Step(1, tuple(Send(0, 0, d) for d in (1, 2, 3))),)
    )
    result = verify(schedule, topo)
    assert result.errors == (
        "step 0: sharing group [0->1, 0->2, 0->3; 25 GB/s] carries 3 chunks, over its capacity of 1 "
        "(1 rounds x 1 chunks per round)",
    )


def test_sharing_group_declared_without_switches():
    links = tuple(Link(0, d, 50.0) for d in (1, 2)) + (Link(1, 0, 50.0), Link(2, 0, 50.0))
    topo = Topology("nic", 3, links, sharing=(SharingGroup(((0, 1), (0, 2)), 50.0),))
    schedule = Schedule(Collective("broadcast", 3), topo.fingerprint, (Step(1, (Send(0, 0, 1), Send(0, 0, 2))),))
    assert "sharing group [0->1, 0->2; 50 GB/s] carries 2 chunks" in verify(schedule, topo).errors[0]


def test_send_over_a_missing_link():
    topo = ring_topology(4)
    schedule = Schedule(Collective("broadcast", 4), topo.fingerprint, (Step(1, (Send(0, 0, 2),)),))
    result = verify(schedule, topo)
    assert result.errors[0] == "step 0 send [0, 0->2 copy]: no link 0->2 in topology ring4"


def test_fingerprint_mismatch():
    schedule = ring_allgather(ring_topology(4, bandwidth=25.0))
    other = ring_topology(4, bandwidth=50.0)
    result = verify(schedule, other)
    assert result.errors == (f"topology: the schedule is for {schedule.topology}, not ring4 ({other.fingerprint})",)


def test_switch_free_fingerprint_gets_a_hint():
    topo = star(3)
    schedule = Schedule(
        Collective("broadcast", 3),
        topo.without_switches().fingerprint,
        (Step(1, (Send(0, 0, 1),)), Step(1, (Send(0, 0, 2),))),
    )
    assert "switch-free form's fingerprint" in verify(schedule, topo).errors[0]


def test_wrong_nranks():
    topo = ring_topology(4)
    schedule = Schedule(Collective("allgather", 3), topo.fingerprint, ())
    result = verify(schedule, topo)
    assert result.errors == ("collective allgather: nranks: 3 ranks, but topology ring4 has 4",)
    assert result.checks == ("topology", "nranks")


def test_chunk_that_does_not_exist():
    topo = ring_topology(2)
    schedule = Schedule(Collective("allgather", 2), topo.fingerprint, (Step(1, (Send(7, 0, 1),)),))
    assert verify(schedule, topo).errors[0] == "step 0 send [7, 0->1 copy]: chunk 7 does not exist (2 chunks)"


def test_partial_reduction_names_missing_contributions():
    topo = fully_connected(3)
    schedule = drop_send(direct_allreduce(topo), 0, 0)  # rank 0 never reduces chunk 1 into rank 1
    assert verify(schedule, topo).errors == (
        "postcondition: rank 0 lacks the full sum of chunk(s) 1 (1 of 3; chunk 1 misses rank(s) 0)",
        "postcondition: rank 1 lacks the full sum of chunk(s) 1 (1 of 3; chunk 1 misses rank(s) 0)",
        "postcondition: rank 2 lacks the full sum of chunk(s) 1 (1 of 3; chunk 1 misses rank(s) 0)",
    )


def test_require_valid_raises_with_first_error_and_count():
    topo = ring_topology(4)
    with pytest.raises(VerificationFailed) as caught:
        require_valid(ring_allgather(topo, chunks=2, rounds=1), topo)
    assert isinstance(caught.value, CheckFailed) and caught.value.exit_code == 1
    assert str(caught.value) == (
        "schedule ring-allgather: verification failed: step 0: link 0->1 carries 2 "
        "chunks, over its capacity of 1 (1 rounds x 1 chunks per round) (and 11 more errors)"
    )


def test_errors_beyond_the_listed_ones_are_counted():
    topo = ring_topology(4)
    flood = Step(MAX_LISTED + 200, tuple(Send(0, 0, 2) for _ in range(MAX_LISTED + 200)))
    schedule = Schedule(Collective("broadcast", 4), topo.fingerprint, (flood,))
    result = verify(schedule, topo)
    assert len(result.errors) == MAX_LISTED
    assert result.nerrors == MAX_LISTED + 200 + 3  # plus three unmet postconditions


@pytest.mark.parametrize("build,topo", [(ring_allgather, ring_topology(4)), (direct_allreduce, fully_connected(4))])
def test_every_send_of_a_minimal_schedule_is_needed(build, topo):
    schedule = build(topo)
    for i, step in enumerate(schedule.steps):
        for j in range(len(step.sends)):
            assert not verify(drop_send(schedule, i, j), topo).ok, f"step {i} send {j} was not needed"


# ---- random spanning-tree broadcasts ------------------------------------------------------------------


@st.composite
def tree_broadcasts(draw):
    """A random tree fabric (plus random extra links) and a broadcast down a random spanning tree of it."""
    n = draw(st.integers(2, 9))
    chunks = draw(st.integers(1, 3))
    order = draw(st.permutations(range(n)))
    parent = {order[i]: order[draw(st.integers(0, i - 1))] for i in range(1, n)}
    edges = {(p, c) for c, p in parent.items()} | {(c, p) for c, p in parent.items()}
    extra = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=n))
    edges |= {(s, d) for s, d in extra if s != d}
    topo = Topology("tree", n, tuple(Link(s, d, 25.0, 1.0) for s, d in sorted(edges)))
    root = order[0]
    depth = {root: 0}
    for node in order[1:]:
        depth[node] = depth[parent[node]] + 1
    steps = tuple(
        Step(chunks, tuple(Send(j, parent[c], c) for c in order[1:] if depth[c] == k for j in range(chunks)))
        for k in range(1, max(depth.values()) + 1)
    )
    return topo, Schedule(Collective("broadcast", n, chunks, root), topo.fingerprint, steps, "tree-broadcast")


@settings(max_examples=60, deadline=None)
@given(tree_broadcasts())
def test_random_tree_broadcasts_verify(case):
    topo, schedule = case
    assert verify(schedule, topo).errors == ()


@settings(max_examples=60, deadline=None)
@given(tree_broadcasts(), st.data())
def test_deleting_any_send_of_a_tree_broadcast_fails(case, data):
    topo, schedule = case
    i = data.draw(st.integers(0, schedule.nsteps - 1))
    j = data.draw(st.integers(0, len(schedule.steps[i].sends) - 1))
    assert not verify(drop_send(schedule, i, j), topo).ok


# ---- capacity against a direct count -----------------------------------------------------------------


def capacity_breaches(topo: Topology, steps) -> set[str]:
    fabric = topo.without_switches()
    breaches = set()
    for index, step in enumerate(steps):
        per_link = Counter((s.src, s.dst) for s in step.sends)
        for (src, dst), n in per_link.items():
            if n > math.floor(fabric.chunk_capacity(src, dst) * step.rounds + 1e-9):
                breaches.add(f"step {index}: link {src}->{dst}")
        for group in fabric.sharing:
            n = sum(per_link[key] for key in group.links)
            if n > math.floor(fabric.group_capacity(group) * step.rounds + 1e-9):
                breaches.add(f"step {index}: sharing group [{', '.join(f'{s}->{d}' for s, d in group.links[:3])}")
    return breaches


@settings(max_examples=80, deadline=None)
@given(random_steps())
def test_capacity_errors_match_a_direct_count(steps):
    topo = mixed_fabric()
    schedule = Schedule(Collective("broadcast", 5), topo.fingerprint, steps)
    found = {
        e.split(" carries")[0].split(";")[0].split(", ...")[0]
        for e in verify(schedule, topo).errors
        if " carries " in e
    }
    assert found == capacity_breaches(topo, steps)
