"""Per-GPU NVLink traffic of a plan, and the time it predicts on an NVSwitch board.

``link_bytes`` counts the bytes a plan moves over each ordered GPU pair (one direction of one NVLink path) for a
message size: every remote entry an op writes (put, the remote dsts of res/rres) or reads (get, the remote srcs of
rre/rres) crosses the path between the op's GPU and the buffer's owner. A pipeline's ops count once with their
whole ranges (its iterations together move exactly those). On an NVSwitch board each GPU has one port
to the switch, so its egress is the sum of its rows and its ingress the sum of its column.

``predict_us`` then runs the plan's thread blocks as a fluid event simulation over every rank. A transfer op moves
its remote bytes at ``block_gbps`` (scaled by the block's threads: bytes in flight) while its GPU's port carries
them; the port's delivered rate for a demand D (the blocks' rates summed) is the harmonic ``1 / (1/port + 1/D)``
(a link under load adds queueing latency, so a few blocks never reach the port and many approach it), shared
in proportion to demand. Local-only work (the sum's reads, copies) runs ``local_factor`` times faster per block.
A signal reaches its peer ``signal_us`` after it is issued (the fence that drains the block's writes, then the
crossing); waits, semaphores and the ops' program order are kept as the plan states them. A launch costs
``launch_us`` (the launch and the block's op-table prologue up to its first op). The parameters are fitted to the
2-GPU two-shot measurements (bench/NOTES.md, the traffic model).

Packet protocols (LL, Lamport) need no signal: a reader polls the packets themselves. So an op that reads packets
starts once every packet it reads has been written, ``packet_us`` after the last writer finished (the crossing and
the poll that sees it). Packets cost wire bytes: an LL16 packet carries 4 data bytes in 8 (``LL_WIRE`` 2×), an LL128
line 120 in 128 (``LL128_WIRE``, when the executor runs LL plans as lines: ``lines=True``), a Lamport word is the
data itself (1×); a packet op's block moves wire bytes at ``packet_rate`` × a Simple block's rate. Every data op
also costs ``op_us`` before its bytes flow (its issue and first bytes), which is what the fewest-bytes sizes see.
The defaults of these mid-size terms (``op_us`` 0, ``packet_us`` 0, ``packet_rate`` 1) leave Simple plans' times
as they were; ``MIDSIZE_H200X4`` holds their fit to 4×H200 at 256 KB–256 MB (bench/traffic_model.py --midsize).

What it shows on NVSwitch at 16–256 MB: every two-shot or ring shape moves the same 2(N-1)/N·S per GPU per
direction (a one-shot (N-1)·S), so the winner is the shape that keeps the most blocks pushing through every phase:
per-peer blocks leave most SMs idle in each phase and phases wait for each other; one block per instance serving
every peer keeps all blocks on the port in every phase.

>>> from schedules.plan import load_plan
>>> plan = load_plan("tests/fixtures/plans/allpairs_allreduce_2.json")
>>> link_bytes(plan, 1 << 20)
{(0, 1): 1048576, (1, 0): 1048576}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from schedules.lamport import PROTOCOL as LAMPORT
from schedules.plan.types import Gpu, Op, Plan, PlanError, Threadblock, channel_pairs, entry_target, remote_target

Pairs = dict[tuple[int, int], tuple[int, int]]  # (rank, channel id) -> the paired (peer, channel id)
Chunk = tuple[int, str, int]  # (rank, buffer type, chunk index)

LL_WIRE = 2.0  # an LL16 packet: 4 data bytes and a 4-byte flag
LL128_WIRE = 128 / 120  # an LL128 line: 120 data bytes and an 8-byte flag
LAMPORT_WIRE = 1.0  # the data is its own flag


@dataclass(frozen=True)
class PortModel:
    """An NVSwitch GPU's port and its thread blocks' rates (GB/s = 1e3 bytes/µs), fitted on 2×H200."""

    port_gbps: float = 368.0  # measured peer-write ceiling of one H200 (../shared/GPU.md)
    block_gbps: float = 28.0  # one 1024-thread block's remote-write rate, alone on an idle port
    local_factor: float = 4.0  # local reads and writes per block, against remote ones
    signal_us: float = 3.0  # a signal's fence and crossing
    launch_us: float = 4.0  # the launch up to a block's first op
    op_us: float = 0.0  # a data op's issue and first bytes, before its bytes flow
    packet_us: float = 0.0  # from a packet's writer finishing to its reader seeing it
    packet_rate: float = 1.0  # a packet op's block moves wire bytes at this × a Simple block's rate


def wire_factor(plan: Plan, lines: bool = False) -> float:
    """Wire bytes per data byte of the plan's packet entries (1 for Simple plans, which move no packets)."""
    if plan.protocol == LAMPORT:
        return LAMPORT_WIRE
    if plan.protocol == "LL":
        return LL128_WIRE if lines else LL_WIRE
    return 1.0


