"""The compact schedule form (``weft.schedule/2``): listed steps plus symmetries that repeat them.

A schedule with generators g_1..g_k (``Symmetry(ranks=σ, chunks=τ, order=m)`` each: a send (chunk c, src s,
dst d) maps to (τ(c), σ(s), σ(d)) with the same op, and g^m is the identity) is, step by step, the union of
the images g_1^j1 ... g_k^jk (T) of its listed steps T over every 0 <= j_i < m_i. A ring all-reduce on 1024
GPUs is then 2046 one-send steps and one rotation instead of two million sends; recursive halving/doubling
is one rank's sends and ten bit flips.

Why verification may look at one chunk per orbit. The generators commute (checked), so each g_i permutes
the images among themselves and the union S is invariant under every g_i. If the pre- and postconditions
are too (rank σ(r) starts with τ(c) exactly when r starts with c, and likewise at the end; checked), then by
induction over the steps, rank σ(r) holds chunk τ(c) after step t exactly when r holds c, with every
contribution renamed by σ: each step's sends of τ(c) are the images of its sends of c. A send is legal, a
write single and a reduction once-only for c exactly when they are for τ(c), so the possession rules and
postconditions hold for every chunk when they hold for one chunk of each orbit of the group. Links and
capacity are not symmetric in general (a ring's rotation is no symmetry of a multi-host fabric), so they
are counted on every send, as arrays.

Waves of a pipeline (``shift`` > 0). A generator that shifts moves image j ``j × shift`` steps later: one wave
of a pipelined tree schedule is listed, and the generator moves it to the next chunk of every tree and one
step on. Such a generator must be the only one, move no rank, and give the listed chunks disjoint images
(τ^j(C) ∩ C = ∅ for 0 < j < m, checked): then the sends of chunk τ^j(c) are exactly image j of the sends of
c, so each chunk's run is a listed chunk's run moved in time, and simulating the listed steps proves every
chunk. The images use the listed rank pairs, so a step's loads are the sum of the listed steps it holds:
capacity and cost are counted once per distinct set of listed steps (a shape), never per send, and the
schedule states each step's rounds (``step_rounds``).

>>> from schedules.collectives import Collective
>>> from schedules.schedule import Schedule, Send, Step, Symmetry
>>> c = Collective("allgather", 3)
>>> ring = Schedule(c, "t", (Step(1, (Send(0, 0, 1),)), Step(1, (Send(0, 1, 2),))), "ring",
...                 symmetries=(Symmetry((1, 2, 0), (1, 2, 0), 3),))
>>> expand(ring).nsends, [s.chunk for s in expand(ring).steps[0].sends]
(6, [0, 1, 2])
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from schedules.collectives import Collective
from schedules.schedule import Schedule, ScheduleError, Send, Step, Symmetry

MAX_EXPANDED_SENDS = 8_000_000  # sends held as arrays (40 bytes each) for link and capacity checks and pricing
MAX_WRITTEN_SENDS = 4_000_000  # sends written out one by one (a Send object each, or a line of JSON)
MAX_STATE = 1 << 26  # rank × chunk cells of the possession simulation and the condition tables


class TooLarge(ScheduleError):
    """A schedule or fabric past what this machine expands; the message names the limit."""


@dataclass(frozen=True, eq=False)
class SendTable:
    """Every send of a schedule as parallel arrays, steps in order; ``reduce`` says which sends reduce."""

    step: np.ndarray
    chunk: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    reduce: np.ndarray
    rounds: np.ndarray  # per step
    weight: int = 1  # how many sends each row stands for (a folded chunk-only generator's order)
    memo: dict[int, tuple[Any, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )  # derived counts, shared by copies

    def counted(self, fabric: Any) -> tuple[Any, ...]:
        """(link of every send, its Loads) on ``fabric`` (a FabricIndex), counted once per table and fabric:
        a baseline, the verifier and the cost model each ask for the same two million sends' loads."""
        from schedules.loads import count_loads

        key = id(fabric)
        if key not in self.memo:
            link = fabric.link_index(self.src, self.dst)
            loads = count_loads(fabric, self.step, link) if (link >= 0).all() else None
            if loads is not None and self.weight != 1:
                loads = replace(
                    loads, link_count=loads.link_count * self.weight, group_count=loads.group_count * self.weight
                )
            self.memo[key] = (fabric, link, loads)
        return self.memo[key][1:]


