"""The port engine's programs: a Plan as each rank's sequence of local sums and point-to-point exchanges.

A host proxy runs port channels over an existing engine's point-to-point sends and receives (NCCL, gloo). Both
sides of every hop know the plan, so the hops can be fixed ahead of time: one valid run of the whole plan (every
thread block of every rank, interleaved as its signals, waits, semaphores and barriers allow) puts every data op
in a global order. Each op then becomes, on the ranks it touches, the same point in their sequences:

- a put (``put``/``pws``, or the remote destinations of ``res``): a send on the writer, a receive into the
  destination on its owner;
- a remote read (``get``, the remote sources of ``rre``/``rres``, memory channels only): a send on the owner, a
  receive on the reader (into the destination, or a staging slot ``t`` that the sum then reads);
- a local ``copy``/``re`` (or the local part of the above): a sum (one source: a copy) on the rank.

Signals, waits, flushes, semaphores and barriers leave nothing: a receive completes before the receiver's later
steps, which is what the wait after a signal guaranteed. Consecutive transfers of a rank form one ``Exchange``
(one group of sends and receives that progress together) unless a receive would overwrite what the group
already reads or writes. Because every rank follows the one global order and each hop's two sides sit at the
same place in it, the groups complete in order: no rank waits on a peer that waits on it.

LL plans run as their data: a packet op moves the values its packets carry, and an op that reads packets waits,
in the global order, until every chunk it reads was written as packets (on the GPU a reader spins on the packets'
flags; here the receive before it completes first). An in-place plan's input and output are one buffer ``io``
(the smaller the rank's slice of the larger, as ``Collective.inplace_offsets`` places it), so the groups see
every overlap between them. The plan must have been proven (``executor.reference.prove.check_plan``).

>>> from schedules.plan import parse_plan
>>> doc = {"name": "x", "collective": "allgather", "protocol": "Simple", "gpus": [
...     {"id": r, "input_chunks": 1, "output_chunks": 2,
...      "channels": [{"channel_type": "port", "connected_to": [1 - r]}],
...      "remote_buffers": [{"rank": 1 - r, "type": "o", "access_channel_types": ["port"]}],
...      "threadblocks": [{"id": 0, "channels": [{"channel_type": "port", "channel_ids": [0]}],
...       "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0]}], "ops": [
...       {"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
...        "dst_buff": [{"type": "o", "index": r, "size": 1}]},
...       {"name": "pws", "channel_type": "port", "channel_ids": [0],
...        "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"buffer_id": 0, "index": r, "size": 1}]},
...       {"name": "wait", "channel_type": "port", "channel_ids": [0]},
...       {"name": "flush", "channel_type": "port", "channel_ids": [0]}]}]} for r in range(2)]}
>>> [str(step) for step in compile_programs(parse_plan(doc, "x.json"))[0].steps]
['o[0:1] = i[0:1]', 'exchange(send i[0:1] to 1 over port, recv o[1:2] from 1 over port)']
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from executor.errors import ExecutorError
from schedules.plan.types import BufferRef, Gpu, Op, Plan, Threadblock, channel_pairs, remote_target


@dataclass(frozen=True)
class Slot:
    """Chunks ``index``.. ``index + size - 1`` of one of the rank's buffers: ``i``, ``o``, ``io`` (an in-place
    plan's one buffer), ``s`` (scratch) or ``t`` (the engine's staging for remote reads and sums that have no local
    destination)."""

    buffer: str
    index: int
    size: int

    def overlaps(self, other: Slot) -> bool:
        return (
            self.buffer == other.buffer
            and self.index < other.index + other.size
            and other.index < self.index + self.size
        )

    def __str__(self) -> str:
        return f"{self.buffer}[{self.index}:{self.index + self.size}]"


@dataclass(frozen=True)
class Transfer:
    """One side of a hop: send ``slot`` to ``peer``, or receive ``peer``'s data into ``slot``."""

    peer: int
    slot: Slot
    send: bool
    channel_type: str

    def __str__(self) -> str:
        return (
            f"send {self.slot} to {self.peer}" if self.send else f"recv {self.slot} from {self.peer}"
        ) + f" over {self.channel_type}"


@dataclass(frozen=True)
class Exchange:
    """Transfers that progress together (one group of point-to-point calls)."""

    transfers: tuple[Transfer, ...]

    def __str__(self) -> str:
        return f"exchange({', '.join(map(str, self.transfers))})"


