"""The CPU reference executor: runs a Plan for every rank in one process with numpy, and proves it.

Each thread block is a sequential thread; the executor interleaves them one op at a time. Ops follow the
semantics in ``schedules.plan``. Ordering is tracked with vector clocks: program order within a thread block,
signal -> wait on paired channel ends (the n-th wait after the n-th signal), sem_release -> sem_acquire,
barriers, and packet write -> packet read.

Port channels follow MSCCL++'s ordering: each port channel end of each launch is a thread of its own (its
proxy), which runs the channel's puts in order after the op that issued them. A put's source is read and its
destination written by that thread, so the peer sees the data only through a ``signal`` on the same channel
(which carries the channel thread's clock), and the issuing rank may overwrite the source only after a ``flush``
of the channel (which joins the channel thread's clock into the thread block's).

Every chunk slot remembers its last write and the reads since, so

- a read of a chunk that no write happens-before (including reading a peer's buffer before the owner's write
  is ordered before the read, or a scratch chunk nobody wrote) is a race (``PlanRace``);
- a write that is not ordered after the previous write and the reads since (write-after-read) is a race too;
- a state where no thread block can run its next op is a deadlock (``PlanDeadlock``) naming the waiting ops;
- an index outside its buffer is a ``PlanError``; a result that differs from numpy's definition of the
  collective is a ``WrongResult``.

Launches back to back. ``run_launches`` runs the plan several times on the same buffers, as a caller's stream
does: rank r's launch k+1 happens after rank r's launch k only (plus the plan's own signal/wait edges). Channel
counters, semaphores and the launch count carry over exactly as on the GPU (the n-th wait pairs with the n-th
signal across launches). Each rank's host is a thread of its own between its launches: it reads launch k's
output (every output chunk's write must happen before it) and writes launch k+1's fresh input. With
``use_double_scratch_buffer`` launch k uses scratch half k % 2, and a packet carries its launch's flag: a reader
in launch k waits for packets of launch k, and overwriting packets that nothing read yet is a race (on the GPU
their reader would spin on a flag that never comes back).

Data are kept as float32 arrays holding values of the element type: fp16 and bf16 (emulated: float32 rounded
to its top 16 bits, nearest-even) round after every reduction, as a GPU would.

An all-reduce with residuals (``run_reference(..., residuals=)``) adds a rank's residual where the GPU executor
does (``residual_sums``): after the sum of each reduction that completes an element's sum and writes an output.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from executor.errors import WrongResult  # noqa: F401 (raised here; callers import it from either module)
from schedules.plan.types import (
    PACKET_PROTOCOLS,
    BufferRef,
    Op,
    Plan,
    PlanError,
    channel_pairs,
    remote_target,
)
from weftcore.errors import CheckFailed

DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
BUFFER_NAMES = {"i": "input", "o": "output", "s": "scratch"}
_NEVER = -2  # the writer id of a slot nobody wrote
_PLAIN = -1  # the flag of a slot holding plain data (a packet slot holds the launch that wrote it)


class PlanDeadlock(CheckFailed):
    """No thread block can make progress."""


class PlanRace(CheckFailed):
    """A chunk is read or overwritten without a happens-before edge from the write it depends on."""


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to the element type (still stored as float32)."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "fp16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return rounded.astype(np.uint32).view(np.float32)
    return values


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise PlanError(f"dtype: must be fp32, fp16 or bf16, got {dtype!r}")


@dataclass
class _Buffer:
    """One physical buffer of one rank, with the happens-before record of every chunk slot."""

    data: np.ndarray
    writer: np.ndarray
    clock: np.ndarray
    flag: np.ndarray
    packet_vc: list
    readers: list

    @staticmethod
    def make(chunks: int, elems: int) -> _Buffer:
        return _Buffer(
            np.full((chunks, elems), np.nan, dtype=np.float32),
            np.full(chunks, _NEVER),
            np.zeros(chunks, dtype=np.int64),
            np.full(chunks, _PLAIN),
            [None] * chunks,
            [dict() for _ in range(chunks)],
        )


@dataclass
class _Thread:
    """A thread block of one launch, or (``tb`` -1) a rank's host between its launches ``launch - 1`` and
    ``launch``."""

    rank: int
    tb: int
    launch: int
    ops: tuple[Op, ...]  # a pipeline's ops once per iteration, each a window of its entries (``parts``)
    vc: np.ndarray  # set for every thread when the machine is made
    index: tuple[int, ...] = ()  # the plan op each of ``ops`` comes from
    parts: tuple = ()  # per op: None, or (first slot, slots) within each entry's slots
    pc: int = 0
    started: bool = False
    barriers: dict = field(default_factory=lambda: defaultdict(int))


OpKey = tuple[int, int, int]  # (rank, thread block, op index)
ChannelEnd = tuple[str | None, int, int]  # (channel type, rank, channel id): an op's channel_type names it


def residual_sums(plan: Plan) -> dict[OpKey, int]:
    """The reductions where an all-reduce adds the residual, each with the output chunk it adds it at: those that
    complete a sum (every rank's input in it) and write an output buffer (their rank's or a peer's).

    Which sums complete comes from a run of the plan on inputs of ones, where each sum counts its inputs; a
    reduction writing outputs at two chunk positions is left out (the proof of ``run_reference`` with residuals
    then fails, so the executor refuses the plan)."""
    nbytes = smallest_size(plan)
    elems = chunk_elems(plan, nbytes, "fp32")
    m = _Machine(plan, elems, "fp32", [[np.ones(g.input_chunks * elems, np.float32) for g in plan.gpus]], counting=True)
    m.run(deadline_ops=10 * sum(len(t.ops) for t in m.threads) + 100)
    assert m.counts is not None  # counting=True
    sums = {}
    for (rank, tb, index), count in m.counts.items():
        gpu = plan.gpus[rank]
        op = gpu.threadblocks[tb].ops[index]
        chunks = {
            ref.index
            for ref in op.dst_buff
            if (remote_target(gpu, gpu.threadblocks[tb], op, ref)[1] if ref.remote else ref.type) == "o"
        }
        if count == plan.nranks and len(chunks) == 1:
            sums[(rank, tb, index)] = chunks.pop()
    return sums


class _Machine:
    """The state of one run of ``launches`` launches: buffers, channel counters, semaphores and thread blocks."""

    def __init__(
        self,
        plan: Plan,
        elems: int,
        dtype: str,
        inputs: list[list[np.ndarray]],
        residuals: list[np.ndarray] | None = None,
        counting: bool = False,
        epilogue: Callable | None = None,
    ):
        self.plan, self.elems, self.dtype, self.inputs = plan, elems, dtype, inputs
        self.residuals, self.epilogue = residuals, epilogue
        self.residual_at = residual_sums(plan) if residuals is not None else {}
        # counting: each reduction's sum where all its elements hold the same (else -1), by (rank, block, op)
        self.counts: dict[OpKey, float] | None = {} if counting else None
        self.launches = len(inputs)
        self.G = plan.slices  # slots per chunk: tbg slices and pipeline iterations are whole slots
        self.threads = [
            _thread(r, tb.id, k, tb.ops, self.G)
            for k in range(self.launches)
            for r, g in enumerate(plan.gpus)
            for tb in g.threadblocks
        ] + self._side_threads()
        self.hosts = {
            (k, r): _Thread(r, -1, k, (), np.zeros(0, CLOCK))
            for k in range(self.launches + 1)
            for r in range(plan.nranks)
        }
        self.proxies = {
            (k, r, c): _Thread(r, -2 - c, k, (), np.zeros(0, CLOCK))
            for k in range(self.launches)
            for r, g in enumerate(plan.gpus)
            for c in range(len(g.port_peers))
        }
        self.everyone = self.threads + list(self.hosts.values()) + list(self.proxies.values())
        for t in self.everyone:
            t.vc = np.zeros(len(self.everyone), dtype=CLOCK)
        self.slot_elems = elems // self.G
        self.buffers: dict[tuple[int, str], _Buffer] = {}
        self.alias: dict[tuple[int, str], tuple[str, int]] = {}
        for r, g in enumerate(plan.gpus):
            self._place_buffers(r, g.input_chunks, g.output_chunks, g.scratch_chunks)
        self.peer_end: dict[ChannelEnd, ChannelEnd] = {
            ("memory",) + end: ("memory",) + back for end, back in channel_pairs(plan).items()
        }
        self.peer_end.update({("port",) + end: ("port",) + back for end, back in channel_pairs(plan, "port").items()})
        self.inbound: dict[ChannelEnd, list[np.ndarray]] = defaultdict(list)
        self.consumed: dict[ChannelEnd, int] = defaultdict(int)
        self.semaphores: dict[tuple[int, int], list[np.ndarray | None]] = {
            (r, s): [None] * v for r, g in enumerate(plan.gpus) for s, v in enumerate(g.semaphores)
        }
        self.arrivals: dict[tuple, dict[int, np.ndarray]] = defaultdict(dict)
        self._index = {id(t): i for i, t in enumerate(self.everyone)}
        self.launch_threads: dict[tuple[int, int], list[_Thread]] = defaultdict(list)
        for t in self.threads:
            self.launch_threads[(t.launch, t.rank)].append(t)
        self.outputs: list[list[np.ndarray]] = [  # each filled in by its rank's host after the launch
            [np.zeros(0, np.float32)] * plan.nranks for _ in range(self.launches)
        ]

    def _place_buffers(self, rank: int, ichunks: int, ochunks: int, schunks: int) -> None:
        G = self.plan.slices
        e = self.elems // G
        halves = self.plan.scratch_copies
        self.buffers[(rank, "s")] = _Buffer.make(schunks * halves * G, e)
        self.alias[(rank, "s")] = ("s", 0)
        if not self.plan.inplace:
            self.buffers[(rank, "i")] = _Buffer.make(ichunks * G, e)
            self.buffers[(rank, "o")] = _Buffer.make(ochunks * G, e)
            self.alias[(rank, "i")], self.alias[(rank, "o")] = ("i", 0), ("o", 0)
            return
        # in place: the smaller buffer is the rank's slice of the larger one (see schedules.plan)
        self.buffers[(rank, "io")] = _Buffer.make(max(ichunks, ochunks) * G, e)
        offset_i, offset_o = self.plan.inplace_offsets(rank, ichunks, ochunks)
        self.alias[(rank, "i")], self.alias[(rank, "o")] = ("io", offset_i), ("io", offset_o)

    def slots(
        self, rank: int, type: str, ref: BufferRef, where: str, launch: int = 0, part: tuple[int, int] | None = None
    ) -> tuple[_Buffer, slice]:
        """The buffer and slot range of an entry (``part``: a window of its slots, for tbg and pipelines)."""
        limit = self.plan.gpus[rank].buffer_chunks(type)
        if ref.index + ref.size > limit:
            raise PlanError(
                f"plan {self.plan.name}: {where}: chunks {ref.index}..{ref.index + ref.size - 1} of "
                f"rank {rank}'s {type!r} buffer are out of range ({limit} chunks)"
            )
        key, offset = self.alias[(rank, type)]
        if type == "s":  # the GPU picks the half by the launch's flag (a Lamport plan: the copy by the launch)
            offset += (launch % self.plan.scratch_copies) * limit
        first, count = (offset + ref.index) * self.G, ref.size * self.G
        if part is not None:
            first, count = first + part[0], part[1]
        return self.buffers[(rank, key)], slice(first, first + count)

    def ready(self, t: _Thread) -> bool:
        """Whether the thread's next op can run now."""
        if not t.started and not self.hosts[(t.launch, t.rank)].started:
            return False  # the stream runs this launch after the host's work before it
        op, part = t.ops[t.pc], t.parts[t.pc]
        if op.spec.device == "wait":
            signals: defaultdict[ChannelEnd, int] = defaultdict(int)
            for cid in op.channel_ids:
                signals[(op.channel_type, t.rank, cid)] += 1
            return all(len(self.inbound[end]) >= self.consumed[end] + n for end, n in signals.items())
        if op.spec.device == "sem_acquire":
            tokens: defaultdict[int, int] = defaultdict(int)
            for s in op.semaphore_ids:
                tokens[s] += 1
            return all(len(self.semaphores[(t.rank, s)]) >= n for s, n in tokens.items())
        if op.spec.device == "barrier":  # arriving is the one effect of asking: the barrier opens once all arrived
            arrived = self.arrivals[(t.rank, t.launch, op.barrier_id, t.barriers[op.barrier_id])]
            arrived.setdefault(self._index[id(t)], self._start(t).copy())
            assert op.num_threadblocks is not None  # the parser requires it of a barrier
            return len(arrived) >= op.num_threadblocks
        for ref in _packet_sources(op):
            buf, sl = self.slots(t.rank, _local(ref), ref, self.where(t), t.launch, _window(part, ref))
            if not self._arrived(t, buf, sl):
                return False
        return True

    def _arrived(self, t: _Thread, buf: _Buffer, sl: slice) -> bool:
        """Whether the packets a thread waits for in ``sl`` of ``buf`` came: each carries its launch's flag."""
        return bool((buf.flag[sl] == t.launch).all())

    def _side_threads(self) -> list[_Thread]:
        """Threads of each launch beside its thread blocks (a Lamport plan's reset, ``executor.reference.lamport``)."""
        return []

    def _start(self, t: _Thread) -> np.ndarray:
        """The thread's clock, begun after its rank's host work before this launch (stream order)."""
        if not t.started:
            np.maximum(t.vc, self.hosts[(t.launch, t.rank)].vc, out=t.vc)
            t.started = True
        return t.vc

    def where(self, t: _Thread) -> str:
        launch = f"launch {t.launch} " if self.launches > 1 else ""
        return f"{launch}rank {t.rank} threadblock {t.tb} op {t.index[t.pc]} ({t.ops[t.pc].name})"

    def blocked_reason(self, t: _Thread) -> str:
        op, gpu = t.ops[t.pc], self.plan.gpus[t.rank]
        if op.spec.device == "wait":
            peers = gpu.peers(op.channel_type or "memory")  # the parser requires a wait's channel type
            kind = "port channel" if op.channel_type == "port" else "channel"
            return f"{self.where(t)} waits on {kind} {op.channel_ids[0]} from rank {peers[op.channel_ids[0]]}"
        if op.spec.device == "sem_acquire":
            return f"{self.where(t)} waits on semaphore {op.semaphore_ids[0]}"
        if op.spec.device == "barrier":
            return f"{self.where(t)} waits at barrier {op.barrier_id}"
        return f"{self.where(t)} waits for packets"

    def step(self, t: _Thread) -> None:
        op = t.ops[t.pc]
        me = self._index[id(t)]
        self._start(t)
        t.vc[me] += 1
        self._synchronize(t, op)
        if op.spec.buffers and op.channel_type == "port":
            self._port_put(t, op)
        elif op.spec.buffers:
            self._move(t, me, op)
        if op.spec.device == "signal" or op.spec.signals:
            self._signal(t, op)
        if op.spec.flushes and op.channel_type == "port":
            for cid in op.channel_ids:  # putWithSignalAndFlush: the kernel waits for the proxy
                np.maximum(t.vc, self.proxies[(t.launch, t.rank, cid)].vc, out=t.vc)
        t.pc += 1

    def _synchronize(self, t: _Thread, op: Op) -> None:
        """The op's device-side ordering before it moves data: wait, port flush, semaphores, barrier."""
        if op.spec.device == "wait":
            for cid in op.channel_ids:
                end = (op.channel_type, t.rank, cid)
                np.maximum(t.vc, self.inbound[end][self.consumed[end]], out=t.vc)
                self.consumed[end] += 1
        elif op.spec.device == "flush" and op.channel_type == "port":
            for cid in op.channel_ids:  # the channel's puts so far have completed
                np.maximum(t.vc, self.proxies[(t.launch, t.rank, cid)].vc, out=t.vc)
        elif op.spec.device == "sem_acquire":
            for s in op.semaphore_ids:
                released = self.semaphores[(t.rank, s)].pop(0)
                if released is not None:  # None: a token of the semaphore's init_value
                    np.maximum(t.vc, released, out=t.vc)
        elif op.spec.device == "sem_release":
            for s in op.semaphore_ids:
                self.semaphores[(t.rank, s)].append(t.vc.copy())
        elif op.spec.device == "barrier":
            key = (t.rank, t.launch, op.barrier_id, t.barriers[op.barrier_id])
            for vc in self.arrivals[key].values():
                np.maximum(t.vc, vc, out=t.vc)
            t.barriers[op.barrier_id] += 1

    def _signal(self, t: _Thread, op: Op) -> None:
        """Send the thread's clock to the peer end of each of the op's channels."""
        for cid in op.channel_ids:
            carried = t.vc.copy()
            if op.channel_type == "port":  # a port signal follows the channel's puts before it
                np.maximum(carried, self.proxies[(t.launch, t.rank, cid)].vc, out=carried)
            self.inbound[self.peer_end[(op.channel_type, t.rank, cid)]].append(carried)

    def _move(self, t: _Thread, me: int, op: Op) -> None:
        gpu = self.plan.gpus[t.rank]
        tb = gpu.threadblocks[t.tb]
        where = self.where(t)

        part = t.parts[t.pc]

        def locate(ref: BufferRef) -> tuple[int, str, _Buffer, slice]:
            rank, type = remote_target(gpu, tb, op, ref) if ref.remote else (t.rank, _local(ref))
            return (rank, BUFFER_NAMES[type]) + self.slots(rank, type, ref, where, t.launch, _window(part, ref))

        def first(ref: BufferRef) -> int:  # the entry's first slot, as chunk * G + slot within it
            return ref.index * self.G + (_window(part, ref) or (0, 0))[0]

        packet_src = set(map(id, _packet_sources(op)))
        values = []
        for ref in op.src_buff:
            rank, name, buf, sl = locate(ref)
            values.append(self._read(t, me, buf, sl, id(ref) in packet_src, rank, name, where, first(ref)))
        key = (t.rank, t.tb, t.index[t.pc])
        if op.spec.reduces:
            total = values[0].copy()
            for v in values[1:]:
                total = round_to(total + v, self.dtype)
            if self.counts is not None:
                self.counts[key] = float(total.flat[0]) if (total == total.flat[0]).all() else -1.0
            chunk = self.residual_at.get(key)
            if chunk is not None and self.residuals is not None:  # residual_at is empty without residuals
                rows = self.residuals[t.rank].reshape(-1, self.slot_elems)[
                    chunk * self.G : (chunk + op.dst_buff[0].size) * self.G
                ]
                total = round_to(total + rows, self.dtype)
                if self.epilogue is not None:  # executor.reference.norm.Epilogue: rows normalized right after their sum
                    self.epilogue((t.rank, t.tb, t.pc), chunk, total, t.launch)
            results = [total] * len(op.dst_buff)
        else:
            results = values * len(op.dst_buff) if len(values) == 1 else values  # rppkt: one src to every dst
        for k, (ref, value) in enumerate(zip(op.dst_buff, results, strict=True)):
            rank, name, buf, sl = locate(ref)
            packet = op.spec.writes_packet(ref.remote, k)
            self._write(t, me, buf, sl, value, t.launch if packet else _PLAIN, rank, name, where, first(ref))

    def _port_put(self, t: _Thread, op: Op) -> None:
        """A put on port channels: each (src, dst) pair moves on its channel's proxy thread, after the op."""
        gpu = self.plan.gpus[t.rank]
        tb = gpu.threadblocks[t.tb]
        where = self.where(t)
        part = t.parts[t.pc]
        srcs = op.src_buff * len(op.dst_buff) if op.spec.broadcast and len(op.src_buff) == 1 else op.src_buff
        for k, (src, dst, cid) in enumerate(zip(srcs, op.dst_buff, op.channel_ids, strict=True)):
            proxy = self.proxies[(t.launch, t.rank, cid)]
            me = self._index[id(proxy)]
            np.maximum(proxy.vc, t.vc, out=proxy.vc)
            proxy.vc[me] += 1
            packet = op.spec.reads_packet(k)  # rppkt: the block waited for the packets, the proxy copies them
            src_type = _local(src)
            buf, sl = self.slots(t.rank, src_type, src, where, t.launch, _window(part, src))
            value = self._read(proxy, me, buf, sl, packet, t.rank, BUFFER_NAMES[src_type], where, src.index * self.G)
            rank, type = remote_target(gpu, tb, op, dst)
            buf, sl = self.slots(rank, type, dst, where, t.launch, _window(part, dst))
            flag = t.launch if op.spec.writes_packet(True, k) else _PLAIN
            self._write(proxy, me, buf, sl, value, flag, rank, BUFFER_NAMES[type], where, dst.index * self.G)

    def _read(
        self, t: _Thread, me: int, buf: _Buffer, sl: slice, packet: bool, rank: int, name: str, where: str, index: int
    ) -> np.ndarray:
        """Read ``sl`` of ``buf`` (chunks ``index``.. of rank's buffer ``name``, as messages call them)."""
        for k in range(sl.start, sl.stop):
            chunk = (index + k - sl.start) // self.G
            if packet:
                np.maximum(t.vc, buf.packet_vc[k], out=t.vc)
            else:
                if buf.flag[k] != _PLAIN:
                    raise PlanRace(
                        f"plan {self.plan.name}: {where} reads chunk {chunk} of rank {rank}'s "
                        f"{name} buffer as plain data, but it holds packets"
                    )
                w = buf.writer[k]
                if w == _NEVER:
                    raise PlanRace(
                        f"plan {self.plan.name}: {where} reads chunk {chunk} of rank {rank}'s "
                        f"{name} buffer, which nothing wrote"
                    )
                if t.vc[w] < buf.clock[k]:
                    raise PlanRace(
                        f"plan {self.plan.name}: {where} reads chunk {chunk} of rank {rank}'s "
                        f"{name} buffer before its write by {self._describe(w)} is ordered "
                        "before the read (missing signal/wait?)"
                    )
            buf.readers[k][me] = t.vc[me]
        return buf.data[sl].copy()

    def _write(
        self,
        t: _Thread,
        me: int,
        buf: _Buffer,
        sl: slice,
        value: np.ndarray,
        flag: int,
        rank: int,
        name: str,
        where: str,
        index: int,
    ) -> None:
        for k in range(sl.start, sl.stop):
            chunk = (index + k - sl.start) // self.G
            w = buf.writer[k]
            if w >= 0 and w != me and t.vc[w] < buf.clock[k]:
                raise PlanRace(
                    f"plan {self.plan.name}: {where} overwrites chunk {chunk} of rank {rank}'s "
                    f"{name} buffer concurrently with a write by {self._describe(w)}"
                )
            for reader, clock in buf.readers[k].items():
                if reader != me and t.vc[reader] < clock:
                    if t.tb == -1 and self.everyone[reader].tb < -1:  # the host, after the kernel, against a proxy
                        raise PlanRace(
                            f"plan {self.plan.name}: {where} overwrites chunk {chunk} of rank {rank}'s "
                            f"{name} buffer while {self._describe(reader, hint=False)} may still read "
                            "it: no flush of that channel came before the kernel's end (MSCCL++'s "
                            "kernel and its Executor::execute flush nothing when a launch ends)"
                        )
                    raise PlanRace(
                        f"plan {self.plan.name}: {where} overwrites chunk {chunk} of rank {rank}'s "
                        f"{name} buffer while {self._describe(reader)} may still read it"
                    )
            if _PLAIN != buf.flag[k] < t.launch and not buf.readers[k]:
                raise PlanRace(
                    f"plan {self.plan.name}: {where} overwrites the packets of launch {buf.flag[k]} in "
                    f"chunk {chunk} of rank {rank}'s {name} buffer before anything read them (their reader "
                    "would wait for its flag forever)"
                )
            buf.writer[k], buf.clock[k], buf.readers[k] = me, t.vc[me], {}
            buf.flag[k] = flag
            buf.packet_vc[k] = t.vc.copy() if flag != _PLAIN else None
        buf.data[sl] = value

    def _describe(self, index: int, hint: bool = True) -> str:
        t = self.everyone[index]
        if t.tb < -1:
            return (
                f"a put in flight on rank {t.rank}'s port channel {-2 - t.tb}"
                + (f" in launch {t.launch}" if self.launches > 1 else "")
                + (" (missing flush or signal?)" if hint else "")
            )
        if t.tb < 0:
            return f"rank {t.rank}'s host before launch {t.launch}"
        return f"rank {t.rank} threadblock {t.tb}" + (f" in launch {t.launch}" if self.launches > 1 else "")

    def _host_ready(self, key: tuple[int, int]) -> bool:
        launch, rank = key
        return launch == 0 or all(t.pc == len(t.ops) for t in self.launch_threads[(launch - 1, rank)])

    def _run_host(self, key: tuple[int, int]) -> None:
        """Between launches on one rank's stream: read the last launch's output, write the next one's input."""
        launch, rank = key
        host, gpu = self.hosts[key], self.plan.gpus[rank]
        me = self._index[id(host)]
        if launch > 0:
            np.maximum(host.vc, self.hosts[(launch - 1, rank)].vc, out=host.vc)
            for t in self.launch_threads[(launch - 1, rank)]:
                np.maximum(host.vc, t.vc, out=host.vc)
        host.vc[me] += 1
        host.started = True
        if launch > 0:
            self.outputs[launch - 1][rank] = self._read_output(host, me, rank, gpu.output_chunks)
        if launch < self.launches and gpu.input_chunks:
            buf, sl = self.slots(rank, "i", BufferRef(0, gpu.input_chunks, "i"), "input")
            value = round_to(self.inputs[launch][rank], self.dtype).reshape(gpu.input_chunks * self.G, self.slot_elems)
            self._write(host, me, buf, sl, value, _PLAIN, rank, "input", self._describe(me), 0)

    def _read_output(self, host: _Thread, me: int, rank: int, chunks: int) -> np.ndarray:
        """Rank's output after a launch: every output chunk's last write must happen before the kernel ends."""
        buf, sl = self.slots(rank, "o", BufferRef(0, chunks, "o"), "output")
        for k in range(sl.start, sl.stop):
            w = buf.writer[k]
            if w >= 0 and host.vc[w] < buf.clock[k]:
                after = f" of launch {host.launch - 1}" if self.launches > 1 else ""
                raise PlanRace(
                    f"plan {self.plan.name}: output chunk {(k - sl.start) // self.G} of rank {rank} is "
                    "written by "
                    f"{self._describe(w)} with no happens-before edge to the end of rank {rank}'s "
                    f"kernel{after} (missing wait?)"
                )
            buf.readers[k][me] = host.vc[me]
        return buf.data[sl].reshape(-1).copy()

    def run(self, deadline_ops: int) -> None:
        live = [t for t in self.threads if t.ops]
        hosts = list(self.hosts)
        executed = 0
        while live or hosts:
            progressed = False
            for key in [k for k in hosts if self._host_ready(k)]:
                self._run_host(key)
                hosts.remove(key)
                progressed = True
            for t in live:
                if self.ready(t):
                    self.step(t)
                    progressed = True
                    executed += 1
            live = [t for t in live if t.pc < len(t.ops)]
            if not progressed:
                waiting = [self.blocked_reason(t) for t in live]
                more = f" (and {len(waiting) - 3} more)" if len(waiting) > 3 else ""
                raise PlanDeadlock(
                    f"plan {self.plan.name}: deadlock: no thread block can progress: {'; '.join(waiting[:3])}{more}"
                )
            if executed > deadline_ops:
                raise PlanDeadlock(f"plan {self.plan.name}: no end after {executed} ops")


def _thread(rank: int, tb: int, launch: int, ops: tuple[Op, ...], G: int) -> _Thread:
    """A thread block of one launch, its ops as the executor steps through them: each pipeline's ops once per
    iteration, each with the window of its entries it moves (a tbg slice, an iteration's unit).

    The reference runs a pipeline as two iterations per chunk (``Plan.slices``): MSCCL++ runs
    ceil(num_chunks × chunk bytes / unit_size) of them, one at the sizes below the unit, more above it."""
    out: list[Op] = []
    index: list[int] = []
    parts: list[tuple | None] = []
    for i, op in enumerate(ops):
        if not op.spec.container:
            out.append(op)
            index.append(i)
            parts.append(("tbg",) + op.tbg + (G,) if op.tbg else None)
            continue
        unit = G // 2
        for k in range(_iterations(op)):
            for inner in op.ops:
                out.append(inner)
                index.append(i)
                parts.append(("iter", k * unit, unit))
    return _Thread(rank, tb, launch, tuple(out), np.zeros(0, CLOCK), tuple(index), tuple(parts))


def _local(ref: BufferRef) -> str:
    """The buffer type of a local entry (the parser gives every entry a type or a remote buffer)."""
    assert ref.type is not None, "a remote entry has no local buffer type"
    return ref.type


def _iterations(op: Op) -> int:
    """How many iterations the reference runs a pipeline for: two per chunk (``Plan.slices``)."""
    assert op.num_chunks is not None  # the parser requires it of a pipeline
    return op.num_chunks * 2


def _window(part: tuple | None, ref: BufferRef) -> tuple[int, int] | None:
    """(first slot, slots) of an entry that ``part`` moves, relative to the entry's first slot; None: all of it."""
    if part is None:
        return None
    if part[0] == "iter":
        return part[1], part[2]
    _, tb_id, size, G = part  # a thread-block group: slice tb_id of size equal slices (G is a multiple of size)
    return tb_id * ref.size * G // size, ref.size * G // size


def _packet_sources(op: Op) -> list[BufferRef]:
    """The src entries an op reads as packets."""
    return [ref for k, ref in enumerate(op.src_buff) if op.spec.reads_packet(k)]


def smallest_size(plan: Plan) -> int:
    """The smallest message size (bytes) ``plan`` accepts."""
    unit = plan.granule
    return max(plan.min_message_size + (-plan.min_message_size) % unit, unit)


def chunk_elems(plan: Plan, nbytes: int, dtype: str) -> int:
    """Elements per chunk for a message of ``nbytes``; refuses sizes the plan does not accept."""
    _check_dtype(dtype)
    if not plan.accepts(nbytes):
        raise PlanError(
            f"plan {plan.name}: size {nbytes} B is not accepted (range {plan.min_message_size}.."
            f"{plan.max_message_size} B, multiple of {plan.size_chunks * 4 * plan.slices} B)"
        )
    return plan.chunk_bytes(nbytes) // DTYPES[dtype]


# Bytes the reference executor holds, measured on all-gather plans of 8 ranks, x1-x32, Simple and LL (peak
# resident memory over the estimate stays between 0.55 and 0.9 from x8 up): per chunk slot (its happens-before
# record and readers), per entry of a vector clock, per element of data (float32, plus the inputs and the copies
# a comparison makes), per op a thread steps through.
SLOT_BYTES = 400
CLOCK = np.int32  # a vector clock's entries count one thread's ops (bounded by run's deadline_ops, far below 2^31);
CLOCK_BYTES = 4  # half of int64's memory, where plans of many instances hold most of theirs
ELEMENT_BYTES = 16
OP_BYTES = 100  # an op as a thread steps through it: its entry in three tuples and its window


def _executions(ops: tuple[Op, ...]) -> tuple[int, int]:
    """(ops a thread block runs, vector clocks they store: a signal per channel, a semaphore release)."""
    ran = stored = 0
    for op in ops:
        times = _iterations(op) if op.spec.container else 1
        inner = op.ops if op.spec.container else (op,)
        for o in inner:
            ran += times
            if o.spec.device == "signal" or o.spec.signals:
                stored += times * max(1, len(o.channel_ids))
            if o.spec.device == "sem_release":
                stored += times * len(o.semaphore_ids)
    return ran, stored


def estimate_bytes(plan: Plan, nbytes: int, dtype: str, launches: int = 1, copies: int = 1) -> int:
    """About how many bytes ``run_launches`` holds at once for ``launches`` launches of ``plan`` at ``nbytes``:
    every chunk slot of every buffer with its record and data, one vector clock (one entry per thread) per
    thread, per stored signal and per packet slot. Computed from the plan's counts only, before anything is
    allocated, so a plan too large for the machine is refused instead of exhausting its memory. ``copies``: the
    estimate for the plan compiled with that many times its instances (each a copy of its thread blocks and
    chunks), from the one-instance plan, before compiling it."""
    G = plan.slices
    threads = (
        launches * sum(len(g.threadblocks) * copies + len(g.port_peers) for g in plan.gpus)
        + (launches + 1) * plan.nranks
    )
    halves = plan.scratch_copies
    slots = (
        copies
        * G
        * sum(
            g.scratch_chunks * halves
            + (max(g.input_chunks, g.output_chunks) if plan.inplace else g.input_chunks + g.output_chunks)
            for g in plan.gpus
        )
    )
    counts = [_executions(tb.ops) for g in plan.gpus for tb in g.threadblocks]
    stored = copies * launches * sum(s for _, s in counts)
    listed = copies * launches * sum(r for r, _ in counts)  # each thread's ops, a pipeline's once per iteration
    packets = slots if plan.protocol in PACKET_PROTOCOLS else 0
    elems = plan.chunk_bytes(nbytes) // DTYPES.get(dtype, 4) if nbytes else 0  # per chunk of the one-copy plan
    clocks = threads + stored + packets
    return (
        slots * SLOT_BYTES
        + clocks * threads * CLOCK_BYTES
        + listed * OP_BYTES
        + (slots // max(G * copies, 1)) * elems * ELEMENT_BYTES * (1 + launches)
    )


def estimate_ops(plan: Plan, launches: int = 1) -> int:
    """The ops ``run_launches`` steps through, each one costing a vector-clock update of every thread."""
    return launches * sum(_executions(tb.ops)[0] for g in plan.gpus for tb in g.threadblocks)