def listed_table(schedule: Schedule) -> SendTable:
    steps = schedule.steps
    sizes = np.fromiter((len(st.sends) for st in steps), np.int64, len(steps))
    total = int(sizes.sum())
    table = np.fromiter(
        (v for st in steps for s in st.sends for v in (s.chunk, s.src, s.dst, s.op == "reduce")), np.int64, 4 * total
    ).reshape(-1, 4)
    return SendTable(
        np.repeat(np.arange(len(steps), dtype=np.int64), sizes),
        table[:, 0],
        table[:, 1],
        table[:, 2],
        table[:, 3].astype(bool),
        np.fromiter((st.rounds for st in steps), np.int64, len(steps)),
    )


def send_table(schedule: Schedule, whole: bool = False) -> SendTable:
    """All sends, the images of a compact schedule's listed steps included (image-major within a step).

    A generator that moves chunks only (no rank, no shift) is folded unless ``whole``: its images carry the same
    rank pairs in the same steps, so the table holds the other generators' images once, each row standing for
    ``weight`` sends (its order) in the loads. This is only done where the folded table's chunks have disjoint
    images under it (each in its own cycle, of the generator's full order): then the table holds every send of
    each of its chunks, and those chunks stand for their orbits in the simulation (``orbit_representatives``).
    The one-shot all-reduce on 1024 GPUs is then a million rows instead of a billion."""
    if not schedule.symmetries:
        return listed_table(schedule)
    rounds = np.asarray(schedule.step_rounds or [st.rounds for st in schedule.steps], np.int64)
    folded = None if whole else _foldable(schedule)
    others = tuple(g for i, g in enumerate(schedule.symmetries) if i != folded)
    expanded = _expanded(
        tuple(st.sends for st in schedule.steps), others, schedule.nsteps, schedule.name or schedule.collective.name
    )
    if folded is not None and not _disjoint_images(schedule.symmetries[folded], expanded.chunk):
        expanded = _expanded(
            tuple(st.sends for st in schedule.steps),
            schedule.symmetries,
            schedule.nsteps,
            schedule.name or schedule.collective.name,
        )
        folded = None
    weight = 1 if folded is None else schedule.symmetries[folded].order
    return replace(expanded, rounds=rounds, weight=weight)  # shares the expansion's counted loads if not folded


def _foldable(schedule: Schedule) -> int | None:
    """The index of the one generator that moves chunks only (no rank, no shift), if exactly one does."""
    if shifted(schedule):
        return None
    still = [i for i, g in enumerate(schedule.symmetries) if g.ranks == tuple(range(len(g.ranks)))]
    return still[0] if len(still) == 1 else None


def _disjoint_images(g: Symmetry, chunks: np.ndarray) -> bool:
    """Whether g^j moves ``chunks`` off themselves for every 0 < j < order: no two in one cycle of g's chunk map,
    and each on a cycle as long as g's order."""
    label, sizes = _cycles(np.asarray(g.chunks, np.int64))
    listed = np.unique(chunks)
    if len(listed) and (listed.min() < 0 or listed.max() >= len(label)):
        return False  # chunks that do not exist: the verifier reports them, on the whole expansion
    return len(np.unique(label[listed])) == len(listed) and bool((sizes[label[listed]] == g.order).all())


@lru_cache(maxsize=2)
def _expanded(
    sends: tuple[tuple[Send, ...], ...], symmetries: tuple[Symmetry, ...], nsteps: int, name: str
) -> SendTable:
    """The expansion of listed sends, kept for the next caller (rounds aside, which it does not depend on)."""
    steps = tuple(Step(1, s) for s in sends)
    schedule = Schedule(Collective("allgather", 1), "", steps, name, symmetries=symmetries)
    listed = listed_table(schedule)
    total = schedule.images * len(listed.step)
    if total > MAX_EXPANDED_SENDS:
        raise TooLarge(
            f"schedule {schedule.name or schedule.collective.name}: {total:,} sends, over the "
            f"{MAX_EXPANDED_SENDS:,} this machine expands (MAX_EXPANDED_SENDS)"
        )
    step, chunk, src, dst, reduce = listed.step, listed.chunk, listed.src, listed.dst, listed.reduce
    for g in schedule.symmetries:
        sigma, tau = np.asarray(g.ranks, np.int64), np.asarray(g.chunks, np.int64)
        parts = []
        c, s, d = chunk, src, dst
        for j in range(g.order):
            parts.append((c, s, d, step + j * g.shift))
            c, s, d = tau[c], sigma[s], sigma[d]
        chunk, src, dst, step = (np.concatenate([p[k] for p in parts]) for k in range(4))
        reduce = np.tile(reduce, g.order)
    order = np.argsort(step, kind="stable")
    return SendTable(step[order], chunk[order], src[order], dst[order], reduce[order], np.ones(nsteps, np.int64))