@dataclass(frozen=True)
class Compute:
    """Every destination gets the sum of the sources, added in order (one source: a copy)."""

    srcs: tuple[Slot, ...]
    dsts: tuple[Slot, ...]

    def __str__(self) -> str:
        return f"{', '.join(map(str, self.dsts))} = {' + '.join(map(str, self.srcs))}"


Step = Exchange | Compute
# The data ops a program lowers (their meaning is their row in schedules.ops); any other is refused by name.
LOWERED = frozenset(
    {
        "copy",
        "put",
        "pws",
        "pwsf",
        "get",
        "re",
        "res",
        "rre",
        "rres",
        "ppkt",
        "rppkt",
        "upkt",
        "cpkt",
        "repkt",
        "respkt",
        "recpkt",
        "recspkt",
    }
)
INPLACE = "io"  # an in-place plan's one buffer
ROUND_END = None  # in a rank's actions: a span of the global order's rounds ended (compile_programs(closed=True))


@dataclass(frozen=True)
class Program:
    """What one rank runs for one plan: its steps, and the staging chunks they use."""

    rank: int
    steps: tuple[Step, ...]
    staging_chunks: int

    @property
    def peers(self) -> tuple[int, ...]:
        return tuple(sorted({t.peer for s in self.steps if isinstance(s, Exchange) for t in s.transfers}))


def compile_programs(plan: Plan, closed: bool = False) -> tuple[Program, ...]:
    """Every rank's Program for ``plan`` (proven beforehand).

    ``closed``: a group holds the hops of one span of consecutive rounds of the global order only, so the other side
    of each of its hops sits in a group of the same span on the peer. Otherwise a group may hold a receive whose send
    comes in the peer's next group; that completes only if NCCL runs every operation of the group at once, which it
    does for a few operations and not for many (lanes split a slot of several chunks into one operation per chunk).
    A span is as many rounds as leave every rank one group (``_spans``): each group costs a launch and, between
    hosts, a network round trip, and the rounds cut hops that could go together apart (a thread block's puts to one
    peer, a pair's two directions)."""
    rounds: list[list[list]] = []
    staging = 0
    for ops in global_rounds(plan):
        actions: dict[int, list] = defaultdict(list)
        for rank, tb, index in ops:
            staging = max(staging, _lower(plan, rank, tb, index, actions))
        rounds.append([actions[r] for r in range(plan.nranks)])
    if closed:
        spans = _spans(rounds)
        every = [[a for span in spans for a in _sums_last(span[r]) + [ROUND_END]] for r in range(plan.nranks)]
    else:
        every = [[a for one in rounds for a in one[r]] for r in range(plan.nranks)]
    return tuple(Program(r, _group(every[r]), staging) for r in range(plan.nranks))


def _spans(rounds: list[list[list]]) -> list[list[list]]:
    """The rounds (each: every rank's actions) merged into spans of consecutive rounds, each as long as every rank's
    actions in it still form one group of transfers once its sums are placed (``_sums_last``): a send of what the
    span receives, or a sum between a receive and a send, ends the span before the round that needs it. A round
    that needs two groups on its own stays a span of its own. All ranks cut at the same rounds, so each hop's two
    sides stay in one span."""
    spans: list[list[list]] = []
    extendable = False  # the last span is one group on every rank
    for one in rounds:  # a rank with nothing in a round keeps its span's one group
        if extendable and all(_groups(span + new) <= 1 for span, new in zip(spans[-1], one, strict=True) if new):
            for span, new in zip(spans[-1], one, strict=True):
                span.extend(new)
        else:
            spans.append([list(new) for new in one])
            extendable = all(_groups(new) <= 1 for new in one if new)
    return spans


def _groups(actions: list) -> int:
    """How many groups of transfers a span's actions of one rank form."""
    return sum(isinstance(s, Exchange) for s in _group(_sums_last(actions)))


