"""Plan -> device tables: the flattened op array the interpreter kernel walks, for one rank and one size.

Pure Python and numpy (no GPU). Every plan op becomes one or more device ops: pairwise ops (put, get, copy and
the pairwise packet ops) become one transfer per pair, or, for packets of one source to every destination (a
one-shot's put to each peer), one transfer that reads the source once and writes each destination, or, for plain
data where every pair is as long (a multi-peer op, ``codegen.peers``), one ``PAIRS`` transfer that moves them side
by side; ``pws`` becomes its puts
and a signal, and the reductions become one transfer that sums every source into every destination. A reference
names a buffer slot (0 input, 1 output, 2 scratch, 3+k the GPU's ``remote_buffers[k]``, then the residual) and a
byte offset, so the kernel does no chunk arithmetic. The kernel reads these layouts from contract.cuh (emitted).

An all-reduce with a residual (``residual=True``) returns the sum plus a residual tensor in the same launch, as
a transformer layer's ``x + all_reduce(y)``: each reduction that completes a sum and writes an output adds its
rank's residual after the sum (``machine.residual_sums``), so the result is rounded as the sum then the add
would be (``executor.reference.norm.residual_refusal`` proves a plan adds it exactly once everywhere).

Executions captured in CUDA graphs on buffers of their own get binding records (``BindingLayout``); what a
record holds once peers have told each other their buffers is worked out here too (``peer_slots``).

>>> from schedules.plan import load_plan
>>> plan = load_plan("tests/fixtures/plans/allpairs_allreduce_2.json")
>>> t = build_tables(plan, 0, 1024)
>>> t.chunk_bytes, len(t.ops), t.tb_start.tolist(), t.vector_bytes
(512, 7, [0, 7], 16)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.errors import ExecutorError
from executor.gpu import lamport
from executor.gpu.protocols import protocol_refusal
from executor.reference import machine
from executor.reference.norm import RowNorm, RowSpan, row_spans
from schedules.ops import DEVICE_KINDS
from schedules.plan.types import PACKET_PROTOCOLS, BufferRef, Gpu, Op, Plan, Threadblock, channel_pairs

MAX_REFS = 16
MAX_CHANNELS_PER_OP = 16
MAX_CHANNELS = 1024
MAX_BARRIERS = 64
MAX_SLOTS = 64  # buffer slots (input, output, scratch, peers' buffers, then the residual, weight and normed rows)
DTYPE_BYTES = machine.DTYPES  # bytes per element by weft's dtype names

# The host/device contract: every name below that the kernel reads is emitted into executor/gpu/cuda/contract.cuh
# (executor.gpu.contract), which the CUDA sources include, so that each is written once.
NOP, BARRIER, SIGNAL, WAIT, FLUSH, TRANSFER, SEM_ACQUIRE, SEM_RELEASE = range(8)
NORM_ROWS = 64  # the fused RMSNorm epilogue over whole rows, outside the op table's kinds (kNormRows)
NORM_PREFETCH = 65  # the norm weight prefetched first in a block that runs the epilogue (kNormPrefetch)
NORM_SLICE = 66  # the epilogue over one slice of a row that several blocks sum (kNormSlice; reference.norm.RowSpan)
Record = np.ndarray  # one op-table row: a 0-d array of OP_DTYPE

DEVICE_CODES = dict(zip(DEVICE_KINDS, range(len(DEVICE_KINDS)), strict=True))  # kNop..kSemRelease
PAIRS = 8  # kPairs: a plain pairwise op's pairs (src[j] -> dst[j], all one length) side by side
LAMPORT_RESET = 9  # kLamportReset: the sentinel over this block's share of the Lamport scratch copy that is free
KERNEL_ONLY_CODES = {"pairs": PAIRS, "lamport_reset": LAMPORT_RESET}  # device op types no op-table row names
# a reference's flags (RefFlags): read or written as LL packets; in the scratch half (or Lamport copy) in use; read
# or written as Lamport data (polled for the sentinel, written mapped: executor/gpu/cuda/lamport.cuh)
PACKET, SCRATCH, LAMPORT = 1, 2, 4
SLOTS = {"i": 0, "o": 1, "s": 2}  # the local buffers' slots
PEER_SLOTS = 3  # remote_buffers[k] is slot PEER_SLOTS + k; the residual, weight and normed rows follow the peers


@dataclass(frozen=True)
class ErrorKind:
    """A kind the kernel writes into the error record's word 1 (ErrorKind in contract.cuh) and how the host says it."""

    code: int
    name: str  # the C enumerator, after its k
    message: str


ERROR_KINDS = (
    ErrorKind(0, "Ok", ""),
    ErrorKind(1, "WaitTimeout", "wait on a channel"),
    ErrorKind(2, "PacketTimeout", "packets never arrived"),
    ErrorKind(3, "BarrierTimeout", "barrier never completed"),
    ErrorKind(4, "Aborted", "aborted"),
    # a row slice's wait for its row's other sums of squares (blocks of this GPU)
    ErrorKind(5, "NormTimeout", "the row's other slices never sent their sums of squares"),
)