def shifted(schedule: Schedule) -> bool:
    """Whether the schedule's symmetry moves its images in time (a pipeline's waves)."""
    return any(g.shift for g in schedule.symmetries)


def shapes(schedule: Schedule) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """For a shifted schedule: the distinct sets of listed steps that run together (first seen first), and the
    shape of every step of the whole schedule."""
    g = schedule.symmetries[0]
    found: dict[tuple[int, ...], int] = {}
    shape_of = np.zeros(schedule.nsteps, np.int64)
    listed = len(schedule.steps)
    for t in range(schedule.nsteps):
        shape = tuple(
            d for d in range(max(0, t - (g.order - 1) * g.shift), min(listed - 1, t) + 1) if (t - d) % g.shift == 0
        )
        shape_of[t] = found.setdefault(shape, len(found))
    return list(found), shape_of


def shape_table(schedule: Schedule) -> tuple[SendTable, np.ndarray]:
    """The sends of each shape of a shifted schedule, each at the first step of that shape, with the fewest rounds
    any step of the shape has; and the first step of every step's shape."""
    listed = listed_table(schedule)
    found, shape_of = shapes(schedule)
    first = np.full(len(found), schedule.nsteps, np.int64)
    np.minimum.at(first, shape_of, np.arange(schedule.nsteps))
    rounds = np.asarray(schedule.step_rounds, np.int64).copy()
    fewest = np.full(len(found), np.iinfo(np.int64).max)
    np.minimum.at(fewest, shape_of, rounds)
    rounds[first] = fewest
    bounds = np.searchsorted(listed.step, np.arange(len(schedule.steps) + 1))
    rows = [np.arange(bounds[d], bounds[d + 1]) for shape in found for d in shape]
    at = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    step = np.repeat(first, [sum(bounds[d + 1] - bounds[d] for d in shape) for shape in found])
    table = SendTable(step, listed.chunk[at], listed.src[at], listed.dst[at], listed.reduce[at], rounds)
    return table, first[shape_of]


def expand(schedule: Schedule) -> Schedule:
    """The explicit schedule (``weft.schedule/1``) a compact one stands for, each step's sends in (src, dst, chunk)
    order; itself if it is explicit."""
    if not schedule.symmetries:
        return schedule
    if schedule.nsends > MAX_WRITTEN_SENDS:
        raise TooLarge(
            f"schedule {schedule.name or schedule.collective.name}: {schedule.nsends:,} sends written "
            f"out, over the {MAX_WRITTEN_SENDS:,} this machine holds (MAX_WRITTEN_SENDS); the compact "
            "form is verified and priced as it is"
        )
    table = send_table(schedule, whole=True)
    # within a step, sends in (src, dst, chunk) order: the order the baselines wrote them in before they were
    # compact, so a compiled plan is the same plan
    order = np.lexsort((table.chunk, table.dst, table.src, table.step))
    table = SendTable(
        table.step[order], table.chunk[order], table.src[order], table.dst[order], table.reduce[order], table.rounds
    )
    bounds = np.searchsorted(table.step, np.arange(schedule.nsteps + 1))
    ops = np.where(table.reduce, "reduce", "copy").tolist()
    sends = list(map(Send, table.chunk.tolist(), table.src.tolist(), table.dst.tolist(), ops))
    rounds = table.rounds.tolist()
    steps = tuple(Step(rounds[i], tuple(sends[bounds[i] : bounds[i + 1]])) for i in range(schedule.nsteps))
    return replace(schedule, steps=steps, symmetries=(), step_rounds=())


