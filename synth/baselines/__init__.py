"""Classic baseline algorithms, each ``(topology, collective) -> Schedule``.

- ``ring``: over a Hamiltonian cycle of the topology (every collective); a slice of several chunks spreads
  over several rings side by side (the reverse cycle, and one ring per GPU across hosts);
- ``direct``: all-pairs, one step (every collective; allreduce is one-shot);
- ``twoshot``: allreduce as a direct reducescatter then a direct allgather;
- ``rhd``: recursive halving/doubling on a power-of-two rank count (every collective);
- ``tree``: NCCL-style double binary tree allreduce; binary-tree broadcast and reduce;
- ``twodh`` (``--method 2dh``): Tutel's two-level all-to-all for several hosts (inside hosts, then across).

Where an algorithm does not exist for the topology or collective it raises NotApplicable saying why.
Link existence and capacity are read on ``topology.without_switches()``; each step gets the fewest rounds
that fit its busiest link and sharing group.

>>> from topologies.topology import Link, Topology
>>> from schedules.collectives import Collective
>>> ring4 = Topology("ring4", 4, tuple(Link(r, (r + 1) % 4, 25.0) for r in range(4)))
>>> ring(ring4, Collective("allgather", 4)).name
'ring-allgather-ring4'
"""

from synth.baselines.common import check_size
from synth.baselines.direct import direct, direct_sends, pair_sends, twoshot, twoshot_sends
from synth.baselines.rhd import rhd, rhd_sends
from synth.baselines.ring import hamiltonian_cycle, ring, ring_sends
from synth.baselines.tree import tree, tree_sends
from synth.baselines.twodh import twodh

METHODS = ("ring", "direct", "twoshot", "rhd", "tree")  # every collective on one host or several
HIERARCHICAL = {"2dh": twodh}  # several hosts, one collective each: the CLI's method name -> the function
SENDS = {"ring": ring_sends, "direct": direct_sends, "twoshot": twoshot_sends, "rhd": rhd_sends, "tree": tree_sends}


def solver(method: str):
    """The baseline function of a ``--method`` name (``direct``, ``2dh``, ...)."""
    return HIERARCHICAL.get(method) or globals()[method]


def check_sends(method: str, fabric: str, collective) -> None:
    """TooLarge where ``method`` would make more sends than this machine expands: a refusal that needs only the
    rank count, so the CLI can give it before reading a large topology file whole (2dh: all pairs' data, its bound)."""
    check_size(method, fabric, collective, SENDS.get(method, pair_sends)(collective))


__all__ = [
    "HIERARCHICAL",
    "METHODS",
    "check_sends",
    "direct",
    "hamiltonian_cycle",
    "rhd",
    "ring",
    "solver",
    "tree",
    "twodh",
    "twoshot",
]