# The interpreter kernel's parameters in order, with their C types (WEFT_KERNEL_PARAMS in contract.cuh, which
# WEFT_INTERPRETER in interpreter.cu declares); a -DWEFT_TRACE build takes TRACE_PARAM last.
KERNEL_PARAMS = (
    ("ops", "const weft::Op*"),
    ("tb_start", "const int*"),
    ("buffers", "char* const*"),
    ("outbound", "u64* const*"),
    ("inbound", "u64*"),
    ("expected", "u64*"),
    ("barriers", "u64*"),
    ("semaphores", "u64*"),
    ("epochs", "u64*"),
    ("error", "int*"),
    ("timeout_ns", "u64"),
    ("rank", "int"),
    ("scratch_half", "i64"),
    ("nslots", "int"),
    ("uniform_ops", "int"),
)
TRACE_PARAM = ("trace", "u64*")
_SCALARS = {"u64": np.uint64, "i64": np.int64, "int": np.int32}


def kernel_args(**values: Any) -> tuple:
    """The interpreter's arguments in KERNEL_PARAMS order: device arrays as given, scalars as their C type, and a
    pointer given as an integer address as a u64. A traced build's (-DWEFT_TRACE) takes TRACE_PARAM last: given
    by its name, it is appended."""
    params = KERNEL_PARAMS + ((TRACE_PARAM,) if TRACE_PARAM[0] in values else ())
    names = [n for n, _ in params]
    if set(values) != set(names):
        raise ExecutorError(f"executor: interpreter arguments {sorted(set(values) ^ set(names))} missing or unknown")
    return tuple(_scalar(values[n], ctype) for n, ctype in params)


def with_kernel_args(args: tuple, **changes: Any) -> tuple:
    """``args`` (as ``kernel_args`` built them) with some parameters replaced."""
    params = KERNEL_PARAMS + (TRACE_PARAM,)
    index = {n: k for k, (n, _) in enumerate(params)}
    out = list(args)
    for name, value in changes.items():
        out[index[name]] = _scalar(value, params[index[name]][1])
    return tuple(out)


def _scalar(value: Any, ctype: str) -> Any:
    if ctype in _SCALARS:
        return _SCALARS[ctype](value)
    return np.uint64(value) if isinstance(value, (int, np.integer)) else value


REF_DTYPE = np.dtype([("offset", "<i8"), ("buffer", "<i4"), ("flags", "<i4")])
OP_DTYPE = np.dtype(
    [
        ("type", "<i4"),
        ("nsrc", "<i4"),
        ("ndst", "<i4"),
        ("nchannel", "<i4"),
        ("barrier_id", "<i4"),
        ("barrier_count", "<i4"),
        ("plan_op", "<i4"),
        ("line_chunk", "<i4"),
        ("bytes", "<i8"),
        ("channel", "<i4", (MAX_CHANNELS_PER_OP,)),
        ("src", REF_DTYPE, (MAX_REFS,)),
        ("dst", REF_DTYPE, (MAX_REFS,)),
    ]
)


@dataclass(frozen=True)
class DeviceTables:
    """Everything one rank's launch needs that depends on the plan and the size, not on the buffers."""

    ops: np.ndarray  # OP_DTYPE records
    tb_start: np.ndarray  # int32, nthreadblocks + 1
    chunk_bytes: int
    vector_bytes: int  # 16, 8 or 4: the widest unit that divides every offset and length
    input_bytes: int
    output_bytes: int
    scratch_bytes: int  # one scratch half
    double_scratch: bool
    channel_peers: tuple[int, ...]  # channel id -> peer rank
    paired_channel: tuple[int, ...]  # channel id -> the peer's channel id it signals
    semaphore_init: tuple[int, ...]
    remote_buffers: tuple[tuple[int, str], ...]  # slot 3+k -> (rank, buffer type)
    threads: int
    lines: bool = False  # packets are LL128 lines (lines_possible), else LL16/LL8 packets
    residual: bool = False  # the slot after the remote buffers holds a residual that output reductions add
    norm: bool = False  # then two more slots: the RMSNorm weight and the normalized rows (executor.reference.norm)
    norm_slots: int = 0  # bytes at norm_at where row slices exchange sums of squares
    norm_at: int = 0  # past every rank's scratch (both halves, 16-aligned): no peer's packet can land in the slots
    lamport_buffers: int = 0  # a Lamport plan's scratch copies (scratch_bytes each), else 0 (executor.gpu.lamport)
    scratch_fill: int = 0  # the u32 word the scratch copies start as: 0, or a Lamport plan's sentinel in its dtype
    inplace: bool = False  # the input and output slots are one buffer (an in-place plan); else apart in compiled calls

    @property
    def scratch_copies(self) -> int:
        return self.lamport_buffers or (2 if self.double_scratch else 1)

    @property
    def scratch_stride(self) -> int:
        """The interpreter's scratch_half: bytes between scratch copies (halves or Lamport copies), 0 for one."""
        return self.scratch_bytes if self.scratch_copies > 1 else 0

    @property
    def scratch_alloc(self) -> int:
        """Bytes of the scratch allocation: the copies, then the norm's slots (a context zeroes it all at reset)."""
        return self.norm_at + self.norm_slots if self.norm_slots else self.scratch_bytes * self.scratch_copies

    @property
    def nthreadblocks(self) -> int:
        return len(self.tb_start) - 1

    @property
    def nslots(self) -> int:
        """Buffer slots a launch binds: input, output, scratch, the remote buffers, then the residual if any (and
        the norm's weight and normalized rows)."""
        return PEER_SLOTS + len(self.remote_buffers) + int(self.residual) + 2 * int(self.norm)

    @property
    def uniform_ops(self) -> int:
        """Ops per thread block where every block has as many (block b's then start at b times it), else 0: the
        interpreter then loads a block's first ops beside its range instead of after it (one memory round trip
        less before the first op, which counts where the tables are cold in L2, as after a matmul)."""
        counts = set(np.diff(self.tb_start).tolist())
        return counts.pop() if len(counts) == 1 and self.tb_start[0] == 0 else 0