def _sums_last(actions: list) -> list:
    """One span of a rank's actions with the sums that touch none of the span's transfers, nor a later sum that
    keeps its place, moved after them, and each sum that must stay (a later send reads what it writes) moved ahead
    of the earlier transfers it touches nothing of: the span's transfers then form one group, not one before the
    sum and one after (a peer's matching transfers sit in one group of its own span: a reduce-send's receive from
    a peer and send to it, ordered [receive, sum, send] on one rank and [sum, send, receive] on the other)."""

    def writes(a) -> tuple:
        return a.dsts if isinstance(a, Compute) else () if a.send else (a.slot,)

    def reads(a) -> tuple:
        return a.srcs if isinstance(a, Compute) else (a.slot,) if a.send else ()

    def clash(a, b) -> bool:
        return any(x.overlaps(y) for x in writes(a) for y in writes(b) + reads(b)) or any(
            x.overlaps(y) for x in writes(b) for y in reads(a)
        )

    kept: list = []
    moved: list = []
    for a in reversed(actions):  # a sum moves if nothing after it that stays touches what it touches
        if (
            isinstance(a, Compute)
            and not any(clash(a, b) for b in kept)
            and not any(clash(a, t) for t in actions if isinstance(t, Transfer))
        ):
            moved.append(a)
        else:
            kept.append(a)
    kept.reverse()
    for i in range(len(kept)):  # each staying sum ahead of the transfers before it that it touches nothing of
        j = i
        while j > 0 and isinstance(kept[j], Compute) and not isinstance(kept[j - 1], Compute):
            if clash(kept[j], kept[j - 1]):
                break
            kept[j - 1], kept[j] = kept[j], kept[j - 1]
            j -= 1
    return kept + moved[::-1]


def placed(plan: Plan, rank: int, buffer: str, index: int) -> tuple[str, int]:
    """Where chunk ``index`` of rank's ``buffer`` lives: in an in-place plan its input and output are one buffer
    (``io``, as large as the larger), the smaller at the rank's slice of it."""
    if not plan.inplace or buffer not in ("i", "o"):
        return buffer, index
    g = plan.gpus[rank]
    at_in, at_out = plan.inplace_offsets(rank, g.input_chunks, g.output_chunks)
    return INPLACE, index + (at_in if buffer == "i" else at_out)


def global_order(plan: Plan) -> list[tuple[int, int, int]]:
    """(rank, thread block, op index) of every op in one run that every signal, wait, semaphore and barrier allows."""
    return [op for ops in global_rounds(plan) for op in ops]


def global_rounds(plan: Plan) -> list[list[tuple[int, int, int]]]:
    """``global_order`` in rounds: each round runs at most one op of every thread block that can go on."""
    pc = {(r, tb.id): 0 for r, g in enumerate(plan.gpus) for tb in g.threadblocks}
    state = _SyncState(plan)
    order: list[list[tuple[int, int, int]]] = []
    live = sorted(pc)
    while live:  # rounds of one op per thread block, so that the hops that can go together are neighbours
        progressed = False
        order.append([])
        for r, t in live:
            ops = plan.gpus[r].threadblocks[t].ops
            if pc[(r, t)] < len(ops) and state.ready(r, t, ops[pc[(r, t)]]):
                state.run(r, t, ops[pc[(r, t)]])
                order[-1].append((r, t, pc[(r, t)]))
                pc[(r, t)] += 1
                progressed = True
        live = [k for k in live if pc[k] < len(plan.gpus[k[0]].threadblocks[k[1]].ops)]
        if live and not progressed:
            stuck = ", ".join(f"rank {r} threadblock {t} op {pc[(r, t)]}" for r, t in live[:3])
            raise ExecutorError(f"plan {plan.name}: no run of the plan gets past {stuck} (prove it with weft verify)")
    return order


def _target(gpu: Gpu, tb: Threadblock, op: Op, ref: BufferRef, rank: int) -> tuple[int, str]:
    """The rank and buffer type an entry names: a peer's (reached through the op's channel) or this rank's own."""
    if ref.remote:
        return remote_target(gpu, tb, op, ref)
    assert ref.type is not None  # parse_plan gave every local entry its type
    return rank, ref.type


def _transfer(program: Program, step: int, k: int) -> Transfer:
    exchange = program.steps[step]
    assert isinstance(exchange, Exchange)  # only an exchange posts transfers
    return exchange.transfers[k]


