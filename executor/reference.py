"""The CPU reference executor: runs a Plan for every rank in one process with numpy, and proves it.

Each thread block is a sequential thread; the executor interleaves them one op at a time. Ops follow the
semantics in ``schedules.plan``. Ordering is tracked with vector clocks: program order within a thread block,
signal -> wait on paired channel ends (the n-th wait after the n-th signal), sem_release -> sem_acquire,
barriers, and packet write -> packet read. Every chunk slot remembers its last write and the reads since, so

- a read of a chunk that no write happens-before (including reading a peer's buffer before the owner's write
  is ordered before the read, or a scratch chunk nobody wrote) is a race (``PlanRace``);
- a write that is not ordered after the previous write and the reads since (write-after-read) is a race too;
- a state where no thread block can run its next op is a deadlock (``PlanDeadlock``) naming the waiting ops;
- an index outside its buffer is a ``PlanError``; a result that differs from numpy's definition of the
  collective is a ``WrongResult``.

Data are kept as float32 arrays holding values of the element type: fp16 and bf16 (emulated: float32 rounded
to its top 16 bits, nearest-even) round after every reduction, as a GPU would.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from schedules.collectives import Collective
from schedules.plan import PACKET_OPS, BufferRef, Op, Plan, PlanError, op_channels, remote_target
from topologies.errors import CheckFailed

DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
_INITIAL = -1  # the writer id of data present before the launch (the caller's input)
_NEVER = -2  # the writer id of a slot nobody wrote


class WrongResult(CheckFailed):
    """The plan ran to completion but computed something other than the collective."""


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
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32)
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
    packet: np.ndarray
    packet_vc: list
    readers: list

    @staticmethod
    def make(chunks: int, elems: int, initial: bool) -> "_Buffer":
        return _Buffer(np.full((chunks, elems), np.nan, dtype=np.float32),
                       np.full(chunks, _INITIAL if initial else _NEVER), np.zeros(chunks, dtype=np.int64),
                       np.zeros(chunks, dtype=bool), [None] * chunks, [dict() for _ in range(chunks)])


@dataclass
class _Thread:
    rank: int
    tb: int
    ops: tuple[Op, ...]
    vc: np.ndarray
    pc: int = 0
    barriers: dict = field(default_factory=lambda: defaultdict(int))


class _Machine:
    """The state of one run: buffers, channel counters, semaphores and thread blocks."""

    def __init__(self, plan: Plan, elems: int, dtype: str):
        self.plan, self.elems, self.dtype = plan, elems, dtype
        self.threads = [_Thread(r, tb.id, tb.ops, None) for r, g in enumerate(plan.gpus) for tb in g.threadblocks]
        for t in self.threads:
            t.vc = np.zeros(len(self.threads), dtype=np.int64)
        self.buffers: dict[tuple[int, str], _Buffer] = {}
        self.alias: dict[tuple[int, str], tuple[str, int]] = {}
        for r, g in enumerate(plan.gpus):
            self._place_buffers(r, g.input_chunks, g.output_chunks, g.scratch_chunks)
        self.peer_end = _pair_channels(plan)
        self.inbound: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
        self.consumed: dict[tuple[int, int], int] = defaultdict(int)
        self.semaphores = {(r, s): [None] * v for r, g in enumerate(plan.gpus) for s, v in enumerate(g.semaphores)}
        self.arrivals: dict[tuple, dict[int, np.ndarray]] = defaultdict(dict)
        self._index = {id(t): i for i, t in enumerate(self.threads)}

    def _place_buffers(self, rank: int, ichunks: int, ochunks: int, schunks: int) -> None:
        e, name = self.elems, self.plan.collective
        self.buffers[(rank, "s")] = _Buffer.make(schunks, e, False)
        self.alias[(rank, "s")] = ("s", 0)
        if not self.plan.inplace:
            self.buffers[(rank, "i")] = _Buffer.make(ichunks, e, True)
            self.buffers[(rank, "o")] = _Buffer.make(ochunks, e, False)
            self.alias[(rank, "i")], self.alias[(rank, "o")] = ("i", 0), ("o", 0)
            return
        # in place: the smaller buffer is the rank's slice of the larger one (see schedules.plan)
        big = _Buffer.make(max(ichunks, ochunks), e, True)
        self.buffers[(rank, "io")] = big
        offset_i = rank * ichunks if name in ("allgather", "gather") else 0
        offset_o = rank * ochunks if name in ("reducescatter", "scatter") else 0
        self.alias[(rank, "i")], self.alias[(rank, "o")] = ("io", offset_i), ("io", offset_o)
        if ichunks < ochunks:  # only the input slice holds data before the launch
            big.writer[:] = _NEVER
            big.writer[offset_i:offset_i + ichunks] = _INITIAL

    def slots(self, rank: int, type: str, ref: BufferRef, where: str) -> tuple[_Buffer, slice]:
        limit = self.plan.gpus[rank].buffer_chunks(type)
        if ref.index + ref.size > limit:
            raise PlanError(f"plan {self.plan.name}: {where}: chunks {ref.index}..{ref.index + ref.size - 1} of "
                            f"rank {rank}'s {type!r} buffer are out of range ({limit} chunks)")
        key, offset = self.alias[(rank, type)]
        return self.buffers[(rank, key)], slice(offset + ref.index, offset + ref.index + ref.size)

    def ready(self, t: _Thread) -> bool:
        """Whether the thread's next op can run now."""
        op = t.ops[t.pc]
        if op.name == "wait":
            need = defaultdict(int)
            for cid in op.channel_ids:
                need[(t.rank, cid)] += 1
            return all(len(self.inbound[end]) >= self.consumed[end] + n for end, n in need.items())
        if op.name == "sem_acquire":
            need = defaultdict(int)
            for s in op.semaphore_ids:
                need[s] += 1
            return all(len(self.semaphores[(t.rank, s)]) >= n for s, n in need.items())
        if op.name == "barrier":  # arriving is the one effect of asking: the barrier opens once all arrived
            arrived = self.arrivals[(t.rank, op.barrier_id, t.barriers[op.barrier_id])]
            arrived.setdefault(self._index[id(t)], t.vc.copy())
            return len(arrived) >= op.num_threadblocks
        for ref in _packet_sources(op):
            buf, sl = self.slots(t.rank, ref.type, ref, self.where(t))
            if not buf.packet[sl].all():
                return False
        return True

    def where(self, t: _Thread) -> str:
        return f"rank {t.rank} threadblock {t.tb} op {t.pc} ({t.ops[t.pc].name})"

    def blocked_reason(self, t: _Thread) -> str:
        op, gpu = t.ops[t.pc], self.plan.gpus[t.rank]
        peers = gpu.memory_peers
        if op.name == "wait":
            return f"{self.where(t)} waits on channel {op.channel_ids[0]} from rank {peers[op.channel_ids[0]]}"
        if op.name == "sem_acquire":
            return f"{self.where(t)} waits on semaphore {op.semaphore_ids[0]}"
        if op.name == "barrier":
            return f"{self.where(t)} waits at barrier {op.barrier_id}"
        return f"{self.where(t)} waits for packets"

    def step(self, t: _Thread) -> None:
        op = t.ops[t.pc]
        me = self._index[id(t)]
        t.vc[me] += 1
        if op.name == "wait":
            for cid in op.channel_ids:
                end = (t.rank, cid)
                np.maximum(t.vc, self.inbound[end][self.consumed[end]], out=t.vc)
                self.consumed[end] += 1
        elif op.name == "sem_acquire":
            for s in op.semaphore_ids:
                released = self.semaphores[(t.rank, s)].pop(0)
                if released is not None:  # None: a token of the semaphore's init_value
                    np.maximum(t.vc, released, out=t.vc)
        elif op.name == "sem_release":
            for s in op.semaphore_ids:
                self.semaphores[(t.rank, s)].append(t.vc.copy())
        elif op.name == "barrier":
            key = (t.rank, op.barrier_id, t.barriers[op.barrier_id])
            for vc in self.arrivals[key].values():
                np.maximum(t.vc, vc, out=t.vc)
            t.barriers[op.barrier_id] += 1
        if op.name in ("put", "pws", "get", "copy", "re", "res", "rre", "rres") or op.name in PACKET_OPS:
            self._move(t, me, op)
        if op.name in ("signal", "pws"):
            for cid in op.channel_ids:
                self.inbound[self.peer_end[(t.rank, cid)]].append(t.vc.copy())
        t.pc += 1

    def _move(self, t: _Thread, me: int, op: Op) -> None:
        gpu = self.plan.gpus[t.rank]
        tb = gpu.threadblocks[t.tb]
        where = self.where(t)

        def locate(ref: BufferRef) -> tuple[int, _Buffer, slice]:
            rank, type = remote_target(gpu, tb, op, ref) if ref.remote else (t.rank, ref.type)
            return (rank,) + self.slots(rank, type, ref, where)

        packet_src = set(map(id, _packet_sources(op)))
        values = []
        for ref in op.src_buff:
            rank, buf, sl = locate(ref)
            values.append(self._read(t, me, buf, sl, id(ref) in packet_src, rank, ref, where))
        writes_packets = op.name in ("ppkt", "rppkt", "tpkt", "cpkt") or (op.name == "respkt")
        if op.name in ("re", "res", "rre", "rres", "repkt", "respkt"):
            total = values[0].copy()
            for v in values[1:]:
                total = round_to(total + v, self.dtype)
            results = [total] * len(op.dst_buff)
        else:
            results = values
        for ref, value in zip(op.dst_buff, results):
            rank, buf, sl = locate(ref)
            packet = writes_packets and (ref.remote or op.name in ("tpkt", "cpkt"))
            self._write(t, me, buf, sl, value, packet, rank, ref, where)

    def _read(self, t: _Thread, me: int, buf: _Buffer, sl: slice, packet: bool, rank: int, ref: BufferRef,
              where: str) -> np.ndarray:
        for k in range(sl.start, sl.stop):
            if packet:
                np.maximum(t.vc, buf.packet_vc[k], out=t.vc)
            else:
                if buf.packet[k]:
                    raise PlanRace(f"plan {self.plan.name}: {where} reads chunk {k} of rank {rank}'s "
                                   f"{_name(ref)} buffer as plain data, but it holds packets")
                w = buf.writer[k]
                if w == _NEVER:
                    raise PlanRace(f"plan {self.plan.name}: {where} reads chunk {k} of rank {rank}'s "
                                   f"{_name(ref)} buffer, which nothing wrote")
                if w != _INITIAL and t.vc[w] < buf.clock[k]:
                    raise PlanRace(f"plan {self.plan.name}: {where} reads chunk {k} of rank {rank}'s "
                                   f"{_name(ref)} buffer before its write by {self._describe(w)} is ordered "
                                   "before the read (missing signal/wait?)")
            buf.readers[k][me] = t.vc[me]
        return buf.data[sl].copy()

    def _write(self, t: _Thread, me: int, buf: _Buffer, sl: slice, value: np.ndarray, packet: bool, rank: int,
               ref: BufferRef, where: str) -> None:
        for k in range(sl.start, sl.stop):
            w = buf.writer[k]
            if w >= 0 and w != me and t.vc[w] < buf.clock[k]:
                raise PlanRace(f"plan {self.plan.name}: {where} overwrites chunk {k} of rank {rank}'s "
                               f"{_name(ref)} buffer concurrently with a write by {self._describe(w)}")
            for reader, clock in buf.readers[k].items():
                if reader != me and t.vc[reader] < clock:
                    raise PlanRace(f"plan {self.plan.name}: {where} overwrites chunk {k} of rank {rank}'s "
                                   f"{_name(ref)} buffer while {self._describe(reader)} may still read it")
            buf.writer[k], buf.clock[k], buf.readers[k] = me, t.vc[me], {}
            buf.packet[k] = packet
            buf.packet_vc[k] = t.vc.copy() if packet else None
        buf.data[sl] = value

    def _describe(self, index: int) -> str:
        t = self.threads[index]
        return f"rank {t.rank} threadblock {t.tb}"

    def run(self, deadline_ops: int) -> None:
        live = [t for t in self.threads if t.ops]
        executed = 0
        while live:
            progressed = False
            for t in live:
                if self.ready(t):
                    self.step(t)
                    progressed = True
                    executed += 1
            live = [t for t in live if t.pc < len(t.ops)]
            if not progressed:
                waiting = [self.blocked_reason(t) for t in live]
                more = f" (and {len(waiting) - 3} more)" if len(waiting) > 3 else ""
                raise PlanDeadlock(f"plan {self.plan.name}: deadlock: no thread block can progress: "
                                   f"{'; '.join(waiting[:3])}{more}")
            if executed > deadline_ops:
                raise PlanDeadlock(f"plan {self.plan.name}: no end after {executed} ops")
        self._check_outputs_landed()

    def _check_outputs_landed(self) -> None:
        """Every output chunk's last write must happen before the owning rank's kernel ends."""
        for r, g in enumerate(self.plan.gpus):
            end = np.max([t.vc for t in self.threads if t.rank == r], axis=0) if g.threadblocks else None
            buf, sl = self.slots(r, "o", BufferRef(0, g.output_chunks, "o"), "output")
            for k in range(sl.start, sl.stop):
                w = buf.writer[k]
                if w >= 0 and (end is None or end[w] < buf.clock[k]):
                    raise PlanRace(f"plan {self.plan.name}: output chunk {k - sl.start} of rank {r} is written by "
                                   f"{self._describe(w)} with no happens-before edge to the end of rank {r}'s "
                                   "kernel (missing wait?)")


