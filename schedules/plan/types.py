"""The execution Plan: MSCCL++'s execution-plan JSON (snake_case schema) plus a ``"weft"`` metadata object.

A plan says, for every GPU, which thread blocks run which ops over which buffers and channels. It is what
the CPU reference executor proves and what the GPU executor runs. MSCCL++'s executor reads the same file.

Buffers and chunks
------------------
Each GPU has three buffers: ``i`` (input, ``input_chunks`` chunks), ``o`` (output, ``output_chunks``) and ``s``
(scratch, ``scratch_chunks``). Every chunk of every buffer holds the same number of bytes, fixed at run time
from the message size ``nbytes`` (nccl-tests terms: the larger of a rank's input and output buffer)::

    chunk_bytes = nbytes / plan.size_chunks        # size_chunks = max(input_chunks, output_chunks) over gpus

``Plan.accepts(nbytes)`` says whether a size runs directly: ``min_message_size <= nbytes <= max_message_size``
and ``chunk_bytes`` is a whole multiple of ``CHUNK_GRANULE`` (4 bytes: one 32-bit word, so fp16/bf16 pairs and
LL packets never split), so ``nbytes`` is a multiple of the plan's ``granule``. A chunk need not be a multiple
of 16 bytes ("ragged" sizes): the GPU executor handles the tail. ``Plan.runs(nbytes)`` says whether a size runs
at all: any size in the range that is a whole number of the collective's parts; sizes that are not multiples
of the granule run padded, part by part, to the next one (``Plan.padding``, ``schedules.padding``).

In an ``LL`` plan every scratch chunk takes ``2 × chunk_bytes`` bytes, because each 4-byte word travels with a
4-byte flag (LL8 packets); ``i`` and ``o`` always hold plain data. A ``Lamport`` plan uses the same packet ops, but
its packets are the data alone (1×), in scratch copies that rotate by launch and are reset to a sentinel: its
top-level ``"lamport": {"buffers": 3, "reset_ahead": 2}`` says how (``schedules.lamport``); MSCCL++ runs no such
plan.

A buffer entry ``{"type": "i"|"o"|"s", "index": k, "size": n}`` is the local chunk range k..k+n-1. A remote
entry ``{"buffer_id": b, "index": k, "size": n}`` names the b-th id in the thread block's ``remote_buffer_refs``
entries whose ``access_channel_type`` is the op's ``channel_type`` (their ids in order, as MSCCL++ concatenates
them); that id indexes the GPU's ``remote_buffers`` (``rank`` and ``type``). A memory-channel op reaches a peer's
buffer through it alone (MSCCL++'s kernel writes the mapped pointer): its ``channel_ids`` may be left out.
With ``inplace`` true the smaller of ``i``/``o`` lives inside the larger one at the rank's slice: allgather/gather
keep ``i`` at ``o[rank·input_chunks]``, reducescatter/scatter keep ``o`` at ``i[rank·output_chunks]``, the other
collectives use one buffer for both.

Channels and semaphores
-----------------------
``memory`` channels (CUDA IPC, inside one host) and ``port`` channels (between hosts, through a proxy and a
network engine) are supported; ``switch``/NVLS channels are refused because NVLink multicast is forbidden on the
shared machines. Each channel type numbers its own channels: a GPU's memory (or port) channels are numbered 0..
in the order of its ``channels`` entries of that type and their ``connected_to`` lists; channel k connects to
rank ``connected_to[k]``. The m-th channel of a type of rank a to rank b pairs with the m-th channel of that type
of rank b to rank a; an end the peer does not list is allowed (MSCCL++ makes it) as long as nothing signals or
waits on it. An op's ``channel_ids`` index its thread block's ``channels`` list of that type, as MSCCL++'s kernel
does (weft's plans written before 2026-11-26 name GPU channel ids instead: ``"weft": {"channel_ids": "gpu"}``).
A port channel carries ``put``, ``pws``, ``pwsf``, ``rppkt``, ``signal``, ``wait`` and ``flush`` only, with
MSCCL++'s ordering: a put is asynchronous; a ``signal`` on the channel orders every put before it on that
channel (the peer that waits for it sees their data); ``flush`` waits until the channel's puts have completed,
so their sources may be overwritten only after it.
Each channel end holds an inbound counter: ``signal`` on a's end adds one to b's end; ``wait`` on b's end
blocks until its counter exceeds the number of waits already done there, then consumes one. The n-th wait
therefore happens after the n-th signal and after everything the signalling thread block did before it.
``semaphores`` (``[{"init_value": v}]``) are counting semaphores local to one GPU, for ordering thread blocks
of the same GPU: ``sem_release`` adds one, ``sem_acquire`` blocks until the value is positive and takes one.
``barrier`` (``barrier_id``, ``num_threadblocks``) blocks until that many thread blocks of the GPU reached
their barrier with that id.

Ops
---
What every op means (which entries are remote, which pair up or are summed, which carry LL packets, how many
channel ids it takes) is its row in the op table, ``schedules/ops.py``; the parser checks each op against it.
A packet range lives in a scratch buffer and carries the flag of the current launch, so a reader of packets
waits for them itself and needs no signal. Reductions are sums in the element type; fp16 and bf16 round after
every op. ``tbg_info`` (``tb_id``, ``tbg_size``) on a data op makes it move slice ``tb_id`` of ``tbg_size`` equal
slices of each entry (a thread-block group splits one op); a ``pipeline`` op (``iter_context``: ``unit_size``
bytes, ``num_chunks``) runs its ``ops`` once per ``unit_size`` bytes of their entries, in order.
``reuse_resources`` (MSCCL++'s fixed 64 MiB scratch) limits the sizes to those whose scratch chunks fit in it.
Collective ``test`` is MSCCL++'s unit-test plans': a run proves no race, deadlock or range error, and no result.

A launch runs each plan once. Buffers, channel counters and semaphores carry over between launches, and a
rank's launch k+1 follows only its own launch k (stream order), so a plan must itself keep a write into a peer
after that peer's previous launch finished with the slot. LL plans with ``use_double_scratch_buffer``
alternate scratch halves (every scratch entry, packet or not) and use a fresh flag per launch: a writer may
run one launch ahead of its reader, not two. weft's codegen proves this per channel and, where it does not
hold, opens the launch with an entry handshake (the reader signals on the channel first thing; the writer
waits for it before its first write); ``executor.reference.prove.check_plan`` checks launches back to back (two,
or three with a double scratch buffer).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from schedules.collectives import Collective, Facts, facts_of, slice_chunks
from schedules.lamport import PROTOCOL as LAMPORT
from schedules.lamport import LamportBuffers
from schedules.ops import OPS, OpSpec
from schedules.padding import CHUNK_GRANULE, Padding, padding_of, refusal
from weftcore.errors import WeftError

MAX_MESSAGE_SIZE = (1 << 64) - 1
MAX_MIN_MESSAGE_SIZE = 1 << 60  # a plan that takes no message below 1 EiB takes none at all
# What compile makes and both executors run: whole warps up to CUDA's 1024 threads per block (the GPU executor
# launches num_threads_per_block threads), and a power-of-two buffer alignment no larger than the 256 bytes every
# CUDA allocation already has (compile writes 16).
WARP = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_BUFFER_ALIGNMENT = 256
PROTOCOLS = ("Simple", "LL", LAMPORT)
PACKET_PROTOCOLS = ("LL", LAMPORT)  # plans whose packet ops move packets (LL8, or Lamport data words)
BUFFER_TYPES = ("i", "o", "s")
CHANNEL_TYPES = ("memory", "port")
REFUSED_CHANNEL_TYPES = {
    "switch": "switch (NVLS) channels need NVLink multicast, which weft never uses",
}
CHANNEL_OPS = frozenset(name for name, spec in OPS.items() if spec.channels)
PACKET_OPS = frozenset(name for name, spec in OPS.items() if spec.packet)
BUFFER_OPS = frozenset(name for name, spec in OPS.items() if spec.buffers)
TEST_COLLECTIVE = "test"  # MSCCL++'s unit-test programs: no postcondition, so a run proves no race or deadlock only
REUSED_SCRATCH_BYTES = 1 << 26  # reuse_resources: MSCCL++'s fixed scratch (PREDFINED_SCRATCH_SIZE)


class PlanError(WeftError):
    """A plan file is malformed or uses something weft cannot run."""


@dataclass(frozen=True)
class BufferRef:
    """A chunk range: local when ``type`` is set, remote when ``buffer_id`` is set."""

    index: int
    size: int
    type: str | None = None
    buffer_id: int | None = None

    @property
    def remote(self) -> bool:
        return self.buffer_id is not None

    def to_json(self) -> dict[str, Any]:
        if self.remote:
            return {"buffer_id": self.buffer_id, "index": self.index, "size": self.size}
        return {"type": self.type, "index": self.index, "size": self.size}


@dataclass(frozen=True)
class Op:
    name: str
    channel_type: str | None = None
    channel_ids: tuple[int, ...] = ()
    src_buff: tuple[BufferRef, ...] = ()
    dst_buff: tuple[BufferRef, ...] = ()
    semaphore_ids: tuple[int, ...] = ()
    barrier_id: int | None = None
    num_threadblocks: int | None = None
    tbg: tuple[int, int] | None = None  # (tb_id, tbg_size): this block moves slice tb_id of tbg_size of each entry
    unit_size: int | None = None  # pipeline: bytes per iteration
    num_chunks: int | None = None  # pipeline: chunks its ops span
    ops: tuple[Op, ...] = ()  # pipeline: the ops of one iteration

    @property
    def spec(self) -> OpSpec:
        """The op's row in the op table (``schedules.ops``)."""
        return OPS[self.name]

    def to_json(self, local: dict[str, dict[int, int]] | None = None) -> dict[str, Any]:
        """The op as MSCCL++ writes it; ``local`` maps each channel type's GPU channel ids to the thread block's
        channel indices."""
        doc: dict[str, Any] = {"name": self.name}
        if self.spec.container:
            doc["iter_context"] = {"unit_size": self.unit_size, "num_chunks": self.num_chunks}
            doc["ops"] = [op.to_json(local) for op in self.ops]
            return doc
        if self.src_buff or self.name in BUFFER_OPS:
            doc["src_buff"] = [b.to_json() for b in self.src_buff]
        if self.dst_buff or self.name in BUFFER_OPS:
            doc["dst_buff"] = [b.to_json() for b in self.dst_buff]
        if self.channel_type is not None:
            doc["channel_type"] = self.channel_type
            ids = self.channel_ids
            doc["channel_ids"] = [local[self.channel_type][c] for c in ids] if local is not None else list(ids)
        if self.semaphore_ids:
            doc["semaphore_ids"] = list(self.semaphore_ids)
        if self.barrier_id is not None:
            doc["barrier_id"] = self.barrier_id
            doc["num_threadblocks"] = self.num_threadblocks
        if self.tbg is not None:
            doc["tbg_info"] = {"tb_id": self.tbg[0], "tbg_size": self.tbg[1]}
        return doc

    def flat(self) -> tuple[Op, ...]:
        """The op, or a pipeline's ops (one iteration's worth)."""
        return self.ops if self.spec.container else (self,)