class _SyncState:
    """What ``global_rounds`` tracks while ops run: signals sent and waited, semaphores, barrier arrivals, and the
    chunks written as packets so far."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.pairs = {t: channel_pairs(plan, t) for t in ("memory", "port")}
        self.inbound: Counter[tuple[object, ...]] = Counter()
        self.consumed: Counter[tuple[object, ...]] = Counter()
        self.sems = {(r, s): v for r, g in enumerate(plan.gpus) for s, v in enumerate(g.semaphores)}
        self.arrived: dict[tuple[object, ...], set[int]] = defaultdict(set)
        self.generation: Counter[tuple[object, ...]] = Counter()
        self.packets: set[tuple[int, str, int]] = set()  # (rank, buffer, chunk) written as packets so far

    def packet_chunks(self, r: int, t: int, op: Op, reading: bool) -> list[tuple[int, str, int]]:
        """The chunks op reads as packets (all local), or writes as packets (local or on a peer)."""
        plan = self.plan
        gpu, tb = plan.gpus[r], plan.gpus[r].threadblocks[t]
        entries = (
            [ref for k, ref in enumerate(op.src_buff) if op.spec.reads_packet(k)]
            if reading
            else [ref for k, ref in enumerate(op.dst_buff) if op.spec.writes_packet(ref.remote, k)]
        )
        out = []
        for ref in entries:
            owner, type = _target(gpu, tb, op, ref, r)
            out += [(owner,) + placed(plan, owner, type, ref.index + j) for j in range(ref.size)]
        return out

    def ready(self, r: int, t: int, op: Op) -> bool:
        if op.spec.packet_src and not all(c in self.packets for c in self.packet_chunks(r, t, op, True)):
            return False
        if op.spec.device == "wait":
            need = Counter((op.channel_type, r, c) for c in op.channel_ids)
            return all(self.inbound[e] >= self.consumed[e] + n for e, n in need.items())
        if op.spec.device == "sem_acquire":
            held = Counter(op.semaphore_ids)
            return all(self.sems[(r, s)] >= n for s, n in held.items())
        if op.spec.device == "barrier":
            key = (r, op.barrier_id, self.generation[(r, t, op.barrier_id)])
            self.arrived[key].add(t)
            assert op.num_threadblocks is not None  # parse_plan required it of a barrier
            return len(self.arrived[key]) >= op.num_threadblocks
        return True

    def run(self, r: int, t: int, op: Op) -> None:
        if op.spec.packet_dst:
            self.packets.update(self.packet_chunks(r, t, op, False))
        if op.spec.device == "wait":
            for c in op.channel_ids:
                self.consumed[(op.channel_type, r, c)] += 1
        elif op.spec.device == "sem_acquire":
            for s in op.semaphore_ids:
                self.sems[(r, s)] -= 1
        elif op.spec.device == "sem_release":
            for s in op.semaphore_ids:
                self.sems[(r, s)] += 1
        elif op.spec.device == "barrier":
            self.generation[(r, t, op.barrier_id)] += 1
        if op.spec.device == "signal" or op.spec.signals:
            for c in op.channel_ids:
                self.inbound[(op.channel_type,) + self.pairs[str(op.channel_type)][(r, c)]] += 1


def _lower(plan: Plan, rank: int, tb_id: int, index: int, actions: dict[int, list]) -> int:
    """Append op (rank, tb, index)'s transfers and sums to every rank it touches; the staging chunks it uses."""
    gpu = plan.gpus[rank]
    tb = gpu.threadblocks[tb_id]
    op = tb.ops[index]
    if op.spec.container:  # its ops run once per unit of the message, which the engine's one pass cannot follow
        raise ExecutorError(
            f"plan {plan.name}: gpus[{rank}].threadblocks[{tb_id}].ops[{index}]: op {op.name!r}: the "
            "port engine does not run pipelines"
        )
    if not op.spec.buffers:
        return 0
    if op.name not in LOWERED:
        raise ExecutorError(
            f"plan {plan.name}: gpus[{rank}].threadblocks[{tb_id}].ops[{index}]: op {op.name!r} is not "
            f"among the ops the port engine runs ({', '.join(sorted(LOWERED))})"
        )
    kind = op.channel_type or "memory"
    staged = 0

    def where(ref: BufferRef) -> tuple[int, Slot]:
        owner, type = _target(gpu, tb, op, ref, rank)
        buffer, at = placed(plan, owner, type, ref.index)
        return owner, Slot(buffer, at, ref.size)

    def hop(src_rank: int, src: Slot, dst_rank: int, dst: Slot) -> None:
        actions[src_rank].append(Transfer(dst_rank, src, True, kind))
        actions[dst_rank].append(Transfer(src_rank, dst, False, kind))

    def stage(size: int) -> Slot:
        nonlocal staged
        staged += size
        return Slot("t", staged - size, size)

    if op.spec.pairwise:
        sources = op.src_buff * len(op.dst_buff) if op.spec.broadcast and len(op.src_buff) == 1 else op.src_buff
        for s, d in zip(sources, op.dst_buff, strict=True):
            (sr, src), (dr, dst) = where(s), where(d)
            if sr == dr == rank:
                actions[rank].append(Compute((src,), (dst,)))
            else:
                hop(sr, src, dr, dst)
        return staged
    srcs = []
    for s in op.src_buff:
        owner, src = where(s)
        if owner != rank:
            landing = stage(src.size)
            hop(owner, src, rank, landing)
            src = landing
        srcs.append(src)
    dsts = [where(d) for d in op.dst_buff]
    local = tuple(slot for owner, slot in dsts if owner == rank)
    value = local[0] if local else stage(dsts[0][1].size)
    actions[rank].append(Compute(tuple(srcs), local or (value,)))
    for owner, dst in dsts:
        if owner != rank:
            hop(rank, value, owner, dst)
    return staged


