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
4-byte flag (LL8 packets); ``i`` and ``o`` always hold plain data.

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
waits for it before its first write); ``executor.reference.check_plan`` checks launches back to back (two,
or three with a double scratch buffer).

>>> plan = parse_plan({"name": "x", "collective": "allgather", "protocol": "Simple", "inplace": False,
...     "gpus": [{"id": 0, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0, "threadblocks": [
...     {"id": 0, "ops": [{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
...     "dst_buff": [{"type": "o", "index": 0, "size": 1}]}]}]}]}, "x.json")
>>> plan.size_chunks, plan.accepts(64), plan.accepts(6), plan.runs(6), plan.padding(6).padded_bytes
(1, True, False, True, 8)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from schedules import mscclpp_format
from schedules.collectives import (
    MAX_CHUNKS,
    NAMES,
    PLAN_ONLY,
    Collective,
    CollectiveError,
    Facts,
    facts_of,
    slice_chunks,
)
from schedules.mscclpp_format import kernel_shape_errors
from schedules.ops import OPS, PORT_OPS, SWITCH_OPS, OpSpec
from schedules.padding import CHUNK_GRANULE, Padding, padding_of, refusal
from topologies.errors import WeftError
from topologies.jsonfile import Fields, read_json, short_repr, write_text

MAX_MESSAGE_SIZE = (1 << 64) - 1
MAX_MIN_MESSAGE_SIZE = 1 << 60  # a plan that takes no message below 1 EiB takes none at all
# What compile makes and both executors run: whole warps up to CUDA's 1024 threads per block (the GPU executor
# launches num_threads_per_block threads), and a power-of-two buffer alignment no larger than the 256 bytes every
# CUDA allocation already has (compile writes 16).
WARP = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_BUFFER_ALIGNMENT = 256
PROTOCOLS = ("Simple", "LL")
BUFFER_TYPES = ("i", "o", "s")
CHANNEL_TYPES = ("memory", "port")
REFUSED_CHANNEL_TYPES = {
    "switch": "switch (NVLS) channels need NVLink multicast, which weft never uses",
}
CHANNEL_OPS = frozenset(name for name, spec in OPS.items() if spec.channels)
PACKET_OPS = frozenset(name for name, spec in OPS.items() if spec.packet)
BUFFER_OPS = frozenset(name for name, spec in OPS.items() if spec.buffers)
_PLAIN_OP_FIELDS = mscclpp_format.OP_KEYS - {"iter_context", "ops"}  # an op other than a pipeline
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
    def max_scratch_chunks(self) -> int:
        return max(g.scratch_chunks for g in self.gpus)

    @property
    def reused_scratch_chunk_bytes(self) -> int:
        """reuse_resources: the bytes a scratch chunk gets in MSCCL++'s fixed scratch (calMaxScratchChunkSize)."""
        half = REUSED_SCRATCH_BYTES // (2 if self.use_double_scratch_buffer else 1)
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
        }

    @cached_property  # a frozen plan hashes the same every time; checks ask once per size and dtype
    def content_hash(self) -> str:
        data = json.dumps(self.content(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(data).hexdigest()[:16]

    def with_meta(self, **changes: Any) -> Plan:
        return replace(self, weft=replace(self.weft, **changes))

    def to_json(self) -> dict[str, Any]:
        return {**self.content(), "weft": {**self.weft.to_json(), "hash": self.content_hash}}


def dumps_plan(plan: Plan) -> str:
    """Deterministic pretty JSON: objects of plain values (an op, a channel) on one line, so plans diff well."""
    return _pretty(plan.to_json(), "") + "\n"


def _pretty(value: object, indent: str) -> str:
    line = json.dumps(value, separators=(", ", ": "))
    is_op = isinstance(value, dict) and "name" in value and "gpus" not in value and "ops" not in value
    if not isinstance(value, (dict, list)) or is_op or (len(line) <= 100 and "ops" not in line):
        return line
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_pretty(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    items = [inner + _pretty(v, inner) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + indent + "]"


def save_plan_file(plan: Plan, path: str | Path) -> None:
    write_text(path, dumps_plan(plan), "plan", PlanError)


def load_plan(path: str | Path) -> Plan:
    return parse_plan(read_json(path, "plan", PlanError), str(path))


_KNOWN = {  # the fields weft reads, where unknown ones would otherwise go unread: MSCCL++'s (schedules.mscclpp_format)
    "(top level)": mscclpp_format.TOP_KEYS | {"weft"},
    "gpu": mscclpp_format.GPU_KEYS,
    "threadblock": mscclpp_format.THREADBLOCK_KEYS,
    "buffer entry": (mscclpp_format.BUFF_KEYS - {"switch_channel_id"}) | {"offset"},  # switch entries are refused
}


def _known(rd: _Reader, doc: dict[str, Any], kind: str, where: str) -> None:
    """Refuse, in one line, a field weft does not read (it might change what the plan does)."""
    extra = sorted(set(doc) - _KNOWN[kind])
    if extra:
        field = f"{where}.{extra[0]}" if where else extra[0]
        if extra[0] == "switch_channel_id":
            raise rd.fail(field, f"a switch channel entry: {REFUSED_CHANNEL_TYPES['switch']}")
        raise rd.fail(field, f"field not supported by weft on a {kind} (weft reads {', '.join(sorted(_KNOWN[kind]))})")


class _Reader(Fields):
    """Field checks that name the file and the JSON path in every error."""

    def __init__(self, source: str):
        super().__init__("plan", source, PlanError)
        self.channel_ids = "threadblock"  # how this file's ops name channels (PlanMeta.channel_ids)
        self.collective = ""
        self.foreign = False  # no "weft" object: written by another tool (MSCCL++'s DSL)

    def int(self, value: object, where: str, low: int = 0, high: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"from {low} to {high}"
            raise self.fail(where, f"must be an integer {bound}, got {short_repr(value)}")
        return value

    def bool(self, value: object, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"must be true or false, got {value!r}")
        return value

    def channel_type(self, value: object, where: str) -> str:
        if isinstance(value, str) and value in REFUSED_CHANNEL_TYPES:
            raise self.fail(where, f"unsupported channel type {value!r}: {REFUSED_CHANNEL_TYPES[value]}")
        if value not in CHANNEL_TYPES:
            raise self.fail(where, f"unknown channel type {value!r} (weft runs 'memory' and 'port' channels)")
        return value


def parse_plan(data: object, source: str) -> Plan:
    """Build a Plan from decoded JSON: every field checked, every reference resolved; ``check_plan`` proves it."""
    rd = _Reader(source)
    doc = rd.obj(data, "(top level)")
    for key in ("name", "collective", "protocol", "gpus"):
        if key not in doc:
            raise rd.fail(key, "missing")
    if doc["protocol"] not in PROTOCOLS:
        raise rd.fail("protocol", f"must be 'Simple' or 'LL', got {doc['protocol']!r}")
    reuse = rd.bool(doc.get("reuse_resources", False), "reuse_resources")
    _known(rd, doc, "(top level)", "")
    meta = _parse_meta(rd, doc.get("weft"))
    rd.channel_ids, rd.collective, rd.foreign = meta.channel_ids, doc["collective"], doc.get("weft") is None
    raw_gpus = rd.list(doc["gpus"], "gpus")
    if not raw_gpus:
        raise rd.fail("gpus", "must list at least one GPU")
    gpus = tuple(_parse_gpu(rd, g, f"gpus[{i}]", len(raw_gpus)) for i, g in enumerate(raw_gpus))
    if doc["collective"] not in NAMES + PLAN_ONLY + (TEST_COLLECTIVE,):  # after the gpus: port/switch say so first
        raise rd.fail(
            "collective",
            f"unknown collective {doc['collective']!r} (choose from "
            f"{', '.join(NAMES + PLAN_ONLY)}, "
            f"or {TEST_COLLECTIVE!r} for MSCCL++'s unit-test plans)",
        )
    for i, g in enumerate(gpus):
        if g.id != i:
            raise rd.fail(f"gpus[{i}].id", f"must be {i} (gpus are listed in rank order), got {g.id}")
    lo = rd.int(doc.get("min_message_size", 0), "min_message_size", 0, MAX_MIN_MESSAGE_SIZE)  # above: no message
    hi = rd.int(doc.get("max_message_size", MAX_MESSAGE_SIZE), "max_message_size", 0, MAX_MESSAGE_SIZE)
    if lo > hi:
        raise rd.fail("max_message_size", f"{hi} is below min_message_size {lo}")
    threads = rd.int(
        doc.get("num_threads_per_block", MAX_THREADS_PER_BLOCK), "num_threads_per_block", WARP, MAX_THREADS_PER_BLOCK
    )
    if threads % WARP:
        raise rd.fail("num_threads_per_block", f"must be a multiple of {WARP} (whole warps), got {threads}")
    alignment = rd.int(doc.get("buffer_alignment", 16), "buffer_alignment", 1, MAX_BUFFER_ALIGNMENT)
    if alignment & (alignment - 1):
        raise rd.fail("buffer_alignment", f"must be a power of two, got {alignment}")
    plan = Plan(
        name=str(doc["name"]),
        collective=doc["collective"],
        protocol=doc["protocol"],
        inplace=rd.bool(doc.get("inplace", False), "inplace"),
        gpus=gpus,
        num_threads_per_block=threads,
        use_double_scratch_buffer=rd.bool(doc.get("use_double_scratch_buffer", False), "use_double_scratch_buffer"),
        buffer_alignment=alignment,
        min_message_size=lo,
        max_message_size=hi,
        weft=meta,
        reuse_resources=reuse,
    )
    if not plan.checkable:
        _check_pairing(rd, plan)
        return plan
    _check_chunk_counts(rd, plan)
    _check_pairing(rd, plan)
    if plan.facts is not None and plan.facts.shifts:
        _check_shift(rd, plan)
    stated = (doc.get("weft") or {}).get("hash")
    if stated is not None and stated != plan.content_hash:
        raise rd.fail(
            "weft.hash", f"the file says {stated} but its content hashes to {plan.content_hash} (edited by hand?)"
        )
    return plan


def _check_chunk_counts(rd: _Reader, plan: Plan) -> None:
    """Each GPU's input and output chunks are what the plan's collective gives a rank."""
    try:
        spec = plan.collective_spec()
    except CollectiveError as e:
        raise rd.fail("collective", str(e)) from None
    for i, g in enumerate(plan.gpus):
        for field_name, want in (("input_chunks", len(spec.input_map(i))), ("output_chunks", len(spec.output_map(i)))):
            if getattr(g, field_name) != want:
                raise rd.fail(
                    f"gpus[{i}].{field_name}",
                    f"{getattr(g, field_name)} does not fit a {plan.collective} "
                    f"of {plan.nranks} ranks (expected {want})",
                )


def _check_shift(rd: _Reader, plan: Plan) -> None:
    """A sendrecv plan moves rank r's input to rank r+1 only: every remote entry it writes is rank r+1's and every
    one it reads rank r-1's. (MSCCL++'s SendRecv with a split mask sends further, to r+group_size: its plans record
    the same collective name, so weft refuses them here rather than report a wrong result.)"""
    n = plan.nranks
    for r, g in enumerate(plan.gpus):
        for t, tb in enumerate(g.threadblocks):
            for k, op in enumerate(tb.ops):
                for inner in op.flat():
                    for side, refs, want in (
                        ("src_buff", inner.src_buff, (r - 1) % n),
                        ("dst_buff", inner.dst_buff, (r + 1) % n),
                    ):
                        for j, ref in enumerate(refs):
                            peer = remote_target(g, tb, inner, ref)[0] if ref.remote else want
                            if peer != want:
                                raise rd.fail(
                                    f"gpus[{r}].threadblocks[{t}].ops[{k}].{side}[{j}]",
                                    f"names rank {peer}, but a sendrecv moves rank r's input to rank r+1 "
                                    f"only (rank {want} here; MSCCL++'s SendRecv with a split mask is not "
                                    "weft's sendrecv)",
                                )


def _parse_meta(rd: _Reader, data: object) -> PlanMeta:
    if data is None:
        return PlanMeta(dtypes=("fp32", "fp16", "bf16"))
    doc = rd.obj(data, "weft")
    channel_ids = doc.get("channel_ids", "gpu")
    if channel_ids not in ("threadblock", "gpu"):
        raise rd.fail("weft.channel_ids", f"must be 'threadblock' or 'gpu', got {channel_ids!r}")
    dtypes = tuple(rd.list(doc.get("dtypes", ["fp32", "fp16", "bf16"]), "weft.dtypes"))
    for i, d in enumerate(dtypes):
        if d not in ("fp32", "fp16", "bf16"):
            raise rd.fail(f"weft.dtypes[{i}]", f"must be fp32, fp16 or bf16, got {d!r}")
    verification = doc.get("verification")
    return PlanMeta(
        topology=str(doc.get("topology", "")),
        schedule_hash=str(doc.get("schedule_hash", "")),
        solver=str(doc.get("solver", "")),
        chunks=rd.int(doc.get("chunks", 1), "weft.chunks", 1),
        root=rd.int(doc.get("root", 0), "weft.root"),
        instances=rd.int(doc.get("instances", 1), "weft.instances", 1),
        predicted_us=_predictions(rd, doc.get("predicted_us", {})),
        prediction=str(doc.get("prediction", ""))[:300],
        verification=rd.obj(verification, "weft.verification") if verification is not None else None,
        dtypes=dtypes,
        channel_ids=channel_ids,
    )


def _predictions(rd: _Reader, data: object) -> dict[str, float]:
    table = rd.obj(data, "weft.predicted_us")
    for size, us in table.items():
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not 0 <= us < math.inf:
            raise rd.fail(f"weft.predicted_us.{size}", f"must be a time in µs, got {us!r}")
    return dict(table)


def _parse_gpu(rd: _Reader, data: object, where: str, nranks: int) -> Gpu:
    doc = rd.obj(data, where)
    _known(rd, doc, "gpu", where)
    channels = []
    for k, c in enumerate(rd.list(doc.get("channels", []), f"{where}.channels")):
        c = rd.obj(c, f"{where}.channels[{k}]")
        ctype = rd.channel_type(c.get("channel_type", c.get("type")), f"{where}.channels[{k}].channel_type")
        peers = rd.list(c.get("connected_to"), f"{where}.channels[{k}].connected_to")
        for j, p in enumerate(peers):
            rd.int(p, f"{where}.channels[{k}].connected_to[{j}]")
            if p >= nranks:
                raise rd.fail(f"{where}.channels[{k}].connected_to[{j}]", f"rank {p} does not exist ({nranks} ranks)")
        channels.append(Channel(ctype, tuple(peers)))
    remote = []
    for k, b in enumerate(rd.list(doc.get("remote_buffers", []), f"{where}.remote_buffers")):
        b = rd.obj(b, f"{where}.remote_buffers[{k}]")
        rank = rd.int(b.get("rank"), f"{where}.remote_buffers[{k}].rank")
        if rank >= nranks:
            raise rd.fail(f"{where}.remote_buffers[{k}].rank", f"rank {rank} does not exist ({nranks} ranks)")
        if b.get("type") not in BUFFER_TYPES:
            raise rd.fail(f"{where}.remote_buffers[{k}].type", f"must be 'i', 'o' or 's', got {b.get('type')!r}")
        access = rd.list(b.get("access_channel_types", ["memory"]), f"{where}.remote_buffers[{k}].access_channel_types")
        for j, t in enumerate(access):
            rd.channel_type(t, f"{where}.remote_buffers[{k}].access_channel_types[{j}]")
        remote.append(RemoteBuffer(rank, b["type"], tuple(access)))
    semaphores = []
    for k, s in enumerate(rd.list(doc.get("semaphores", []), f"{where}.semaphores")):
        s = rd.obj(s, f"{where}.semaphores[{k}]")
        semaphores.append(rd.int(s.get("init_value", 0), f"{where}.semaphores[{k}].init_value"))
    gpu = Gpu(
        id=rd.int(doc.get("id"), f"{where}.id"),
        input_chunks=rd.int(doc.get("input_chunks"), f"{where}.input_chunks"),
        output_chunks=rd.int(doc.get("output_chunks"), f"{where}.output_chunks"),
        scratch_chunks=rd.int(doc.get("scratch_chunks", 0), f"{where}.scratch_chunks"),
        threadblocks=(),
        channels=tuple(channels),
        remote_buffers=tuple(remote),
        semaphores=tuple(semaphores),
    )
    if max(gpu.input_chunks, gpu.output_chunks) == 0 and rd.collective != TEST_COLLECTIVE:
        raise rd.fail(f"{where}.output_chunks", "a GPU needs an input or output buffer of at least one chunk")
    for buffer in ("input_chunks", "output_chunks", "scratch_chunks"):
        if getattr(gpu, buffer) > MAX_CHUNKS:
            raise rd.fail(f"{where}.{buffer}", f"at most {MAX_CHUNKS} chunks, got {getattr(gpu, buffer)}")
    tbs = tuple(
        _parse_threadblock(rd, tb, f"{where}.threadblocks[{i}]", gpu)
        for i, tb in enumerate(rd.list(doc.get("threadblocks"), f"{where}.threadblocks"))
    )
    for i, tb in enumerate(tbs):
        if tb.id != i:
            raise rd.fail(f"{where}.threadblocks[{i}].id", f"must be {i} (thread blocks are listed in id order)")
    return replace(gpu, threadblocks=tbs)


def _parse_threadblock(rd: _Reader, data: object, where: str, gpu: Gpu) -> Threadblock:
    doc = rd.obj(data, where)
    _known(rd, doc, "threadblock", where)
    channels = []
    for k, c in enumerate(rd.list(doc.get("channels", []), f"{where}.channels")):
        c = rd.obj(c, f"{where}.channels[{k}]")
        ctype = rd.channel_type(c.get("channel_type"), f"{where}.channels[{k}].channel_type")
        ids = rd.list(c.get("channel_ids"), f"{where}.channels[{k}].channel_ids")
        nchannels = len(gpu.peers(ctype))
        for j, cid in enumerate(ids):
            if rd.int(cid, f"{where}.channels[{k}].channel_ids[{j}]") >= nchannels:
                raise rd.fail(
                    f"{where}.channels[{k}].channel_ids[{j}]",
                    f"channel {cid} does not exist (the GPU has {nchannels} {ctype} channels)",
                )
        channels.append(ChannelRef(ctype, tuple(ids)))
    refs = []
    for k, r in enumerate(rd.list(doc.get("remote_buffer_refs", []), f"{where}.remote_buffer_refs")):
        r = rd.obj(r, f"{where}.remote_buffer_refs[{k}]")
        ctype = rd.channel_type(r.get("access_channel_type"), f"{where}.remote_buffer_refs[{k}].access_channel_type")
        ids = rd.list(r.get("remote_buffer_ids"), f"{where}.remote_buffer_refs[{k}].remote_buffer_ids")
        for j, b in enumerate(ids):
            if rd.int(b, f"{where}.remote_buffer_refs[{k}].remote_buffer_ids[{j}]") >= len(gpu.remote_buffers):
                raise rd.fail(
                    f"{where}.remote_buffer_refs[{k}].remote_buffer_ids[{j}]",
                    f"remote buffer {b} does not exist (the GPU lists {len(gpu.remote_buffers)})",
                )
        refs.append(RemoteBufferRef(ctype, tuple(ids)))
    tb = Threadblock(rd.int(doc.get("id"), f"{where}.id"), (), tuple(channels), tuple(refs))
    ops = tuple(
        _parse_op(rd, op, f"{where}.ops[{i}]", gpu, tb) for i, op in enumerate(rd.list(doc.get("ops"), f"{where}.ops"))
    )
    return replace(tb, ops=ops)


def _parse_pipeline(rd: _Reader, doc: dict[str, Any], where: str, gpu: Gpu, tb: Threadblock) -> Op:
    """A pipeline: its ops run once per unit_size bytes of num_chunks chunks (MSCCL++ handlePipeline)."""
    extra = sorted(set(doc) - {"name", "iter_context", "ops"})
    if extra:
        raise rd.fail(
            f"{where}.{extra[0]}", "field not supported by weft on op 'pipeline' (it takes iter_context and ops)"
        )
    ctx = rd.obj(doc.get("iter_context"), f"{where}.iter_context")
    unit = rd.int(ctx.get("unit_size"), f"{where}.iter_context.unit_size", 1)
    nchunks = rd.int(ctx.get("num_chunks"), f"{where}.iter_context.num_chunks", 1)
    ops = tuple(
        _parse_op(rd, op, f"{where}.ops[{i}]", gpu, tb) for i, op in enumerate(rd.list(doc.get("ops"), f"{where}.ops"))
    )
    for i, op in enumerate(ops):
        if op.spec.container:
            raise rd.fail(f"{where}.ops[{i}]", "a pipeline inside a pipeline (MSCCL++ runs one level)")
        for field_name, refs in (("src_buff", op.src_buff), ("dst_buff", op.dst_buff)):
            for j, ref in enumerate(refs):
                if ref.size != nchunks:
                    raise rd.fail(
                        f"{where}.ops[{i}].{field_name}[{j}].size",
                        f"{ref.size} chunks, but the pipeline's iterations span iter_context.num_chunks = {nchunks}",
                    )
        if op.spec.packet:
            raise rd.fail(
                f"{where}.ops[{i}].name",
                f"packet op {op.name!r} in a pipeline (MSCCL++'s kernel runs packet ops whole, once per iteration)",
            )
    return Op("pipeline", unit_size=unit, num_chunks=nchunks, ops=ops)


def _parse_op(rd: _Reader, data: object, where: str, gpu: Gpu, tb: Threadblock) -> Op:
    doc = rd.obj(data, where)
    name = doc.get("name")
    if isinstance(name, str) and name in SWITCH_OPS:
        raise rd.fail(f"{where}.name", f"op {name!r} runs on switch channels: {REFUSED_CHANNEL_TYPES['switch']}")
    if not isinstance(name, str) or name not in OPS:
        raise rd.fail(f"{where}.name", f"unsupported op {name!r} (weft runs {', '.join(sorted(OPS))})")
    if OPS[name].container:
        return _parse_pipeline(rd, doc, where, gpu, tb)
    extra = sorted(set(doc) - _PLAIN_OP_FIELDS)
    if extra:
        raise rd.fail(
            f"{where}.{extra[0]}",
            f"field not supported by weft on op {name!r} (weft reads {', '.join(sorted(_PLAIN_OP_FIELDS))})",
        )
    if doc.get("reduce_op", "sum") != "sum":
        raise rd.fail(f"{where}.reduce_op", f"only 'sum' is supported, got {doc['reduce_op']!r}")
    channel_type, channel_ids = _parse_channels(rd, doc, where, name, tb)
    src = tuple(
        _parse_ref(rd, b, f"{where}.src_buff[{j}]", gpu, tb, channel_type)
        for j, b in enumerate(rd.list(doc.get("src_buff", []), f"{where}.src_buff"))
    )
    dst = tuple(
        _parse_ref(rd, b, f"{where}.dst_buff[{j}]", gpu, tb, channel_type)
        for j, b in enumerate(rd.list(doc.get("dst_buff", []), f"{where}.dst_buff"))
    )
    sems = tuple(
        rd.int(s, f"{where}.semaphore_ids[{j}]")
        for j, s in enumerate(rd.list(doc.get("semaphore_ids", []), f"{where}.semaphore_ids"))
    )
    for j, s in enumerate(sems):
        if s >= len(gpu.semaphores):
            raise rd.fail(f"{where}.semaphore_ids[{j}]", f"semaphore {s} does not exist ({len(gpu.semaphores)})")
    barrier_id = num_tbs = None
    if name == "barrier":
        barrier_id = rd.int(doc.get("barrier_id", 0), f"{where}.barrier_id")
        num_tbs = rd.int(doc.get("num_threadblocks"), f"{where}.num_threadblocks", 1)
    tbg = None
    if "tbg_info" in doc:
        info = rd.obj(doc["tbg_info"], f"{where}.tbg_info")
        size = rd.int(info.get("tbg_size"), f"{where}.tbg_info.tbg_size", 1)
        tb_id = rd.int(info.get("tb_id"), f"{where}.tbg_info.tb_id")
        if tb_id >= size:
            raise rd.fail(f"{where}.tbg_info.tb_id", f"{tb_id} is not below tbg_size {size}")
        if not OPS[name].buffers or OPS[name].packet:
            raise rd.fail(
                f"{where}.tbg_info",
                f"on op {name!r}: weft splits the data ops that move plain data among a thread-block group",
            )
        tbg = (tb_id, size)
    if rd.foreign:  # a plan another tool wrote means what MSCCL++'s kernel does with it
        differs = kernel_shape_errors(doc, where)
        if differs:
            field, why = differs[0].split(": ", 1)
            raise rd.fail(field, f"{why} (weft would run every entry as listed; refused so the plan means one thing)")
    op = Op(name, channel_type, channel_ids, src, dst, sems, barrier_id, num_tbs, tbg)
    _check_op_shape(rd, op, where)
    return op


def _parse_channels(
    rd: _Reader, doc: dict[str, Any], where: str, name: str, tb: Threadblock
) -> tuple[str | None, tuple[int, ...]]:
    """An op's channel type and the GPU channel ids it names (None and () for an op without channels)."""
    if "channel_type" not in doc and name not in CHANNEL_OPS:
        return None, ()
    channel_type = rd.channel_type(doc.get("channel_type"), f"{where}.channel_type")
    if channel_type == "port" and name not in PORT_OPS:
        raise rd.fail(
            f"{where}.channel_type",
            f"op {name!r} cannot run on a port channel (port channels carry {', '.join(sorted(PORT_OPS))})",
        )
    channel_ids = tuple(
        rd.int(c, f"{where}.channel_ids[{j}]")
        for j, c in enumerate(rd.list(doc.get("channel_ids", []), f"{where}.channel_ids"))
    )
    listed = tb.channel_list(channel_type)
    for j, cid in enumerate(channel_ids):
        if rd.channel_ids == "threadblock" and cid >= len(listed):
            raise rd.fail(
                f"{where}.channel_ids[{j}]",
                f"index {cid} is past the thread block's {len(listed)} "
                f"{channel_type} channels (ops index the block's list)",
            )
        if rd.channel_ids == "gpu" and cid not in listed:
            raise rd.fail(
                f"{where}.channel_ids[{j}]",
                f"channel {cid} is not among the thread block's {channel_type} channels",
            )
    if rd.channel_ids == "threadblock":
        channel_ids = tuple(listed[c] for c in channel_ids)
    if rd.channel_ids == "threadblock" and name in ("pws", "pwsf") and channel_type == "memory":
        raise rd.fail(
            f"{where}.name",
            f"op {name!r} on memory channels: MSCCL++'s kernel puts without a signal "
            "there (it signals on port channels only), weft's would signal; write "
            "put, then signal",
        )
    return channel_type, channel_ids


def _parse_ref(rd: _Reader, data: object, where: str, gpu: Gpu, tb: Threadblock, channel_type: str | None) -> BufferRef:
    doc = rd.obj(data, where)
    _known(rd, doc, "buffer entry", where)
    index = rd.int(doc.get("index", doc.get("offset")), f"{where}.index")
    size = rd.int(doc.get("size"), f"{where}.size", 1)
    if "buffer_id" in doc:
        buffer_id = rd.int(doc["buffer_id"], f"{where}.buffer_id")
        if channel_type is None or tb.remote_buffer_id(channel_type, buffer_id) is None:
            raise rd.fail(
                f"{where}.buffer_id",
                f"remote buffer {buffer_id} is not among the thread block's "
                f"remote_buffer_refs for channel type {channel_type!r}",
            )
        return BufferRef(index, size, buffer_id=buffer_id)
    if doc.get("type") not in BUFFER_TYPES:
        raise rd.fail(f"{where}.type", f"must be 'i', 'o' or 's', got {doc.get('type')!r}")
    return BufferRef(index, size, type=doc["type"])


def _check_op_shape(rd: _Reader, op: Op, where: str) -> None:
    """Op-specific structure, as the op table says: which entries are remote, which pair up, how many channels."""
    field, why = op.spec.shape_error(
        [(b.remote, b.size) for b in op.src_buff],
        [(b.remote, b.size) for b in op.dst_buff],
        len(op.channel_ids),
        len(op.semaphore_ids),
    )
    if why:
        raise rd.fail(f"{where}.{field}" if field else where, why)


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


def _entry_target(gpu: Gpu, tb: Threadblock, op: Op, ref: BufferRef, rank: int) -> tuple[int, str]:
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


def _check_pairing(rd: _Reader, plan: Plan) -> None:
    """Channels pair up (``channel_pairs``); remote entries go through a channel to the rank owning the buffer."""
    pairs = {channel_type: channel_pairs(plan, channel_type) for channel_type in CHANNEL_TYPES}
    for r, gpu in enumerate(plan.gpus):
        peer_tables = {channel_type: gpu.peers(channel_type) for channel_type in CHANNEL_TYPES}  # once per rank
        for t, tb in enumerate(gpu.threadblocks):
            for i, op in ((i, o) for i, top in enumerate(tb.ops) for o in top.flat()):
                channel_type = op.channel_type or "memory"
                peers = peer_tables[channel_type]
                if op.spec.device in ("signal", "wait") or op.spec.signals:
                    for cid in op.channel_ids:
                        if (r, cid) not in pairs[channel_type]:
                            raise rd.fail("gpus", unpaired_error(plan, r, cid, channel_type))
                for ref, cid in op_channels(op):
                    rank, _ = remote_target(gpu, tb, op, ref)
                    if peers[cid] != rank:
                        raise rd.fail(
                            f"gpus[{r}].threadblocks[{t}].ops[{i}].channel_ids",
                            f"channel {cid} connects to rank {peers[cid]} but the buffer is on rank {rank}",
                        )
                for ref in op.src_buff + op.dst_buff:
                    rank, btype = _entry_target(gpu, tb, op, ref, r)
                    limit = plan.gpus[rank].buffer_chunks(btype)
                    if ref.index + ref.size > limit:
                        raise rd.fail(
                            f"gpus[{r}].threadblocks[{t}].ops[{i}]",
                            f"chunks {ref.index}..{ref.index + ref.size - 1} of rank {rank}'s {btype!r} "
                            f"buffer are out of range ({limit} chunks)",
                        )