def check_world(plan: Plan, world_size: int) -> None:
    """Refuse, with one line, a plan written for another number of ranks."""
    if plan.nranks != world_size:
        raise ExecutorError(f"plan {plan.name}: written for {plan.nranks} ranks, but the communicator has {world_size}")


def check_launch(plan: Plan, world_size: int, nbytes: int, dtype: str) -> None:
    """Refuse, with one line, a launch this plan cannot do: world size, dtype or message size."""
    check_world(plan, world_size)
    if dtype not in DTYPE_BYTES:
        raise ExecutorError(f"plan {plan.name}: dtype {dtype!r} is not supported (fp32, fp16, bf16)")
    if dtype not in plan.weft.dtypes:
        raise ExecutorError(
            f"plan {plan.name}: dtype {dtype} is not among the plan's dtypes ({', '.join(plan.weft.dtypes)})"
        )
    if not plan.accepts(nbytes):
        raise ExecutorError(
            f"plan {plan.name}: size {nbytes} B is not accepted (range {plan.min_message_size}.."
            f"{plan.max_message_size} B, a multiple of {plan.size_chunks * 4} B)"
        )
    if nbytes // plan.size_chunks % DTYPE_BYTES[dtype]:
        raise ExecutorError(f"plan {plan.name}: size {nbytes} B splits into chunks that are not whole {dtype} elements")


def pair_channels(plan: Plan) -> dict[tuple[int, int], int]:
    """(rank, channel id) -> the peer's channel id it pairs with (``schedules.plan.types.channel_pairs``)."""
    return {end: back for end, (_, back) in channel_pairs(plan).items()}


def vector_bytes(*quantities: int) -> int:
    """The widest of 16, 8 and 4 bytes dividing every quantity (offsets, lengths, addresses)."""
    for width in (16, 8, 4):
        if all(q % width == 0 for q in quantities):
            return width
    raise ExecutorError(f"byte quantities {quantities} are not multiples of 4 bytes")


LINE_BYTES, LINE_DATA = 128, 120  # an LL128 line: 120 data bytes and an 8-byte flag


def lines_possible(plan: Plan, nbytes: int) -> bool:
    """Whether an LL plan's packets can be LL128 lines at this size: chunks of whole 8-byte words, whole warps.

    Lines carry 120 data bytes per 128 on the wire where LL16 packets carry 8 per 16, so they suit the sizes
    where bytes on the wire, not latency, decide. The choice is the executor's: the plan is the same LL plan."""
    if plan.protocol != "LL" or not plan.accepts(nbytes):
        return False
    cb = plan.chunk_bytes(nbytes)
    return cb % 8 == 0 and cb < 2**31 and min(plan.num_threads_per_block, 1024) % 32 == 0


def _check_fits(plan: Plan, rank: int, nbytes: int, lines: bool, residual: bool, norm: RowNorm | None) -> None:
    """Raise ExecutorError where ``build_tables`` cannot lower this rank's part at this size and with these options."""
    why = protocol_refusal(plan)
    if why:
        raise ExecutorError(why)
    if norm is not None and not residual:
        raise ExecutorError(f"plan {plan.name}: the norm epilogue needs the residual")
    if not plan.accepts(nbytes):
        raise ExecutorError(
            f"plan {plan.name}: size {nbytes} B is not accepted (range {plan.min_message_size}.."
            f"{plan.max_message_size} B, a multiple of {plan.size_chunks * 4} B)"
        )
    gpu = plan.gpus[rank]
    if lines and not lines_possible(plan, nbytes):
        raise ExecutorError(
            f"plan {plan.name}: {nbytes} B cannot move as LL128 lines (LL plans with chunks of "
            "whole 8-byte words and whole warps only)"
        )
    if gpu.port_peers:
        raise ExecutorError(
            f"plan {plan.name}: gpus[{rank}] has port channels (to ranks "
            f"{sorted(set(gpu.port_peers))}): the GPU interpreter runs memory channels only; "
            "port-channel plans run through executor.port.engine"
        )
    if len(gpu.memory_peers) > MAX_CHANNELS:
        raise ExecutorError(
            f"plan {plan.name}: gpus[{rank}] has {len(gpu.memory_peers)} channels (the executor holds {MAX_CHANNELS})"
        )
    if PEER_SLOTS + len(gpu.remote_buffers) + int(residual) + 2 * int(norm is not None) > MAX_SLOTS:
        raise ExecutorError(
            f"plan {plan.name}: gpus[{rank}] maps {len(gpu.remote_buffers)} peer buffers "
            f"(the executor holds {MAX_SLOTS - PEER_SLOTS - int(residual)})"
        )