def _group(actions: list) -> tuple[Step, ...]:
    """Consecutive transfers as one Exchange, split where a receive would overwrite what the group touches or a
    send would read what the group receives."""
    steps: list[Step] = []
    batch: list[Transfer] = []

    def close() -> None:
        if batch:
            steps.append(Exchange(tuple(batch)))
            batch.clear()

    for a in actions:
        if a is ROUND_END:
            close()
            continue
        if isinstance(a, Compute):
            close()
            steps.append(a)
            continue
        clash = any(a.slot.overlaps(b.slot) for b in batch if not (a.send and b.send))
        if clash:
            close()
        batch.append(a)
    close()
    return tuple(steps)


def run_programs(plan: Plan, programs: tuple[Program, ...], inputs: list, elems: int, dtype: str) -> list:
    """Run every rank's Program on numpy buffers, with an Exchange blocking until each of its transfers met its
    peer's: every rank's output (float32 arrays, values of ``dtype``). Raises ExecutorError on a deadlock.

    The CPU stand-in for the engine: a transfer's data moves when both sides are posted, as in NCCL's groups."""

    from executor.reference.machine import round_to

    bufs = [_buffers(plan, programs[r], r, inputs[r], elems, dtype) for r in range(plan.nranks)]

    def view(r: int, s: Slot):
        return bufs[r][s.buffer][s.index : s.index + s.size]

    pc = [0] * plan.nranks
    posted: dict[tuple[int, int, bool], list] = defaultdict(list)  # (sender, receiver, is send) -> [(rank, step, k)]
    done: set = set()
    while any(pc[r] < len(p.steps) for r, p in enumerate(programs)):
        progressed = False
        for r, p in enumerate(programs):
            while pc[r] < len(p.steps):
                step = p.steps[pc[r]]
                if isinstance(step, Compute):
                    total = view(r, step.srcs[0]).copy()
                    for s in step.srcs[1:]:
                        total = round_to(total + view(r, s), dtype)
                    for d in step.dsts:
                        view(r, d)[:] = total
                    pc[r] += 1
                    progressed = True
                    continue
                keys = [(r, pc[r], k) for k in range(len(step.transfers))]
                if (r, pc[r], -1) not in done:  # post the group once
                    done.add((r, pc[r], -1))
                    for k, t in enumerate(step.transfers):
                        posted[(r, t.peer, True) if t.send else (t.peer, r, False)].append((r, pc[r], k))
                    progressed = True
                if not all(key in done for key in keys):
                    break
                pc[r] += 1
                progressed = True
        progressed = _match(plan, programs, posted, view, done) or progressed
        if not progressed:
            stuck = [f"rank {r} at {p.steps[pc[r]]}" for r, p in enumerate(programs) if pc[r] < len(p.steps)]
            raise ExecutorError(f"plan {plan.name}: port programs deadlock: {'; '.join(stuck[:3])}")
    outputs = []
    for r, b in enumerate(bufs):
        buffer, at = placed(plan, r, "o", 0)
        outputs.append(b[buffer][at : at + plan.gpus[r].output_chunks].reshape(-1).copy())
    return outputs


def _buffers(plan: Plan, program: Program, r: int, inputs: Any, elems: int, dtype: str) -> dict[str, Any]:
    """Rank r's buffers (chunks x elems, NaN where nothing was written), its input in place."""
    import numpy as np

    from executor.reference.machine import round_to

    g = plan.gpus[r]
    sizes = {"s": g.scratch_chunks, "t": program.staging_chunks}
    sizes.update(
        {INPLACE: max(g.input_chunks, g.output_chunks)} if plan.inplace else {"i": g.input_chunks, "o": g.output_chunks}
    )
    b = {k: np.full((n, elems), np.nan, np.float32) for k, n in sizes.items()}
    buffer, at = placed(plan, r, "i", 0)
    b[buffer][at : at + g.input_chunks] = round_to(np.asarray(inputs, np.float32), dtype).reshape(g.input_chunks, elems)
    return b