def link_bytes(plan: Plan, nbytes: int) -> dict[tuple[int, int], int]:
    """Bytes over each ordered pair (from, to) of GPUs for one execution of ``nbytes``."""
    return {pair: round(b) for pair, b in _links(plan, nbytes, 1.0).items()}


def wire_bytes(plan: Plan, nbytes: int, lines: bool = False) -> dict[tuple[int, int], float]:
    """``link_bytes`` as the wire carries them: packet entries at their protocol's ``wire_factor``.

    >>> from schedules.plan import load_plan
    >>> wire_bytes(load_plan("tests/fixtures/plans/allpairs_allreduce_2.json"), 1 << 20)[(0, 1)] == 1 << 20
    True
    """
    return _links(plan, nbytes, wire_factor(plan, lines))


def _links(plan: Plan, nbytes: int, wire: float) -> dict[tuple[int, int], float]:
    cb = plan.chunk_bytes(nbytes)
    out: dict[tuple[int, int], float] = defaultdict(float)
    for r, gpu in enumerate(plan.gpus):
        for tb in gpu.threadblocks:
            for op in (o for container in tb.ops for o in container.flat()):
                spec = op.spec
                for k, ref in enumerate(op.src_buff):
                    if ref.remote:
                        factor = wire if spec.reads_packet(k) else 1.0
                        out[(remote_target(gpu, tb, op, ref)[0], r)] += ref.size * cb * factor
                for k, ref in enumerate(op.dst_buff):
                    if ref.remote:
                        factor = wire if spec.writes_packet(True, k) else 1.0
                        out[(r, remote_target(gpu, tb, op, ref)[0])] += ref.size * cb * factor
    return dict(sorted(out.items()))


def port_bytes(plan: Plan, nbytes: int) -> list[tuple[int, int]]:
    """(egress, ingress) bytes of each GPU's switch port."""
    links = link_bytes(plan, nbytes)
    return [
        (sum(b for (s, _), b in links.items() if s == r), sum(b for (_, d), b in links.items() if d == r))
        for r in range(plan.nranks)
    ]


@dataclass
class _Block:
    rank: int
    gpu: Gpu
    tb: Threadblock
    ops: list[Op]
    threads: int
    pc: int = 0
    lag: float = 0.0  # µs left of the running op's issue (op_us)
    remote: float = 0.0  # bytes left of the running op's remote part
    local: float = 0.0
    packets: bool = False  # the running op moves packets (its rate is packet_rate's)

    @property
    def busy(self) -> bool:
        return self.lag > 0 or self.remote > 0 or self.local > 0


@dataclass
class _Packets:
    """Which packet chunks each rank's buffers receive, how many writes of each have landed, and when."""

    expected: dict[Chunk, int]
    landed: dict[Chunk, int]
    ready: dict[Chunk, float]

    def arrived(self, chunks: list[Chunk], now: float) -> bool:
        return all(
            self.landed.get(c, 0) >= n and self.ready.get(c, 0.0) <= now
            for c in chunks
            if (n := self.expected.get(c, 0))
        )