def build_tables(
    plan: Plan,
    rank: int,
    nbytes: int,
    lines: bool = False,
    residual: bool = False,
    norm: RowNorm | None = None,
    dtype: str = "bf16",
) -> DeviceTables:
    """The device tables of ``rank`` for a message of ``nbytes`` (sizes as ``Plan.accepts`` defines them).

    ``lines``: move an LL plan's packets as LL128 lines (needs ``lines_possible``). ``residual``: the launch
    binds a residual after the remote buffers, added by the reductions that complete a sum and write an output
    (``executor.reference.norm.residual_refusal``). ``norm``: with a residual, each of those reductions is followed
    by the RMSNorm epilogue over its rows of ``dtype`` (``executor.reference.norm``), the weight and the normalized
    rows in the two slots after the residual, and such a block starts by prefetching the weight; every block is
    padded with nops to one op count (so the kernel still loads a block's first ops beside its range)."""
    _check_fits(plan, rank, nbytes, lines, residual, norm)
    gpu = plan.gpus[rank]
    cb = plan.chunk_bytes(nbytes)
    packets = plan.protocol == "LL"  # a Lamport plan's scratch holds the data alone (1x)
    per_chunk = (cb + LINE_DATA - 1) // LINE_DATA * LINE_BYTES
    layout = _Layout(plan, gpu, cb, (per_chunk if lines else 2 * cb) if packets else cb)
    records: list[Record] = []
    starts = [0]
    residual_at = machine.residual_sums(plan) if residual else {}
    row_bytes = norm.row_bytes(dtype) if norm is not None else 0
    spans: dict[tuple[int, int, int], RowSpan] = {}
    norm_at, norm_slots, widest = 0, 0, 0
    stride = max(g.scratch_chunks for g in plan.gpus) * layout.scratch_chunk  # one copy, alike on every rank
    if norm is not None:
        found = row_spans(plan, nbytes, dtype, norm)
        if isinstance(found, str):
            raise ExecutorError(found)
        spans = found
        spans = {(r, t, i): span for (r, t, i), span in spans.items() if r == rank}
        widest = max((span.slices for span in spans.values() if span.slices > 1), default=0)
        # past the widest rank's halves or Lamport copies (a peer writes this rank's scratch at offsets of its own
        # half size; every Lamport copy, which the resets and fill_scratch keep to, is ``stride`` apart)
        norm_at, norm_slots = (
            (stride * _copies(plan) + 15) // 16 * 16,
            8 * widest * (gpu.output_chunks * cb // row_bytes),
        )
    resets = _reset_records(plan, len(gpu.threadblocks), gpu.scratch_chunks * layout.scratch_chunk)
    by_block: dict[int, list] = {}
    for (_, b, _), span in sorted(spans.items()):
        by_block.setdefault(b, []).append(span)
    residual_slot = PEER_SLOTS + len(gpu.remote_buffers)  # then the weight and the normed rows
    for t, tb in enumerate(gpu.threadblocks):
        block_first = len(records)
        mine = by_block.get(t, [])
        if mine:
            records.append(_prefetch_record(mine[0], row_bytes, residual_slot))
        for i, op in enumerate(tb.ops):
            where = f"plan {plan.name}: gpus[{rank}].threadblocks[{t}].ops[{i}]"
            for rec in _lower(op, tb, layout, where):
                rec["plan_op"] = i
                if plan.lamport is not None and rec["type"] in (TRANSFER, PAIRS):
                    rec["barrier_count"] = plan.lamport.buffers  # the kernel shifts its scratch to the epoch's copy
                if lines and rec["type"] == TRANSFER and _moves_packets(rec):
                    rec["line_chunk"] = cb
                records.append(rec)
            chunk = residual_at.get((rank, t, i))
            if chunk is not None:  # a reduction lowers to one transfer, the last record
                _add_source(records[-1], (chunk * cb, residual_slot, 0), where)
                if norm is not None:
                    span = spans[(rank, t, i)]
                    records.append(
                        _norm_record(span.first, span.nbytes, row_bytes, norm.eps, residual_slot, i)
                        if span.slices == 1
                        else _slice_record(span, norm_at + 8 * widest * span.row, norm.eps, residual_slot, i)
                    )
        if plan.lamport is not None:
            records.insert(_reset_at(records, block_first), resets[t])
        starts.append(len(records))
    if norm is not None:
        records, starts = _padded(records, starts)
    ops = np.zeros(len(records), OP_DTYPE)
    for k, rec in enumerate(records):
        ops[k] = rec
    pairs = pair_channels(plan)
    quantities = [cb, layout.scratch_chunk] + [
        int(q)
        for rec in records
        if rec["type"] in (TRANSFER, LAMPORT_RESET)
        for q in (rec["bytes"], *rec["src"]["offset"][: rec["nsrc"]], *rec["dst"]["offset"][: rec["ndst"]])
    ]
    quantities += [row_bytes, *(q for span in spans.values() for q in (span.first, span.nbytes))]
    return DeviceTables(
        ops=ops,
        tb_start=np.asarray(starts, np.int32),
        chunk_bytes=cb,
        vector_bytes=vector_bytes(*quantities),
        input_bytes=gpu.input_chunks * cb,
        output_bytes=gpu.output_chunks * cb,
        scratch_bytes=stride if plan.lamport is not None else gpu.scratch_chunks * layout.scratch_chunk,
        double_scratch=plan.use_double_scratch_buffer,
        channel_peers=gpu.memory_peers,
        paired_channel=tuple(pairs.get((rank, c), -1) for c in range(len(gpu.memory_peers))),  # -1: never signalled
        semaphore_init=gpu.semaphores,
        remote_buffers=tuple((b.rank, b.type) for b in gpu.remote_buffers),
        threads=min(plan.num_threads_per_block, 1024),
        lines=lines,
        residual=residual,
        norm=norm is not None,
        norm_slots=norm_slots,
        norm_at=norm_at,
        lamport_buffers=plan.lamport.buffers if plan.lamport is not None else 0,
        scratch_fill=lamport.sentinel_word(dtype) if plan.lamport is not None else 0,
        inplace=plan.inplace,
    )


def _copies(plan: Plan) -> int:
    """The scratch copies every rank of ``plan`` holds: its Lamport copies, else its halves (2) or 1."""
    if plan.lamport is not None:
        return plan.lamport.buffers
    return 2 if plan.use_double_scratch_buffer else 1


def _reset_at(records: list[Record], first: int) -> int:
    """Where a Lamport block's reset goes among its records ``records[first:]``: before its first op that polls
    Lamport data, so that its stores issue while the block's puts fly and its peers' data is on the way, not after
    the last wait, where the launch's end would wait for them; at the end for a block that polls nothing. The
    reference executor proves a reset at any time during its launch (``executor.reference.lamport``)."""
    for k in range(first, len(records)):
        rec = records[k]
        if rec["type"] in (TRANSFER, PAIRS) and any(rec["src"][i]["flags"] & LAMPORT for i in range(rec["nsrc"])):
            return k
    return len(records)


def _reset_records(plan: Plan, blocks: int, copy_bytes: int) -> list[Record]:
    """Each thread block's reset op in a Lamport plan (``_reset_at`` places it): the sentinel over its share of this
    rank's ``copy_bytes`` of the copy ``(epoch + reset_ahead) % buffers`` (``executor.gpu.lamport.reset_shares``);
    none for other plans."""
    if plan.lamport is None:
        return []
    recs = []
    for first, nbytes in lamport.reset_shares(copy_bytes, blocks):
        rec = _record(LAMPORT_RESET)
        rec["ndst"], rec["bytes"] = 1, nbytes
        rec["barrier_id"], rec["barrier_count"] = plan.lamport.reset_ahead, plan.lamport.buffers
        rec["plan_op"] = -1
        rec["dst"][0] = (first, SLOTS["s"], SCRATCH)
        recs.append(rec)
    return recs


def _norm_record(first: int, nbytes: int, row_bytes: int, eps: float, residual_slot: int, plan_op: int) -> Record:
    """The epilogue over output bytes ``first..first+nbytes``: the rows (output slot), the weight (the slot after
    the residual) and the normalized rows (the next slot); a row's bytes in barrier_id, eps's fp32 bits in
    channel[0] (norm.cuh reads them there)."""
    rec = np.zeros((), OP_DTYPE)
    rec["type"], rec["nsrc"], rec["ndst"], rec["plan_op"], rec["bytes"] = NORM_ROWS, 2, 1, plan_op, nbytes
    rec["barrier_id"] = row_bytes
    rec["channel"][0] = int(np.float32(eps).view(np.int32))
    rec["src"][0] = (first, SLOTS["o"], 0)
    rec["src"][1] = (0, residual_slot + 1, 0)
    rec["dst"][0] = (first, residual_slot + 2, 0)
    return rec


def _slice_record(span: RowSpan, slots_at: int, eps: float, residual_slot: int, plan_op: int) -> Record:
    """The epilogue over one slice of a row (``executor.reference.norm.RowSpan``): the slice (output slot), the weight's
    matching slice, the row's slots for the sums of squares (scratch slot, at ``slots_at``) and the normalized
    slice; the row's slice count in barrier_count, this slice's index in barrier_id, eps's fp32 bits in channel[0]
    (norm.cuh, kNormSlice, reads them there)."""
    rec = np.zeros((), OP_DTYPE)
    rec["type"], rec["nsrc"], rec["ndst"], rec["plan_op"], rec["bytes"] = NORM_SLICE, 3, 1, plan_op, span.nbytes
    rec["barrier_id"], rec["barrier_count"] = span.index, span.slices
    rec["channel"][0] = int(np.float32(eps).view(np.int32))
    rec["src"][0] = (span.first, SLOTS["o"], 0)
    rec["src"][1] = (span.index * span.nbytes, residual_slot + 1, 0)
    rec["src"][2] = (slots_at, SLOTS["s"], 0)
    rec["dst"][0] = (span.first, residual_slot + 2, 0)
    return rec


def _prefetch_record(span: RowSpan, row_bytes: int, residual_slot: int) -> Record:
    """The weight's part that the block's epilogue reads (the row, or the slice's part of it: ``span``) prefetched
    into L1 before the block's reduction waits for its peers' data."""
    rec = np.zeros((), OP_DTYPE)
    rec["type"], rec["nsrc"], rec["barrier_id"] = NORM_PREFETCH, 1, span.nbytes if span.slices > 1 else row_bytes
    rec["src"][0] = (span.index * span.nbytes if span.slices > 1 else 0, residual_slot + 1, 0)
    return rec


def _padded(records: list, starts: list[int]) -> tuple[list, list[int]]:
    """Every block's ops followed by nops up to the longest block's count."""
    counts = np.diff(starts)
    longest = int(counts.max()) if len(counts) else 0
    out, new_starts = [], [0]
    for b, count in enumerate(counts):
        out.extend(records[starts[b] : starts[b + 1]])
        out.extend(np.zeros((), OP_DTYPE) for _ in range(longest - int(count)))
        new_starts.append(len(out))
    return out, new_starts


def _add_source(rec: Record, ref: tuple[int, int, int], where: str) -> None:
    """Append one more source to a transfer (summed after the others)."""
    n = int(rec["nsrc"])
    if n + 1 > MAX_REFS:
        raise ExecutorError(f"{where}: {n} sources and a residual in one op (the executor takes {MAX_REFS})")
    rec["src"][n] = ref
    rec["nsrc"] = n + 1


def _moves_packets(rec: Record) -> bool:
    return any(rec["src"][k]["flags"] & PACKET for k in range(rec["nsrc"])) or any(
        rec["dst"][k]["flags"] & PACKET for k in range(rec["ndst"])
    )


@dataclass(frozen=True)
class _Layout:
    plan: Plan
    gpu: Gpu
    chunk: int  # bytes of an input/output chunk
    scratch_chunk: int  # bytes of a scratch chunk (twice the data in LL plans: packets)

    def ref(self, tb: Threadblock, op: Op, ref: BufferRef, packet: bool, where: str) -> tuple[int, int, int]:
        """(offset, slot, flags) of one buffer entry."""
        if ref.remote:
            assert ref.buffer_id is not None  # parse_plan gave every remote entry its buffer_id
            k = tb.remote_buffer_id(op.channel_type or "memory", ref.buffer_id)
            if k is None:  # parse_plan refuses such a plan; a Plan built in code may still hold one
                raise ExecutorError(f"{where}: buffer_id {ref.buffer_id} names none of the block's remote buffers")
            slot, btype = PEER_SLOTS + k, self.gpu.remote_buffers[k].type
        else:
            assert ref.type is not None  # and every local entry its type
            slot, btype = SLOTS[ref.type], ref.type
        if packet and (btype != "s" or self.plan.protocol not in PACKET_PROTOCOLS):
            raise ExecutorError(
                f"{where}: op {op.name!r} moves packets, which live in the scratch buffer of an "
                f"LL plan or a Lamport plan (this entry is a {btype!r} buffer of a {self.plan.protocol} plan)"
            )
        lamport_plan = self.plan.lamport is not None  # its scratch rotates; its packets are the data (LAMPORT)
        flags = (LAMPORT if lamport_plan else PACKET) if packet else 0
        flags |= SCRATCH if btype == "s" and (self.plan.use_double_scratch_buffer or lamport_plan) else 0
        unit = self.scratch_chunk if btype == "s" else self.chunk
        return ref.index * unit, slot, flags


TRIPWIRE_BYTES = 16


def tripwire_op() -> Record:
    """A 16-byte copy from buffer slot 0 to slot 1: the one op a disarmed graph binding runs (``BindingLayout``)."""
    rec = _record(TRANSFER)
    rec["nsrc"], rec["ndst"], rec["bytes"], rec["plan_op"] = 1, 1, TRIPWIRE_BYTES, -1
    rec["src"][0] = (0, 0, 0)
    rec["dst"][0] = (0, 1, 0)
    return rec


def with_tripwire(ops: np.ndarray) -> np.ndarray:
    """``ops`` and the tripwire op after them, at index ``len(ops)``, outside every thread block's range."""
    return np.concatenate([ops, np.asarray([tripwire_op()], OP_DTYPE)])


@dataclass(frozen=True)
class BindingLayout:
    """One graph-captured execution's own device tables, in one record: a ``tb_start`` and the buffer slots.

    An execution captured in a CUDA graph keeps its context's ops, scratch and counters and gets a record of
    its own, so that the graph reads and writes the captured buffers. Records are written before the capture
    *disarmed*: block 0 runs only the tripwire op (which its context appends to its ops), copying a marker
    from slot 0 into slot 1, a host-mapped word, and every other block runs nothing. A graph replayed before
    its buffers are registered therefore touches no buffer and tells the host so. Registration *arms* the
    record: the plan's own ranges and the execution's buffers.

    >>> layout = BindingLayout(nthreadblocks=2, nslots=4)
    >>> layout.tb_bytes, layout.stride
    (16, 48)
    >>> layout.disarmed(7, marker=0x100, tripwire=0x200)[:12].view(np.int32).tolist()
    [7, 8, 8]
    """

    nthreadblocks: int
    nslots: int

    @property
    def tb_bytes(self) -> int:
        return _whole_units(4 * (self.nthreadblocks + 1), 16)

    @property
    def stride(self) -> int:
        """Bytes per record: slots start 16-byte aligned, and so does the next record."""
        return self.tb_bytes + _whole_units(8 * self.nslots, 16)

    def disarmed(self, tripwire_index: int, marker: int, tripwire: int) -> np.ndarray:
        """The record that runs only the tripwire op: from ``marker`` (device) into ``tripwire`` (host-mapped)."""
        tb_start = np.full(self.nthreadblocks + 1, tripwire_index + 1, np.int32)
        tb_start[0] = tripwire_index
        slots = np.zeros(self.nslots, np.uint64)
        slots[:2] = marker, tripwire
        return self._record(tb_start, slots)

    def armed(self, tb_start: np.ndarray, slots: tuple[int, ...]) -> np.ndarray:
        """The record that runs the plan (``tb_start`` as built) on ``slots``."""
        if len(tb_start) != self.nthreadblocks + 1 or len(slots) != self.nslots:
            raise ExecutorError(
                f"executor: a binding record holds {self.nthreadblocks} thread blocks and "
                f"{self.nslots} slots, not {len(tb_start) - 1} and {len(slots)}"
            )
        return self._record(np.asarray(tb_start, np.int32), np.asarray(slots, np.uint64))

    def _record(self, tb_start: np.ndarray, slots: np.ndarray) -> np.ndarray:
        record = np.zeros(self.stride, np.uint8)
        record[: tb_start.nbytes] = tb_start.view(np.uint8)
        record[self.tb_bytes : self.tb_bytes + slots.nbytes] = slots.view(np.uint8)
        return record


@dataclass(frozen=True)
class PeerMapping:
    """Which inputs and outputs a plan's ranks map across (one-shot plans read peers' inputs, some write outputs)."""

    deferred: tuple[tuple[int, int, str], ...]  # (slot, peer rank, buffer type i|o): peers' buffers this rank maps
    exported: tuple[str, ...]  # the types (i, o) of this rank's buffers that peers map
    collective: bool  # whether any rank maps another's input or output


def peer_mapping(plan: Plan, rank: int) -> PeerMapping:
    """The inputs and outputs ``rank`` maps from peers, and which of its own they map."""
    mine = plan.gpus[rank].remote_buffers
    return PeerMapping(
        deferred=tuple((PEER_SLOTS + k, b.rank, b.type) for k, b in enumerate(mine) if b.type in "io"),
        exported=tuple(
            sorted({b.type for g in plan.gpus for b in g.remote_buffers if b.rank == rank and b.type in "io"})
        ),
        collective=any(b.type in "io" for g in plan.gpus for b in g.remote_buffers),
    )


@dataclass(frozen=True)
class CapturedExecution:
    """An execution captured zero-copy and not yet registered: its record, buffers, and what peers must tell it."""

    plan_hash: str
    nbytes: int
    slots: tuple[int, ...]  # 0 in the deferred slots
    deferred: tuple[tuple[int, int, str], ...]  # (slot, peer rank, buffer type i|o)
    shared: tuple[tuple[str, int], ...]  # (buffer type, address) of this rank's buffers that peers map
    record: int  # index in its context's records
    context: Any = None


def share_records(executions: list[CapturedExecution], export: Callable[[int], Any]) -> list[tuple]:
    """What this rank tells its peers, in capture order: (plan, size, {buffer type: exported buffer} or why not)."""
    records = []
    for e in executions:
        try:
            shares: Any = {t: export(pointer) for t, pointer in e.shared}
        except Exception as err:  # CUDA's own error types; every rank must hear of it, not only this one
            shares = f"cannot export its buffers by CUDA IPC after the capture: {err}"
        records.append((e.plan_hash, e.nbytes, shares))
    return records


def peer_slots(
    executions: list[CapturedExecution], gathered: list[list[tuple]], rank: int, open_buffer: Callable[[Any], int]
) -> list[tuple[int, ...]]:
    """Each execution's slots with its peers' buffers opened, from every rank's ``share_records`` (capture order)."""
    counts = [len(records) for records in gathered]
    if len(set(counts)) > 1:
        raise ExecutorError(
            f"executor: ranks 0..{len(counts) - 1} captured {counts} executions whose peers map "
            "their buffers; every rank must capture the same sequence"
        )
    filled = []
    for k, e in enumerate(executions):
        for r, records in enumerate(gathered):
            plan_hash, nbytes, shares = records[k]
            if isinstance(shares, str):
                raise ExecutorError(f"executor: captured execution {k}: rank {r} {shares}")
            if (plan_hash, nbytes) != (e.plan_hash, e.nbytes):
                raise ExecutorError(
                    f"executor: captured execution {k}: rank {r} ran another plan or size "
                    f"({nbytes} B) than rank {rank} ({e.nbytes} B); every rank must capture the "
                    "same sequence"
                )
        slots = list(e.slots)
        for slot, peer, btype in e.deferred:
            slots[slot] = open_buffer(gathered[peer][k][2][btype])
        filled.append(tuple(slots))
    return filled


def _whole_units(nbytes: int, unit: int) -> int:
    return (nbytes + unit - 1) // unit * unit


def _record(kind: int) -> Record:
    rec = np.zeros((), OP_DTYPE)
    rec["type"] = kind
    return rec


def _ids(kind: int, ids: tuple[int, ...], where: str) -> Record:
    if len(ids) > MAX_CHANNELS_PER_OP:
        raise ExecutorError(f"{where}: {len(ids)} ids in one op (the executor takes {MAX_CHANNELS_PER_OP})")
    rec = _record(kind)
    rec["nchannel"] = len(ids)
    rec["channel"][: len(ids)] = ids
    return rec


def _transfer(
    layout: _Layout,
    tb: Threadblock,
    op: Op,
    srcs: list[tuple[BufferRef, bool]],
    dsts: list[tuple[BufferRef, bool]],
    where: str,
    window: tuple[int, int] | None = None,
) -> Record:
    if len(srcs) > MAX_REFS or len(dsts) > MAX_REFS:
        raise ExecutorError(
            f"{where}: {len(srcs)} sources and {len(dsts)} destinations in one op "
            f"(the executor takes {MAX_REFS} of each)"
        )
    rec = _record(TRANSFER)
    rec["nsrc"], rec["ndst"] = len(srcs), len(dsts)
    rec["bytes"] = srcs[0][0].size * layout.chunk if window is None else window[1]
    for field, refs in (("src", srcs), ("dst", dsts)):
        for k, (ref, packet) in enumerate(refs):
            offset, slot, flags = layout.ref(tb, op, ref, packet, where)
            rec[field][k] = (offset + (window[0] if window else 0), slot, flags)
    return rec


def tbg_window(op: Op, chunk_bytes: int) -> tuple[int, int] | None:
    """(first byte, bytes) of each entry that a thread-block-group member moves: slice tb_id of tbg_size equal
    slices (the sizes a tbg plan accepts split into whole 4-byte words; MSCCL++ splits in buffer_alignment units,
    the same split where chunk bytes are a multiple of tbg_size × buffer_alignment)."""
    if op.tbg is None:
        return None
    tb_id, size = op.tbg
    nbytes = op.src_buff[0].size * chunk_bytes
    return tb_id * nbytes // size, nbytes // size


def _lower(op: Op, tb: Threadblock, layout: _Layout, where: str, window: tuple[int, int] | None = None) -> list[Record]:
    """The device ops of one plan op, in order, as its row in the op table says (``window``: one pipeline
    iteration's bytes of each entry)."""
    spec = op.spec
    if spec.container:  # MSCCL++ handlePipeline: ceil(num_chunks × chunk bytes / unit_size) iterations
        assert op.num_chunks is not None and op.unit_size is not None  # parse_plan required both of a pipeline
        total = op.num_chunks * layout.chunk
        recs = []
        for start in range(0, total, op.unit_size):
            for inner in op.ops:
                recs += _lower(inner, tb, layout, where, (start, min(op.unit_size, total - start)))
        return recs
    window = window or tbg_window(op, layout.chunk)
    kind = DEVICE_CODES[spec.device]
    if spec.device == "barrier":
        assert op.barrier_id is not None  # parse_plan required it of a barrier
        if op.barrier_id >= MAX_BARRIERS:
            raise ExecutorError(f"{where}.barrier_id: {op.barrier_id} (the executor holds {MAX_BARRIERS} barriers)")
        rec = _record(BARRIER)
        rec["barrier_id"], rec["barrier_count"] = op.barrier_id, op.num_threadblocks
        return [rec]
    if spec.device in ("signal", "wait"):
        return [_ids(kind, op.channel_ids, where)]
    if spec.device in ("sem_acquire", "sem_release"):
        return [_ids(kind, op.semaphore_ids, where)]
    if spec.device != "transfer":
        return [_record(kind)]
    srcs = [(s, spec.reads_packet(k)) for k, s in enumerate(op.src_buff)]
    dsts = [(d, spec.writes_packet(d.remote, k)) for k, d in enumerate(op.dst_buff)]
    if spec.broadcast and len(srcs) == 1:
        srcs = srcs * len(dsts)
    plain = not any(packet for _, packet in srcs + dsts)  # packets: one transfer per pair
    if spec.pairwise and len(srcs) > 1 and not plain and len(set(srcs)) == 1:
        # packets of one source to every destination (a one-shot's put to each peer): one transfer that reads it
        # once and stores it to each, so that the block neither reloads it nor waits at a barrier between peers
        recs = [_transfer(layout, tb, op, srcs[:1], dsts, where, window)]
    elif spec.pairwise and len(srcs) > 1 and plain and len({s.size for s, _ in srcs}) == 1:
        recs = [_transfer(layout, tb, op, srcs, dsts, where, window)]
        recs[0]["type"] = PAIRS
    elif spec.pairwise:
        recs = [_transfer(layout, tb, op, [s], [d], where, window) for s, d in zip(srcs, dsts, strict=True)]
    else:
        recs = [_transfer(layout, tb, op, srcs, dsts, where, window)]
    if spec.signals:
        recs.append(_ids(SIGNAL, op.channel_ids, where))
    return recs