def _match(
    plan: Plan,
    programs: tuple[Program, ...],
    posted: dict[tuple[int, int, bool], list[tuple[int, int, int]]],
    view: Callable[[int, Slot], Any],
    done: set[tuple[int, int, int]],
) -> bool:
    """Move the data of every posted send that meets its receive, in posting order per (sender, receiver); whether
    any did. Both sides' transfers are then ``done``."""
    moved = False
    for (a, b, is_send), queue in list(posted.items()):
        if not is_send:
            continue
        recvs = posted[(a, b, False)]
        while queue and recvs:
            (sr, ss, sk), (rr, rs, rk) = queue.pop(0), recvs.pop(0)
            src, dst = _transfer(programs[sr], ss, sk), _transfer(programs[rr], rs, rk)
            if src.slot.size != dst.slot.size:
                raise ExecutorError(
                    f"plan {plan.name}: rank {a} sends {src.slot.size} chunks to rank {b}, which "
                    f"receives {dst.slot.size}"
                )
            view(rr, dst.slot)[:] = view(sr, src.slot)
            done.update({(sr, ss, sk), (rr, rs, rk)})
            moved = True
    return moved


def lane_bounds(elems: int, lanes: int, unit: int = 1) -> tuple[tuple[int, int], ...]:
    """Column ranges ``[lo, hi)`` that split a chunk of ``elems`` elements into at most ``lanes`` parts, each
    boundary on a multiple of ``unit`` elements. Every op maps a chunk's element j to element j of another chunk,
    so each part runs the whole program on its own: a lane.

    >>> lane_bounds(10, 3, 2)
    ((0, 2), (2, 6), (6, 10))
    """
    units = elems // unit
    n = max(1, min(lanes, units))
    cuts = [unit * (units * k // n) for k in range(n)] + [elems]
    return tuple(pairwise(cuts))


def lanes_for(chunk_bytes: int, max_lanes: int, piece_bytes: int) -> int:
    """Lanes for a chunk of ``chunk_bytes``: as many as ``max_lanes`` while each lane's piece of a chunk holds at
    least ``piece_bytes`` (below that, a lane's extra calls cost more than its overlap gains)."""
    return max(1, min(max_lanes, chunk_bytes // max(piece_bytes, 1)))


def call_lanes(call_bytes: int, chunk_bytes: int, max_lanes: int, piece_bytes: int, min_call_bytes: int) -> int:
    """Lanes for a call whose larger buffer holds ``call_bytes`` in chunks of ``chunk_bytes``: one below
    ``min_call_bytes`` (a small call's lanes add calls, and measured, gained nothing), else ``lanes_for``."""
    return lanes_for(chunk_bytes, max_lanes if call_bytes >= min_call_bytes else 1, piece_bytes)


def partner_groups(programs: Sequence[Program]) -> dict[tuple[int, int], set[tuple[int, int]]]:
    """For each (rank, step index) of an exchange: the (peer, step index) of every exchange holding the other side
    of one of its hops (sends and receives between two ranks meet in order, as NCCL matches them)."""
    posted: dict[tuple[tuple[int, int], bool], list[tuple[int, int]]] = {}
    for r, program in enumerate(programs):
        for i, step in enumerate(program.steps):
            for t in step.transfers if isinstance(step, Exchange) else ():
                posted.setdefault(((r, t.peer) if t.send else (t.peer, r), t.send), []).append((r, i))
    partners: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for (pair, send), sides in posted.items():
        if send:
            for a, b in zip(sides, posted.get((pair, False), []), strict=False):
                partners.setdefault(a, set()).add(b)
                partners.setdefault(b, set()).add(a)
    return partners


def split_peer(programs: Sequence[Program]) -> str:
    """Where a rank's group meets one peer in two of the peer's groups (which lanes' many operations can deadlock
    on: each group must meet one group per peer), or ''."""
    for (r, i), sides in sorted(partner_groups(programs).items()):
        peers = [peer for peer, _ in sides]
        if len(peers) != len(set(peers)):
            return f"rank {r} step {i} meets a peer in two of its groups: {sorted(sides)}"
    return ""