def _name(ref: BufferRef) -> str:
    return {"i": "input", "o": "output", "s": "scratch"}.get(ref.type or "", "remote")


def _packet_sources(op: Op) -> list[BufferRef]:
    """The src entries an op reads as packets."""
    if op.name in ("rppkt", "upkt", "cpkt"):
        return list(op.src_buff)
    if op.name in ("repkt", "respkt"):
        return list(op.src_buff[1:])
    return []


def _pair_channels(plan: Plan) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, channel id) -> the paired (peer, channel id): the m-th channel a->b pairs with the m-th b->a."""
    ends: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r, g in enumerate(plan.gpus):
        for cid, peer in enumerate(g.memory_peers):
            ends[(r, peer)].append(cid)
    pairs = {}
    for (r, peer), cids in ends.items():
        back = ends.get((peer, r), [])
        for m, cid in enumerate(cids):
            if m >= len(back):
                raise PlanError(f"plan {plan.name}: gpus[{r}].channels: channel {cid} to rank {peer} has no "
                                f"matching channel on rank {peer} (it lists {len(back)} to rank {r})")
            pairs[(r, cid)] = (peer, back[m])
    return pairs


def chunk_elems(plan: Plan, nbytes: int, dtype: str) -> int:
    """Elements per chunk for a message of ``nbytes``; refuses sizes the plan does not accept."""
    _check_dtype(dtype)
    if not plan.accepts(nbytes):
        raise PlanError(f"plan {plan.name}: size {nbytes} B is not accepted (range {plan.min_message_size}.."
                        f"{plan.max_message_size} B, multiple of {plan.size_chunks * 4} B)")
    return plan.chunk_bytes(nbytes) // DTYPES[dtype]


def run_reference(plan: Plan, inputs: list[np.ndarray], nbytes: int, dtype: str) -> list[np.ndarray]:
    """Run ``plan`` on every rank's input buffer; returns every rank's output buffer (float32 arrays).

    ``inputs[r]`` holds rank r's input buffer (``input_chunks × chunk elements`` values; bf16 as float32).
    """
    elems = chunk_elems(plan, nbytes, dtype)
    if len(inputs) != plan.nranks:
        raise PlanError(f"plan {plan.name}: inputs: {len(inputs)} arrays for {plan.nranks} ranks")
    m = _Machine(plan, elems, dtype)
    for r, (g, x) in enumerate(zip(plan.gpus, inputs)):
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if x.size != g.input_chunks * elems:
            raise PlanError(f"plan {plan.name}: inputs[{r}]: {x.size} elements, expected "
                            f"{g.input_chunks * elems} ({g.input_chunks} chunks of {elems})")
        buf, sl = m.slots(r, "i", BufferRef(0, g.input_chunks, "i"), "input") if g.input_chunks else (None, None)
        if buf is not None:
            buf.data[sl] = round_to(x, dtype).reshape(g.input_chunks, elems)
    m.run(deadline_ops=10 * sum(len(t.ops) for t in m.threads) + 100)
    outputs = []
    for r, g in enumerate(plan.gpus):
        key, offset = m.alias[(r, "o")]
        outputs.append(m.buffers[(r, key)].data[offset:offset + g.output_chunks].reshape(-1).copy())
    return outputs


def expected_outputs(collective: Collective, inputs: list[np.ndarray], elems: int,
                     dtype: str) -> list[dict[int, np.ndarray]]:
    """numpy's definition of the collective: for each rank, output index -> the chunk it must hold."""
    n = collective.nranks
    value: dict[int, np.ndarray] = {}
    for r in range(n):
        x = np.asarray(inputs[r], dtype=np.float32).reshape(-1, elems)
        held = collective.precondition(r)
        for idx, chunk in enumerate(collective.input_map(r)):
            if chunk not in held:
                continue
            if collective.combining:
                value[chunk] = value[chunk] + x[idx] if chunk in value else x[idx].copy()
            else:
                value[chunk] = x[idx]
    if collective.combining:
        value = {c: round_to(v, dtype) for c, v in value.items()}
    expected = []
    for r in range(n):
        need = collective.postcondition(r)
        expected.append({idx: value[c] for idx, c in enumerate(collective.output_map(r)) if c in need})
    return expected