@dataclass(frozen=True)
class Channel:
    channel_type: str
    connected_to: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"channel_type": self.channel_type, "connected_to": list(self.connected_to)}


@dataclass(frozen=True)
class RemoteBuffer:
    rank: int
    type: str
    access_channel_types: tuple[str, ...] = ("memory",)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "type": self.type, "access_channel_types": list(self.access_channel_types)}


@dataclass(frozen=True)
class ChannelRef:
    """The GPU channels (by id) one thread block uses."""

    channel_type: str
    channel_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"channel_type": self.channel_type, "channel_ids": list(self.channel_ids)}


@dataclass(frozen=True)
class RemoteBufferRef:
    """The GPU remote buffers (by id) one thread block reaches through one channel type."""

    access_channel_type: str
    remote_buffer_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"access_channel_type": self.access_channel_type, "remote_buffer_ids": list(self.remote_buffer_ids)}


@dataclass(frozen=True)
class Threadblock:
    id: int
    ops: tuple[Op, ...]
    channels: tuple[ChannelRef, ...] = ()
    remote_buffer_refs: tuple[RemoteBufferRef, ...] = ()

    def remote_buffer_id(self, channel_type: str, buffer_id: int) -> int | None:
        """The GPU's remote-buffer id that an op's ``buffer_id`` names, or None when it names nothing: the
        buffer_id-th of the block's remote_buffer_refs ids of that channel type, every such entry in order
        (MSCCL++'s threadblockMemoryChannelBuffers)."""
        ids = [
            b
            for ref in self.remote_buffer_refs
            if ref.access_channel_type == channel_type
            for b in ref.remote_buffer_ids
        ]
        return ids[buffer_id] if 0 <= buffer_id < len(ids) else None

    def channel_list(self, channel_type: str) -> tuple[int, ...]:
        """The GPU channel ids this block lists for a type, in order: an op's channel_ids index this list."""
        return tuple(c for ref in self.channels if ref.channel_type == channel_type for c in ref.channel_ids)

    def to_json(self, channel_ids: str = "threadblock") -> dict[str, Any]:
        local = None
        if channel_ids == "threadblock":
            local = {}
            for channel_type in CHANNEL_TYPES:
                listed = self.channel_list(channel_type)
                local[channel_type] = {c: listed.index(c) for c in set(listed)}
        return {
            "id": self.id,
            "ops": [op.to_json(local) for op in self.ops],
            "channels": [c.to_json() for c in self.channels],
            "remote_buffer_refs": [r.to_json() for r in self.remote_buffer_refs],
        }