def _packet_entries(gpu: Gpu, tb: Threadblock, op: Op, rank: int, written: bool) -> list[Chunk]:
    """The chunks op writes as packets (``written``) or reads as packets, as (rank, buffer type, index)."""
    spec = op.spec
    out: list[Chunk] = []
    refs = op.dst_buff if written else op.src_buff
    for k, ref in enumerate(refs):
        if spec.writes_packet(ref.remote, k) if written else spec.reads_packet(k):
            owner, kind = entry_target(gpu, tb, op, ref, rank)
            out.extend((owner, kind, ref.index + i) for i in range(ref.size))
    return out


def predict_us(plan: Plan, nbytes: int, model: PortModel = PortModel(), lines: bool = False) -> float:
    """The plan's predicted time (µs) for one execution of ``nbytes`` on an NVSwitch board (see the module doc);
    ``lines``: the executor runs an LL plan's packets as LL128 lines."""
    cb = plan.chunk_bytes(nbytes)
    pairs = channel_pairs(plan)
    wire = wire_factor(plan, lines)
    blocks = [
        _Block(r, g, tb, [o for op in tb.ops for o in op.flat()], plan.num_threads_per_block)
        for r, g in enumerate(plan.gpus)
        for tb in g.threadblocks
    ]
    expected: dict[Chunk, int] = defaultdict(int)
    for b in blocks:
        for op in b.ops:
            for c in _packet_entries(b.gpu, b.tb, op, b.rank, written=True):
                expected[c] += 1
    packets = _Packets(dict(expected), defaultdict(int), defaultdict(float))
    arrivals: dict[tuple[int, int], list[float]] = defaultdict(list)  # (rank, channel) -> signal arrival times
    consumed: dict[tuple[int, int], int] = defaultdict(int)
    semaphores: dict[tuple[int, int], int] = defaultdict(int)
    now = 0.0
    while True:
        progressed = True
        while progressed:  # run every op that takes no time, start the transfers
            progressed = False
            for b in blocks:
                while b.pc < len(b.ops) and not b.busy:
                    if not _step(b, cb, wire, now, model, pairs, (arrivals, consumed, semaphores), packets):
                        break
                    progressed = True
        running = [b for b in blocks if b.busy]
        pending = [t for ts in arrivals.values() for t in ts if t > now] + [
            t for t in packets.ready.values() if t > now
        ]
        if not running:
            if any(b.pc < len(b.ops) for b in blocks):
                if not pending:
                    stuck = next(b for b in blocks if b.pc < len(b.ops))
                    raise PlanError(
                        f"plan {plan.name}: rank {stuck.rank} waits forever at op {stuck.pc} "
                        f"({stuck.ops[stuck.pc].name}): the traffic model cannot time it"
                    )
                now = min(pending)
                continue
            return model.launch_us + now
        rates = _rates(running, model)
        finish = min(_time_left(b, rates[id(b)]) for b in running)
        dt = min([finish] + [t - now for t in pending])
        for b in running:
            _advance(b, rates[id(b)], dt)
        now += dt
        for b in running:
            if not b.busy:
                op = b.ops[b.pc]
                _signal(b, op, now, model, pairs, arrivals)  # pws: after its data
                _land(b, op, now, model, packets)
                b.pc += 1


def _time_left(b: _Block, rates: tuple[float, float]) -> float:
    if b.lag > 0:
        return b.lag
    return b.remote / rates[0] if b.remote > 0 else b.local / rates[1]


def _advance(b: _Block, rates: tuple[float, float], dt: float) -> None:
    """The block's running op after ``dt`` µs: its issue first, then its remote bytes, then its local ones."""
    if b.lag > 0:
        b.lag = 0.0 if b.lag - dt < 1e-9 else b.lag - dt
    elif b.remote > 0:
        b.remote = max(0.0, b.remote - rates[0] * dt)
        if b.remote < 1e-6:
            b.remote = 0.0
    else:
        b.local = max(0.0, b.local - rates[1] * dt)
        if b.local < 1e-6:
            b.local = 0.0