def _cycles(perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cycle of each element of a permutation, and each cycle's length."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    size = len(perm)
    _, label = connected_components(
        csr_matrix((np.ones(size), (np.arange(size), perm)), shape=(size, size)), directed=True, connection="weak"
    )
    return label, np.bincount(label)


def _cycle_lengths(perm: np.ndarray) -> set[int]:
    return set(_cycles(perm)[1].tolist())


def symmetry_errors(schedule: Schedule) -> list[str]:
    """Why the generators are not symmetries: a map that is no permutation, g^order not the identity,
    generators that do not commute, or pre- or postconditions that they do not preserve."""
    c = schedule.collective
    errors = []
    maps = []
    for i, g in enumerate(schedule.symmetries):
        for name, perm, size in (("ranks", g.ranks, c.nranks), ("chunks", g.chunks, c.nchunks)):
            array = np.asarray(perm, np.int64)
            if len(array) != size or not np.array_equal(np.sort(array), np.arange(size)):
                errors.append(f"symmetries[{i}].{name}: must be a permutation of 0..{size - 1}")
            elif any(g.order % n for n in _cycle_lengths(array)):
                errors.append(f"symmetries[{i}].{name}: applied {g.order} times (its order) it is not the identity")
        maps.append((np.asarray(g.ranks, np.int64), np.asarray(g.chunks, np.int64)))
    if errors:
        return errors
    errors = _shift_errors(schedule)
    if errors:
        return errors
    for i, (sa, ta) in enumerate(maps):
        for j, (sb, tb) in enumerate(maps[:i]):
            if not (np.array_equal(sa[sb], sb[sa]) and np.array_equal(ta[tb], tb[ta])):
                errors.append(f"symmetries[{j}] and symmetries[{i}] do not commute")
    return errors or _invariance_errors(schedule, maps)


def _shift_errors(schedule: Schedule) -> list[str]:
    """The rules a shifting generator (a pipeline's waves) must keep for its proof to hold."""
    if not shifted(schedule):
        return (
            ["step_rounds: only a schedule whose symmetry shifts in time states them"] if schedule.step_rounds else []
        )
    g = schedule.symmetries[0]
    if len(schedule.symmetries) > 1:
        return ["symmetries: a generator that shifts in time must be the only one"]
    if g.ranks != tuple(range(len(g.ranks))):
        return ["symmetries[0].ranks: a generator that shifts in time must leave every rank in place"]
    expected = len(schedule.steps) + (g.order - 1) * g.shift
    if len(schedule.step_rounds) != expected:
        return [
            f"step_rounds: {len(schedule.step_rounds)} entries, but {len(schedule.steps)} listed steps shifted "
            f"{g.order - 1} times by {g.shift} make {expected} steps"
        ]
    listed = np.unique(listed_table(schedule).chunk)
    tau = np.asarray(g.chunks, np.int64)
    image = listed
    for j in range(1, g.order):
        image = tau[image]
        if np.isin(image, listed).any():
            return [
                f"symmetries[0]: image {j} of the listed chunks meets them again (a shifted wave must carry "
                "other chunks)"
            ]
    return []


def condition_table(schedule: Schedule, post: bool) -> np.ndarray:
    """rank × chunk: whether the rank holds (post: must end with) the chunk."""
    c = schedule.collective
    if c.nranks * c.nchunks > MAX_STATE:
        raise TooLarge(
            f"collective {c.name}: {c.nranks} ranks × {c.nchunks} chunks, over the {MAX_STATE:,} cells "
            "this machine simulates (MAX_STATE)"
        )
    table = np.zeros((c.nranks, c.nchunks), bool)
    for rank in range(c.nranks):
        chunks = c.postcondition(rank) if post else c.precondition(rank)
        if len(chunks) == c.nchunks:
            table[rank] = True  # every chunk: no need to walk a million of them
        else:
            table[rank, np.fromiter(chunks, np.int64, len(chunks))] = True
    return table


def _invariance_errors(schedule: Schedule, maps: list[tuple[np.ndarray, np.ndarray]]) -> list[str]:
    errors = []
    for post, what in ((False, "precondition"), (True, "postcondition")):
        table = condition_table(schedule, post)
        for i, (sigma, tau) in enumerate(maps):
            moved = table[np.ix_(sigma, tau)]  # moved[r, c] = table[σ(r), τ(c)]
            if not np.array_equal(moved, table):
                r, ch = (int(x[0]) for x in np.nonzero(moved != table))
                errors.append(
                    f"symmetries[{i}]: the {what} is not invariant: rank {r} and chunk {ch} map to rank "
                    f"{sigma[r]} and chunk {tau[ch]}, which differ in what they hold"
                )
    return errors


def orbit_representatives(schedule: Schedule) -> np.ndarray:
    """chunk -> whether it is its orbit's representative under the generators' chunk maps: a listed chunk where
    the orbit has one (a shifted schedule), else the orbit's smallest chunk."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    size = schedule.collective.nchunks
    rows = np.concatenate([np.arange(size)] * len(schedule.symmetries))
    cols = np.concatenate([np.asarray(g.chunks, np.int64) for g in schedule.symmetries])
    _, label = connected_components(
        csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(size, size)), directed=True, connection="weak"
    )
    first = np.full(label.max() + 1, size, np.int64)
    np.minimum.at(first, label, np.arange(size))
    if shifted(schedule):  # listed chunks stand for their orbits (disjoint images: one per orbit)
        listed = np.unique(listed_table(schedule).chunk)
        first[label[listed]] = listed
    else:
        table = send_table(schedule)
        if table.weight != 1:  # a folded generator: the table's chunks have all their sends in it (send_table)
            held = np.unique(table.chunk)
            first[label[held]] = held
    held_here: np.ndarray = first[label] == np.arange(size)
    return held_here