@dataclass(frozen=True)
class Gpu:
    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    threadblocks: tuple[Threadblock, ...]
    channels: tuple[Channel, ...] = ()
    remote_buffers: tuple[RemoteBuffer, ...] = ()
    semaphores: tuple[int, ...] = ()

    @property
    def memory_peers(self) -> tuple[int, ...]:
        """The peer of each memory channel id."""
        return self.peers("memory")

    @property
    def port_peers(self) -> tuple[int, ...]:
        """The peer of each port channel id."""
        return self.peers("port")

    def peers(self, channel_type: str) -> tuple[int, ...]:
        """The peer of each channel id of one channel type."""
        return tuple(p for c in self.channels if c.channel_type == channel_type for p in c.connected_to)

    def buffer_chunks(self, type: str) -> int:
        return {"i": self.input_chunks, "o": self.output_chunks, "s": self.scratch_chunks}[type]

    def to_json(self, channel_ids: str = "threadblock") -> dict[str, Any]:
        return {
            "id": self.id,
            "input_chunks": self.input_chunks,
            "output_chunks": self.output_chunks,
            "scratch_chunks": self.scratch_chunks,
            "channels": [c.to_json() for c in self.channels],
            "remote_buffers": [b.to_json() for b in self.remote_buffers],
            "semaphores": [{"init_value": v} for v in self.semaphores],
            "threadblocks": [tb.to_json(channel_ids) for tb in self.threadblocks],
        }


