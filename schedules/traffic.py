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
``launch_us``. The parameters are fitted to the 2-GPU two-shot measurements (bench/NOTES.md, the traffic model).

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

from schedules.plan.types import Op, Plan, PlanError, channel_pairs, remote_target

Pairs = dict[tuple[int, int], tuple[int, int]]  # (rank, channel id) -> the paired (peer, channel id)


@dataclass(frozen=True)
class PortModel:
    """An NVSwitch GPU's port and its thread blocks' rates (GB/s = 1e3 bytes/µs), fitted on 2×H200."""

    port_gbps: float = 368.0  # measured peer-write ceiling of one H200 (../shared/GPU.md)
    block_gbps: float = 28.0  # one 1024-thread block's remote-write rate, alone on an idle port
    local_factor: float = 4.0  # local reads and writes per block, against remote ones
    signal_us: float = 3.0  # a signal's fence and crossing
    launch_us: float = 4.0


def link_bytes(plan: Plan, nbytes: int) -> dict[tuple[int, int], int]:
    """Bytes over each ordered pair (from, to) of GPUs for one execution of ``nbytes``."""
    cb = plan.chunk_bytes(nbytes)
    out: dict[tuple[int, int], int] = defaultdict(int)
    for r, gpu in enumerate(plan.gpus):
        for tb in gpu.threadblocks:
            for op in (o for container in tb.ops for o in container.flat()):
                for ref in op.src_buff:
                    if ref.remote:
                        out[(remote_target(gpu, tb, op, ref)[0], r)] += ref.size * cb
                for ref in op.dst_buff:
                    if ref.remote:
                        out[(r, remote_target(gpu, tb, op, ref)[0])] += ref.size * cb
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
    ops: list[Op]
    threads: int
    pc: int = 0
    remote: float = 0.0  # bytes left of the running op's remote part
    local: float = 0.0


def predict_us(plan: Plan, nbytes: int, model: PortModel = PortModel()) -> float:
    """The plan's predicted time (µs) for one execution of ``nbytes`` on an NVSwitch board (see the module doc)."""
    cb = plan.chunk_bytes(nbytes)
    pairs = channel_pairs(plan)
    blocks = [
        _Block(r, [o for op in tb.ops for o in op.flat()], plan.num_threads_per_block)
        for r, g in enumerate(plan.gpus)
        for tb in g.threadblocks
    ]
    arrivals: dict[tuple[int, int], list[float]] = defaultdict(list)  # (rank, channel) -> signal arrival times
    consumed: dict[tuple[int, int], int] = defaultdict(int)
    semaphores: dict[tuple[int, int], int] = defaultdict(int)
    now = 0.0
    while True:
        progressed = True
        while progressed:  # run every op that takes no time, start the transfers
            progressed = False
            for b in blocks:
                while b.pc < len(b.ops) and b.remote <= 0 and b.local <= 0:
                    if not _step(b, cb, now, model, pairs, arrivals, consumed, semaphores):
                        break
                    progressed = True
        running = [b for b in blocks if b.remote > 0 or b.local > 0]
        if not running:
            if any(b.pc < len(b.ops) for b in blocks):
                pending = [t for ts in arrivals.values() for t in ts if t > now]
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
        finish = min((b.remote / rates[id(b)][0] if b.remote > 0 else b.local / rates[id(b)][1]) for b in running)
        pending = [t for ts in arrivals.values() for t in ts if t > now]
        dt = min([finish] + [t - now for t in pending])
        for b in running:
            remote_rate, local_rate = rates[id(b)]
            if b.remote > 0:
                b.remote = max(0.0, b.remote - remote_rate * dt)
                if b.remote < 1e-6:
                    b.remote = 0.0
            else:
                b.local = max(0.0, b.local - local_rate * dt)
                if b.local < 1e-6:
                    b.local = 0.0
        now += dt
        for b in running:
            if b.remote <= 0 and b.local <= 0:
                _signal(b, b.ops[b.pc], now, model, pairs, arrivals)  # pws: after its data
                b.pc += 1


def _rates(running: list[_Block], model: PortModel) -> dict[int, tuple[float, float]]:
    """bytes/µs of each running block's remote part and local part."""
    demand: dict[int, float] = defaultdict(float)
    own = {id(b): model.block_gbps * 1e3 * min(b.threads, 1024) / 1024 for b in running}
    for b in running:
        if b.remote > 0:
            demand[b.rank] += own[id(b)]
    port = model.port_gbps * 1e3
    scale = {r: 1.0 / (1.0 / port + 1.0 / d) / d for r, d in demand.items()}
    return {id(b): (own[id(b)] * scale.get(b.rank, 1.0), own[id(b)] * model.local_factor) for b in running}


def _step(
    b: _Block,
    cb: int,
    now: float,
    model: PortModel,
    pairs: Pairs,
    arrivals: dict[tuple[int, int], list[float]],
    consumed: dict[tuple[int, int], int],
    semaphores: dict[tuple[int, int], int],
) -> bool:
    """Run the block's next op if it can start now; a transfer is started (its bytes set), not finished."""
    op = b.ops[b.pc]
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
        entries = list(op.src_buff) + list(op.dst_buff)
        b.remote = float(sum(ref.size for ref in entries if ref.remote) * cb)
        b.local = float(sum(ref.size for ref in entries if not ref.remote) * cb)
        if b.remote > 0 or b.local > 0:
            return True
    _signal(b, op, now, model, pairs, arrivals)
    b.pc += 1
    return True


def _signal(
    b: _Block, op: Op, now: float, model: PortModel, pairs: Pairs, arrivals: dict[tuple[int, int], list[float]]
) -> None:
    if op.spec.device == "signal" or op.spec.signals:
        for c in op.channel_ids:
            peer, back = pairs[(b.rank, c)]
            arrivals[(peer, back)].append(now + model.signal_us)