def random_inputs(plan: Plan, elems: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Non-zero random integers small enough that every sum is exact in fp16 and bf16."""
    bound = max(1, 256 // (2 * plan.nranks))
    inputs = []
    for g in plan.gpus:
        x = rng.integers(1, bound + 1, size=g.input_chunks * elems) * rng.choice([-1, 1], size=g.input_chunks * elems)
        inputs.append(x.astype(np.float32))
    return inputs


@dataclass(frozen=True)
class VerificationRecord:
    """What ``check_plan`` proved: the plan's hash, the sizes and dtypes it ran, and the outcome."""

    plan_hash: str
    ok: bool
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    seed: int
    checks: tuple[str, ...]
    executor: str = "reference"

    def to_json(self) -> dict[str, Any]:
        return {"plan_hash": self.plan_hash, "ok": self.ok, "executor": self.executor, "sizes": list(self.sizes),
                "dtypes": list(self.dtypes), "seed": self.seed, "checks": list(self.checks)}


def check_plan(plan: Plan, sizes: Iterable[int], dtypes: Iterable[str] = ("fp32", "fp16", "bf16"), seed: int = 0,
               progress: Callable[[str], None] | None = None) -> VerificationRecord:
    """Run ``plan`` on random non-zero data for every size and dtype and compare with numpy's collective.

    Raises WrongResult, PlanDeadlock or PlanRace on the first failure.
    """
    sizes, dtypes = tuple(sizes), tuple(dtypes)
    collective = plan.collective_spec()
    rng = np.random.default_rng(seed)
    checks = []
    for nbytes in sizes:
        for dtype in dtypes:
            elems = chunk_elems(plan, nbytes, dtype)
            inputs = random_inputs(plan, elems, rng)
            outputs = run_reference(plan, inputs, nbytes, dtype)
            for r, want in enumerate(expected_outputs(collective, inputs, elems, dtype)):
                got = outputs[r].reshape(-1, elems)
                for idx, chunk_value in want.items():
                    if not np.array_equal(got[idx], chunk_value):
                        bad = int(np.flatnonzero(got[idx] != chunk_value)[0])
                        raise WrongResult(
                            f"plan {plan.name}: wrong result at {nbytes} B {dtype}: rank {r} output chunk {idx} "
                            f"element {bad} is {got[idx][bad]!r}, expected {chunk_value[bad]!r}")
            checks.append(f"{plan.collective} {nbytes}B {dtype}: ok")
            if progress:
                progress(checks[-1])
    return VerificationRecord(plan.content_hash, True, sizes, dtypes, seed, tuple(checks))