@dataclass(frozen=True)
class PlanMeta:
    """weft's own record: where the plan came from, what it costs, how it was checked."""

    topology: str = ""
    schedule_hash: str = ""
    solver: str = ""
    chunks: int = 1
    root: int = 0
    instances: int = 1
    predicted_us: dict[str, float] = field(default_factory=dict)
    prediction: str = ""  # what made predicted_us: the fabric's calibration, or the α-β model of its links
    verification: dict[str, Any] | None = None
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    # How ops name channels: "threadblock" (MSCCL++: an index into the block's channel list) or "gpu" (weft's plans
    # written before 2026-11-26: the GPU's channel id). Files without the key but with a weft object are "gpu".
    channel_ids: str = "threadblock"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "topology": self.topology,
            "schedule_hash": self.schedule_hash,
            "solver": self.solver,
            "chunks": self.chunks,
            "root": self.root,
            "instances": self.instances,
            "dtypes": list(self.dtypes),
            "channel_ids": self.channel_ids,
        }
        if self.predicted_us:
            doc["predicted_us"] = self.predicted_us
        if self.prediction:
            doc["prediction"] = self.prediction
        if self.verification is not None:
            doc["verification"] = self.verification
        return doc


@dataclass(frozen=True, repr=False)
class Plan:
    name: str
    collective: str
    protocol: str
    inplace: bool
    gpus: tuple[Gpu, ...]
    num_threads_per_block: int = 1024
    use_double_scratch_buffer: bool = False
    buffer_alignment: int = 16
    min_message_size: int = 0
    max_message_size: int = MAX_MESSAGE_SIZE
    weft: PlanMeta = field(default_factory=PlanMeta)
    reuse_resources: bool = False  # MSCCL++: a fixed 64 MiB scratch; weft accepts the sizes where chunks fit in it
    lamport: LamportBuffers | None = None  # a Lamport plan's scratch rotation (None for the others)

    @property
    def nranks(self) -> int:
        return len(self.gpus)

    def __repr__(self) -> str:
        """One line: what the plan is, never its ops (a plan's full repr runs to megabytes)."""
        blocks = sum(len(g.threadblocks) for g in self.gpus)
        return (
            f"Plan({self.name!r}, {self.collective}, {self.nranks} ranks, {self.protocol}, "
            f"{blocks} thread blocks, {self.weft.topology or 'no topology'})"
        )

    @property
    def size_chunks(self) -> int:
        """Chunks spanned by the message size (the larger of input and output buffer)."""
        return max(1, max(max(g.input_chunks, g.output_chunks) for g in self.gpus))

    def chunk_bytes(self, nbytes: int) -> int:
        return nbytes // self.size_chunks

    @property
    def granule(self) -> int:
        """The sizes this plan runs directly are multiples of this many bytes (every chunk whole 4-byte words, and
        whole slices where thread-block groups or pipelines split a chunk)."""
        return self.size_chunks * CHUNK_GRANULE * self.slices

    @property
    def message_parts(self) -> int:
        """The equal parts of a message whose places matter (``Collective.message_parts``), padded one by one."""
        return self.collective_spec().message_parts

    def accepts(self, nbytes: int) -> bool:
        """Whether this plan runs a message of ``nbytes`` directly: a multiple of its granule, in its size range
        (the range's top rounded up to the granule, where the sizes up to the top run padded)."""
        unit = self.granule
        if (
            self.reuse_resources
            and self.max_scratch_chunks
            and nbytes // self.size_chunks * (2 if self.protocol == "LL" else 1) > self.reused_scratch_chunk_bytes
        ):
            return False
        top = -(-self.max_message_size // unit) * unit
        return self.min_message_size <= nbytes <= top and nbytes > 0 and nbytes % unit == 0

    def runs(self, nbytes: int) -> bool:
        """Whether this plan runs a message of ``nbytes``, directly or padded (``schedules.padding``): any size in
        its range that is a whole number of the collective's parts (and, padded, fits its scratch)."""
        return self._padding(nbytes)[0] is not None

    def padding(self, nbytes: int) -> Padding:
        """How a message of ``nbytes`` runs (``Padding.direct`` where it needs none); PlanError where it cannot."""
        found, why = self._padding(nbytes)
        if found is None:
            raise PlanError(f"plan {self.name}: size {nbytes} B {why}")
        return found

    def _padding(self, nbytes: int) -> tuple[Padding | None, str]:
        """(``padding``, '') or (None, why not, as the end of a sentence)."""
        if not self.min_message_size <= nbytes <= self.max_message_size:
            return None, f"is outside its range {self.min_message_size}..{self.max_message_size} B"
        found = padding_of(nbytes, self.size_chunks, self.message_parts, self.slices)
        if found is None:
            return None, refusal(nbytes, self.size_chunks, self.message_parts, self.slices)
        if not self.accepts(found.padded_bytes):
            return None, f"runs padded to {found.padded_bytes} B, more than its reused scratch holds"
        return found, ""

    @property
    def scratch_copies(self) -> int:
        """Copies of the scratch buffer that launches rotate through: a Lamport plan's buffers, two halves with
        ``use_double_scratch_buffer``, else one."""
        if self.lamport is not None:
            return self.lamport.buffers
        return 2 if self.use_double_scratch_buffer else 1

    @property
    def max_scratch_chunks(self) -> int:
        return max(g.scratch_chunks for g in self.gpus)

    @property
    def reused_scratch_chunk_bytes(self) -> int:
        """reuse_resources: the bytes a scratch chunk gets in MSCCL++'s fixed scratch (calMaxScratchChunkSize)."""
        half = REUSED_SCRATCH_BYTES // self.scratch_copies
        size = -(-half // max(self.max_scratch_chunks, 1))
        return size // self.buffer_alignment * self.buffer_alignment

    @cached_property
    def slices(self) -> int:
        """Equal slices a chunk splits into so that every thread-block-group slice and pipeline iteration the CPU
        reference models is whole slices: the lcm of the tbg sizes, twice over when a pipeline runs."""
        ops = [o for g in self.gpus for tb in g.threadblocks for op in tb.ops for o in (op,) + op.ops]
        lcm = math.lcm(1, *(o.tbg[1] for o in ops if o.tbg))
        return lcm * (2 if any(o.spec.container for o in ops) else 1)

    @property
    def checkable(self) -> bool:
        """Whether the plan's collective defines a result to compare (MSCCL++'s unit-test plans define none)."""
        return self.collective != TEST_COLLECTIVE

    @property
    def facts(self) -> Facts | None:
        """The facts of the plan's collective (``Collective.facts``), so that no stage reads them off its name;
        None for MSCCL++'s unit-test plans, which define no result."""
        return facts_of(self.collective) if self.checkable else None

    def inplace_offsets(self, rank: int, input_size: int, output_size: int) -> tuple[int, int]:
        """Where an in-place plan's input and output start in its one buffer (in the units of the sizes given): the
        collective's rule (``Collective.inplace_offsets``); MSCCL++'s unit-test plans define none: both at 0."""
        if not self.checkable:
            return 0, 0
        return self.collective_spec().inplace_offsets(rank, input_size, output_size)

    def collective_spec(self) -> Collective:
        """The Collective the plan computes, at the plan's chunk granularity (instances are finer chunks)."""
        g = self.gpus[0]
        n = self.nranks
        per_slice = slice_chunks(self.collective, n, g.input_chunks, g.output_chunks)
        return Collective(self.collective, n, max(per_slice, 1), self.weft.root)

    def content(self) -> dict[str, Any]:
        """The MSCCL++ plan itself: what the content hash covers (the weft record is not part of it)."""
        return {
            "name": self.name,
            "collective": self.collective,
            "protocol": self.protocol,
            "inplace": self.inplace,
            "num_threads_per_block": self.num_threads_per_block,
            "use_double_scratch_buffer": self.use_double_scratch_buffer,
            "buffer_alignment": self.buffer_alignment,
            "min_message_size": self.min_message_size,
            "max_message_size": self.max_message_size,
            "gpus": [g.to_json(self.weft.channel_ids) for g in self.gpus],
            **({"reuse_resources": True} if self.reuse_resources else {}),
            **({"lamport": self.lamport.to_json()} if self.lamport is not None else {}),
        }

    @cached_property  # a frozen plan hashes the same every time; checks ask once per size and dtype
    def content_hash(self) -> str:
        data = json.dumps(self.content(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(data).hexdigest()[:16]

    def with_meta(self, **changes: Any) -> Plan:
        return replace(self, weft=replace(self.weft, **changes))

    def to_json(self) -> dict[str, Any]:
        return {**self.content(), "weft": {**self.weft.to_json(), "hash": self.content_hash}}


def current_format(plan: Plan) -> Plan:
    """A plan weft wrote before 2026-11-26 in the format MSCCL++ reads today: ops name the block's channels, and a
    ``pws`` on memory channels (which MSCCL++'s kernel runs without its signal) becomes ``put`` then ``signal``."""

    def split(op: Op) -> tuple[Op, ...]:
        if op.name in ("pws", "pwsf") and op.channel_type == "memory":
            return (replace(op, name="put"), Op("signal", op.channel_type, op.channel_ids))
        return (op,)

    gpus = tuple(
        replace(
            g,
            threadblocks=tuple(replace(tb, ops=tuple(o for op in tb.ops for o in split(op))) for tb in g.threadblocks),
        )
        for g in plan.gpus
    )
    return replace(plan, gpus=gpus).with_meta(channel_ids="threadblock", verification=None)


def remote_target(gpu: Gpu, tb: Threadblock, op: Op, ref: BufferRef) -> tuple[int, str]:
    """(rank, buffer type) that a remote entry of ``op`` names."""
    assert ref.buffer_id is not None, "remote_target takes a remote entry"
    index = tb.remote_buffer_id(op.channel_type or "memory", ref.buffer_id)
    assert index is not None, "parse_plan resolved every remote entry's buffer_id"
    buffer = gpu.remote_buffers[index]
    return buffer.rank, buffer.type


def entry_target(gpu: Gpu, tb: Threadblock, op: Op, ref: BufferRef, rank: int) -> tuple[int, str]:
    """(rank, buffer type) an entry of ``op`` on ``rank`` names, remote or local."""
    if ref.remote:
        return remote_target(gpu, tb, op, ref)
    assert ref.type is not None, "a local entry names its buffer type"
    return rank, ref.type


def op_channels(op: Op) -> list[tuple[BufferRef, int]]:
    """Each remote entry of ``op`` with the channel id it goes through (remote srcs first, then dsts)."""
    remote = [b for b in op.src_buff if b.remote] + [b for b in op.dst_buff if b.remote]
    # not strict: an op whose entries take no channel (a local copy, a signal's bare channel list) pairs none
    return list(zip(remote, op.channel_ids, strict=False))


def channel_pairs(plan: Plan, channel_type: str = "memory") -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, channel id) -> the paired (peer, channel id) among channels of one type: the m-th channel a->b pairs
    with the m-th b->a.

    The one statement of the pairing rule: the parser checks it, both executors signal through it."""
    ends: dict[tuple[int, int], list[int]] = {}
    for r, g in enumerate(plan.gpus):
        for cid, peer in enumerate(g.peers(channel_type)):
            ends.setdefault((r, peer), []).append(cid)
    pairs = {}
    for (r, peer), cids in ends.items():
        back = ends.get((peer, r), [])
        for m, cid in enumerate(cids[: len(back)]):
            pairs[(r, cid)] = (peer, back[m])
    return pairs


def unpaired_error(plan: Plan, rank: int, cid: int, channel_type: str = "memory") -> str:
    """Why a signal or wait on (rank, channel cid) cannot run: the peer lists no matching channel end."""
    peer = plan.gpus[rank].peers(channel_type)[cid]
    back = sum(p == rank for p in plan.gpus[peer].peers(channel_type))
    return (
        f"gpus[{rank}].channels: {channel_type} channel {cid} to rank {peer} has no matching channel on rank "
        f"{peer} (it lists {back} to rank {rank}); MSCCL++ pairs such an end with a semaphore nobody listed, "
        "weft signals and waits only on listed pairs"
    )