def _rates(running: list[_Block], model: PortModel) -> dict[int, tuple[float, float]]:
    """bytes/µs of each running block's remote part and local part."""
    demand: dict[int, float] = defaultdict(float)
    own = {
        id(b): model.block_gbps * 1e3 * min(b.threads, 1024) / 1024 * (model.packet_rate if b.packets else 1.0)
        for b in running
    }
    for b in running:
        if b.remote > 0 and b.lag <= 0:
            demand[b.rank] += own[id(b)]
    port = model.port_gbps * 1e3
    scale = {r: 1.0 / (1.0 / port + 1.0 / d) / d for r, d in demand.items()}
    return {id(b): (own[id(b)] * scale.get(b.rank, 1.0), own[id(b)] * model.local_factor) for b in running}


Syncs = tuple[dict[tuple[int, int], list[float]], dict[tuple[int, int], int], dict[tuple[int, int], int]]


def _step(
    b: _Block,
    cb: int,
    wire: float,
    now: float,
    model: PortModel,
    pairs: Pairs,
    syncs: Syncs,
    packets: _Packets,
) -> bool:
    """Run the block's next op if it can start now; a transfer is started (its bytes set), not finished."""
    arrivals, consumed, semaphores = syncs
    op = b.ops[b.pc]
    if op.spec.packet_src and not packets.arrived(_packet_entries(b.gpu, b.tb, op, b.rank, written=False), now):
        return False
    device = op.spec.device
    if device == "wait":
        need: dict[int, int] = defaultdict(int)
        for c in op.channel_ids:
            need[c] += 1
        if any(sum(t <= now for t in arrivals[(b.rank, c)]) < consumed[(b.rank, c)] + n for c, n in need.items()):
            return False
        for c in op.channel_ids:
            consumed[(b.rank, c)] += 1
    elif device == "sem_acquire":
        if any(semaphores[(b.rank, s)] < 1 for s in op.semaphore_ids):
            return False
        for s in op.semaphore_ids:
            semaphores[(b.rank, s)] -= 1
    elif device == "sem_release":
        for s in op.semaphore_ids:
            semaphores[(b.rank, s)] += 1
    if op.spec.buffers:
        spec = op.spec
        sized = [(ref, spec.reads_packet(k)) for k, ref in enumerate(op.src_buff)] + [
            (ref, spec.writes_packet(ref.remote, k)) for k, ref in enumerate(op.dst_buff)
        ]
        b.remote = float(sum(ref.size * cb * (wire if p else 1.0) for ref, p in sized if ref.remote))
        b.local = float(sum(ref.size * cb * (wire if p else 1.0) for ref, p in sized if not ref.remote))
        b.packets = spec.packet
        if b.remote > 0 or b.local > 0:
            b.lag = model.op_us
            return True
    _signal(b, op, now, model, pairs, arrivals)
    _land(b, op, now, model, packets)
    b.pc += 1
    return True


def _land(b: _Block, op: Op, now: float, model: PortModel, packets: _Packets) -> None:
    """Record the packets ``op`` wrote: readers see them ``packet_us`` from now."""
    if op.spec.packet_dst:
        for c in _packet_entries(b.gpu, b.tb, op, b.rank, written=True):
            packets.landed[c] += 1
            packets.ready[c] = max(packets.ready[c], now + model.packet_us)


def _signal(
    b: _Block, op: Op, now: float, model: PortModel, pairs: Pairs, arrivals: dict[tuple[int, int], list[float]]
) -> None:
    if op.spec.device == "signal" or op.spec.signals:
        for c in op.channel_ids:
            peer, back = pairs[(b.rank, c)]
            arrivals[(peer, back)].append(now + model.signal_us)


# fitted by bench/traffic_midsize.py to 4×H200 all-reduce at 64 KB–256 MB (bench/NOTES.md, issue 33)
MIDSIZE_H200X4 = PortModel(
    port_gbps=321.0,
    block_gbps=160.0,
    local_factor=1.18,
    signal_us=4.09,
    launch_us=4.08,
    op_us=1.30,
    packet_us=0.05,
    packet_rate=1.45,
)
