"""The α-β cost model: predicted time of a schedule for a message size, and nccl-tests bandwidths.

For a message of ``nbytes`` (the nccl-tests size) each chunk is ``collective.chunk_bytes(nbytes)`` bytes.
On the topology's switch-free form (rank-to-rank links plus sharing groups), a step that puts n_l chunks
on link l and n_g chunks on sharing group g takes

    max( max over links l it uses of (latency_l + n_l · chunk_bytes / capacity_l),
         max over groups g it uses of (latency_g + n_g · chunk_bytes / bandwidth_g) )

microseconds, with 1 GB/s = 1e3 bytes/µs. A schedule's time is the sum over its steps; a step with no
sends costs nothing. latency_g is the largest latency of g's links that the step uses: a step bound by a
shared port (a NIC two GPUs share, a switch port) still pays the path's latency, so a switched fabric
does not read as reaching its bandwidth bound at small sizes.

The model charges each link its actual load n_l, not the step's ``rounds``. Rounds are what a solver
promised (at most ``rounds × capacity`` chunks per link, which ``verify`` checks); the actual load is never
more and often less (a link carrying one chunk in a two-round step), so it is the finer model and rounds
only bound it. Where every used link is loaded to its rounds this equals DESIGN's α + rounds·chunk/β.

``loads(schedule, topology)`` does the per-send work once; its ``predict_us`` then costs one pass over the
distinct step shapes per message size, so predicting a schedule for many sizes is cheap.

>>> from schedules.collectives import Collective
>>> from schedules.schedule import Schedule, Send, Step
>>> from topologies.topology import Link, Topology
>>> pair = Topology("pair", 2, (Link(0, 1, 25.0, 2.0), Link(1, 0, 25.0, 2.0)))
>>> s = Schedule(Collective("allgather", 2), pair.fingerprint, (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),))
>>> predict_us(s, pair, 100_000)  # 2 µs + 50 kB at 25 GB/s
4.0
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from schedules.collectives import Collective
from schedules.compact import SendTable, send_table, shape_table, shifted
from schedules.loads import FabricIndex, Loads, count_loads, index_fabric
from schedules.schedule import Schedule
from topologies.topology import Topology
from weftcore.errors import WeftError

BYTES_PER_US_PER_GBPS = 1e3


class CostError(WeftError):
    """A schedule the model cannot price (a send over a missing link) or a meaningless size or time."""


@dataclass(frozen=True)
class StepLoad:
    """What one step puts on the fabric.

    ``links`` holds a (latency µs, µs per chunk byte) term for each distinct link load; ``groups`` the
    same for each distinct sharing-group load, with the latency of the group's links the step uses.
    """

    links: tuple[tuple[float, float], ...]
    groups: tuple[tuple[float, float], ...] = ()

    def time_us(self, chunk_bytes: float) -> float:
        return max((latency + chunk_bytes * per_byte for latency, per_byte in self.links + self.groups), default=0.0)


@dataclass(frozen=True)
class ScheduleLoads:
    """Per-step loads of one schedule on one topology, ready to price at any message size."""

    collective: Collective
    steps: tuple[StepLoad, ...]

    @cached_property
    def _shapes(self) -> tuple[tuple[StepLoad, int], ...]:
        # Collective schedules repeat one step shape many times (a ring has n-1 alike); price each once.
        return tuple(Counter(self.steps).items())

    def step_times_us(self, nbytes: float) -> list[float]:
        chunk_bytes = _chunk_bytes(self.collective, nbytes)
        return [step.time_us(chunk_bytes) for step in self.steps]

    def predict_us(self, nbytes: float) -> float:
        chunk_bytes = _chunk_bytes(self.collective, nbytes)
        return math.fsum(count * step.time_us(chunk_bytes) for step, count in self._shapes)

    def predict_many_us(self, sizes: Iterable[float]) -> list[float]:
        return [self.predict_us(nbytes) for nbytes in sizes]


def loads(schedule: Schedule, topology: Topology) -> ScheduleLoads:
    """Count each step's chunks per link and per sharing group on the topology's switch-free form."""
    fabric = index_fabric(topology)
    if shifted(schedule):  # a pipeline's waves: every step priced by its shape of listed steps
        sends, first = shape_table(schedule)
        by_first = _loads_of(schedule, topology, fabric, sends)
        return ScheduleLoads(schedule.collective, tuple(by_first.steps[i] for i in first.tolist()))
    return _loads_of(schedule, topology, fabric, send_table(schedule))


def _loads_of(schedule: Schedule, topology: Topology, fabric: FabricIndex, sends: SendTable) -> ScheduleLoads:
    link, counted = sends.counted(fabric)
    if (link < 0).any():
        i = int(np.flatnonzero(link < 0)[0])
        raise CostError(
            f"schedule {schedule.name or schedule.collective.name}: steps[{sends.step[i]}]: "
            f"no link {sends.src[i]}->{sends.dst[i]} in topology {topology.name}"
        )
    return _priced(schedule.collective, fabric, counted, schedule.nsteps)


def step_loads(
    collective: Collective, fabric: FabricIndex, step: np.ndarray, link: np.ndarray, nsteps: int
) -> ScheduleLoads:
    """``loads`` from arrays: the step and link index (``FabricIndex.link_index``) of every send.

    Lets a caller price steps it never builds as Send objects (a pipeline's step shapes at 1024 ranks).
    """
    return _priced(collective, fabric, count_loads(fabric, step, link), nsteps)


def _priced(collective: Collective, fabric: FabricIndex, counted: Loads, nsteps: int) -> ScheduleLoads:
    link_terms = _terms(
        counted.link_step, fabric.latency[counted.link], counted.link_count, fabric.capacity[counted.link], nsteps
    )
    group_terms = _group_terms(fabric, counted, nsteps)
    return ScheduleLoads(collective, tuple(StepLoad(link_terms[i], group_terms[i]) for i in range(nsteps)))


def _terms(
    step: np.ndarray, latency: np.ndarray, count: np.ndarray, capacity: np.ndarray, nsteps: int
) -> list[tuple[tuple[float, float], ...]]:
    """Per step, its distinct (latency µs, µs per chunk byte) terms, sorted. The rows are coded as one int
    (step, latency, capacity, count) for a single 1-D unique: at a million rows, uniques over floats took seconds."""
    out: list[tuple[tuple[float, float], ...]] = [()] * nsteps
    if not len(step):
        return out
    latencies, latency_code = np.unique(latency, return_inverse=True)
    capacities, capacity_code = np.unique(capacity, return_inverse=True)
    most = int(count.max()) + 1
    key = ((step * len(latencies) + latency_code.ravel()) * len(capacities) + capacity_code.ravel()) * most + count
    rows = np.unique(key)
    rest, n = np.divmod(rows, most)
    rest, cap = np.divmod(rest, len(capacities))
    step_of, lat = np.divmod(rest, len(latencies))
    lat_values = latencies[lat].tolist()
    slopes = (n / (capacities[cap] * BYTES_PER_US_PER_GBPS)).tolist()
    bounds = np.searchsorted(step_of, np.arange(nsteps + 1)).tolist()
    for i in np.unique(step_of).tolist():
        out[i] = tuple(
            sorted(set(zip(lat_values[bounds[i] : bounds[i + 1]], slopes[bounds[i] : bounds[i + 1]], strict=True)))
        )
    return out


def _group_terms(fabric: FabricIndex, counted: Loads, nsteps: int) -> list[tuple[tuple[float, float], ...]]:
    """Per step, the distinct (latency µs, µs per chunk byte) terms of its sharing groups."""
    if not len(counted.group):
        return [()] * nsteps
    # each (step, link) row belongs to the link's groups (CSR): expand, then take each (step, group)'s
    # largest link latency
    starts = fabric.group_ptr[counted.link]
    lengths = fabric.group_ptr[counted.link + 1] - starts
    firsts = np.cumsum(lengths) - lengths
    member = np.repeat(starts - firsts, lengths) + np.arange(lengths.sum())
    ngroups = max(fabric.ngroups, 1)
    keys = np.repeat(counted.link_step, lengths) * ngroups + fabric.group_ids[member]
    row = np.searchsorted(counted.group_step * ngroups + counted.group, keys)
    latency = np.zeros(len(counted.group))
    np.maximum.at(latency, row, np.repeat(fabric.latency[counted.link], lengths))
    return _terms(counted.group_step, latency, counted.group_count, fabric.group_bandwidth[counted.group], nsteps)


def step_times_us(schedule: Schedule, topology: Topology, nbytes: float) -> list[float]:
    """The predicted time of each step, in µs, for a message of nbytes."""
    return loads(schedule, topology).step_times_us(nbytes)


def predict_us(schedule: Schedule, topology: Topology, nbytes: float) -> float:
    """The predicted time of the whole schedule, in µs, for a message of nbytes (nccl-tests size)."""
    return loads(schedule, topology).predict_us(nbytes)


def algbw(collective: Collective, nbytes: float, time_us: float) -> float:
    """nccl-tests algorithm bandwidth in GB/s: message size over time."""
    _check_size(nbytes)
    if time_us < 0 or math.isnan(time_us):
        raise CostError(f"time: must be a non-negative number of µs, got {time_us!r}")
    if time_us == 0:
        return math.inf if nbytes else 0.0
    return nbytes / (time_us * BYTES_PER_US_PER_GBPS)


def busbw(collective: Collective, nbytes: float, time_us: float) -> float:
    """nccl-tests bus bandwidth in GB/s: algbw times the collective's factor, comparable to link speed."""
    return algbw(collective, nbytes, time_us) * bus_factor(collective)


def bus_factor(collective: Collective) -> float:
    """nccl-tests' busbw/algbw ratio: 2(n-1)/n for allreduce, 1 for broadcast and reduce, else (n-1)/n."""
    return collective.bus_factor


def _check_size(nbytes: float) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise CostError(f"size: must be a non-negative number of bytes, got {nbytes!r}")


def _chunk_bytes(collective: Collective, nbytes: float) -> float:
    _check_size(nbytes)
    return collective.chunk_bytes(nbytes)
