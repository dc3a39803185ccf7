"""Test fabrics and schedule strategies shared by the verifier and cost-model tests."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from schedules.schedule import Send, Step
from topologies import Link, Topology


def mixed_fabric() -> Topology:
    """Direct links of two speeds beside a switch, so the switch-free form mixes plain and shared links."""
    links = [Link(r, "sw", 50.0, 0.5) for r in range(5)] + [Link("sw", r, 25.0 * (1 + r % 2), 0.5) for r in range(5)]
    links += [Link(0, 1, 100.0, 0.2), Link(1, 0, 100.0, 0.2), Link(2, 3, 25.0, 0.7, count=3)]
    return Topology("mixed", 5, tuple(links), switches=("sw",))


def shared_nic_fabric() -> Topology:
    """Two hosts of two GPUs on NVLink; each host's GPUs share one NIC (12.5 GB/s) over PCIe (16 GB/s each), so
    the switch-free form's cross-host links share the NIC's capacity in sharing groups."""
    links = [Link(0, 1, 100.0, 0.3), Link(1, 0, 100.0, 0.3), Link(2, 3, 100.0, 0.3), Link(3, 2, 100.0, 0.3)]
    for r in range(4):
        tx, rx = f"h{r // 2}.tx", f"h{r // 2}.rx"
        links += [Link(r, tx, 16.0, 1.0), Link(rx, r, 16.0, 1.0)]
    for h in range(2):
        links += [Link(f"h{h}.tx", "ib", 12.5, 1.0), Link("ib", f"h{h}.rx", 12.5, 1.0)]
    return Topology(
        "shared_nic", 4, tuple(links), switches=("h0.tx", "h0.rx", "h1.tx", "h1.rx", "ib"), hosts=(0, 0, 1, 1)
    )


def shared_hub_fabric() -> Topology:
    """A one-way NVLink ring of three GPUs beside a PCIe switch whose hub feeds all three at 20 GB/s in total:
    the ranks can receive 50 GB/s together, not the 78 GB/s their in-links add up to."""
    links = [Link(r, (r + 1) % 3, 10.0, 0.3) for r in range(3)]
    links += [Link(r, "sw", 16.0, 1.0) for r in range(3)] + [Link("hub", r, 16.0, 1.0) for r in range(3)]
    links.append(Link("sw", "hub", 20.0, 1.0))
    return Topology("shared_hub", 3, tuple(links), switches=("sw", "hub"))


@st.composite
def random_steps(draw):
    """Steps of chunk 0 sends between random rank pairs of mixed_fabric()."""
    pairs = st.tuples(st.integers(0, 4), st.integers(0, 4)).filter(lambda p: p[0] != p[1])
    return tuple(
        Step(draw(st.integers(1, 3)), tuple(Send(0, s, d) for s, d in draw(st.lists(pairs, max_size=14))))
        for _ in range(draw(st.integers(1, 4)))
    )


def ring_files(folder: Path) -> tuple[Path, Path]:
    """A verified ring all-gather schedule on ring:n=4 and its proven plan, written into ``folder``."""
    from weft.cli import main

    schedule, plan = folder / "ring.json", folder / "ring.plan.json"
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "-o", str(schedule)]) == 0
    assert main(["compile", str(schedule), "-t", "ring:n=4", "-o", str(plan)]) == 0
    return schedule, plan
