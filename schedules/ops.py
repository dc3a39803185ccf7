"""The op table: what every plan op means, in one place.

Each row (an ``OpSpec``) says, for one op name as it appears in a plan file, which of its buffer entries live on
a peer, whether its entries pair up (src[j] -> dst[j]) or are summed, which entries carry LL packets, how many
channel ids it takes, whether it signals, waits or touches semaphores, and which device op the GPU interpreter
runs for it. The plan parser (``schedules.plan``) checks an op's shape against its row, codegen names a channel
type from it, the CPU reference executor and the GPU tables (``executor.reference.machine``, ``executor.gpu.tables``)
run it from it. A new op is one row here plus, where its device kind is new, kernel code.

Channel-id arity (``channels``):

- ``NO_CHANNELS``: the op takes no ``channel_type`` / ``channel_ids``;
- ``LISTED``: at least one channel id; the op acts on every listed channel (signal, wait);
- ``PER_REMOTE``: one channel id per remote entry, remote srcs first, then remote dsts (``op_channels``), or none:
  MSCCL++'s memory-channel data ops reach a peer's buffer through ``buffer_id`` alone (the kernel writes the
  peer's mapped pointer; no channel is touched), so only an op that signals needs them;
- ``ANY_CHANNELS``: any number of ids, none needed (flush on memory channels does nothing).

>>> OPS["put"].src, OPS["put"].dst, OPS["put"].pairwise, OPS["put"].channels
('local', 'remote', True, 'per_remote')
>>> sorted(name for name, spec in OPS.items() if spec.packet)
['cpkt', 'ppkt', 'recpkt', 'recspkt', 'repkt', 'respkt', 'rppkt', 'upkt']
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

LOCAL, REMOTE, ANY = "local", "remote", "any"  # where an op's src (or dst) entries live
NO_CHANNELS, LISTED, PER_REMOTE, ANY_CHANNELS = "", "listed", "per_remote", "any"
NO_PACKETS, ALL_PACKETS, PACKETS_AFTER_FIRST, REMOTE_PACKETS = "", "all", "after_first", "remote"
SWITCH_OPS = ("glres", "gstore", "gstorepkt")  # MSCCL++'s switch (NVLS) ops: refused with their channel type

# Device op kinds: what the interpreter kernel runs (kNop.. in executor/gpu/cuda/contract.cuh, in order).
DEVICE_KINDS = ("nop", "barrier", "signal", "wait", "flush", "transfer", "sem_acquire", "sem_release")


@dataclass(frozen=True)
class OpSpec:
    """One op's meaning. ``src``/``dst``: where its entries live (LOCAL, REMOTE or ANY)."""

    name: str  # the wire name in plan files
    doc: str
    device: str  # the device kind it runs as (DEVICE_KINDS); "transfer" ops move data
    channels: str = NO_CHANNELS
    buffers: bool = False  # needs src_buff and dst_buff
    src: str = LOCAL
    dst: str = LOCAL
    pairwise: bool = False  # src[j] -> dst[j]: equal counts and sizes
    reduces: bool = False  # the sum of every src, written to every dst: every entry of one size
    min_src: int = 0
    min_dst: int = 0
    local_head: int = 0  # how many leading dst entries must be local (recspkt: the plain and the packet copy)
    local_dst: bool = False  # writes at least one local dst
    packet_src: str = NO_PACKETS  # which srcs it reads as packets (waiting for them): all or all but src[0]
    packet_dst: str = NO_PACKETS  # which dsts it writes as packets: all or the remote ones
    signals: bool = False  # signals on its channel ids after its data (besides the "signal" device kind)
    semaphores: bool = False  # acts on semaphore_ids (at least one)
    container: bool = False  # holds ops of its own (pipeline): executors run them, never this op
    broadcast: bool = False  # pairwise, or one src to every dst (MSCCL++'s rppkt reads src[0] for every dst)
    flushes: bool = False  # on port channels, waits until its puts completed (a flush after the op)

    @property
    def packet(self) -> bool:
        return bool(self.packet_src or self.packet_dst)

    @property
    def local_only(self) -> bool:
        return self.buffers and self.src == LOCAL and self.dst == LOCAL

    def reads_packet(self, k: int) -> bool:
        """Whether src entry k is read as packets."""
        return self.packet_src == ALL_PACKETS or (self.packet_src == PACKETS_AFTER_FIRST and k > 0)

    def writes_packet(self, remote: bool, k: int = 0) -> bool:
        """Whether dst entry k (remote or local) is written as packets."""
        return (
            self.packet_dst == ALL_PACKETS
            or (self.packet_dst == REMOTE_PACKETS and remote)
            or (self.packet_dst == PACKETS_AFTER_FIRST and k > 0)
        )

    def shape_error(
        self, srcs: list[tuple[bool, int]], dsts: list[tuple[bool, int]], nchannels: int, nsemaphores: int
    ) -> tuple[str, str]:
        """('', '') when an op of this kind with these entries ((remote, size) each) is well formed, else (the
        field under the op that is wrong, or '', and why)."""
        n_remote = sum(r for r, _ in srcs + dsts)
        if self.buffers and (not srcs or not dsts):
            return "", f"op {self.name!r} needs src_buff and dst_buff"
        if self.local_only and n_remote:
            return "", f"op {self.name!r} reads and writes local buffers only"
        if self.broadcast and len(srcs) == 1:
            srcs = srcs * len(dsts)
        where, why = self._pairing_error(srcs, dsts)
        if not why:
            where, why = self._sides_error(srcs, dsts)
        if not why:
            where, why = self._entries_error(srcs, dsts)
        if not why:
            where, why = self._ids_error(n_remote, nchannels, nsemaphores)
        return where, why

    def _pairing_error(self, srcs: list[tuple[bool, int]], dsts: list[tuple[bool, int]]) -> tuple[str, str]:
        if not self.pairwise:
            return "", ""
        if len(srcs) != len(dsts):
            return "", f"op {self.name!r} pairs src_buff and dst_buff: {len(srcs)} vs {len(dsts)} entries"
        for j, ((_, s), (_, d)) in enumerate(zip(srcs, dsts, strict=True)):
            if s != d:
                return f"dst_buff[{j}].size", f"{d} differs from src_buff[{j}].size {s}"
        return "", ""

    def _sides_error(self, srcs: list[tuple[bool, int]], dsts: list[tuple[bool, int]]) -> tuple[str, str]:
        """Entries on the wrong side (local where the op reads or writes a peer's buffer, or the reverse)."""
        if not self.buffers or self.local_only:
            return "", ""
        wrong_src = self.src != ANY and any(r != (self.src == REMOTE) for r, _ in srcs)
        wrong_dst = self.dst != ANY and any(r != (self.dst == REMOTE) for r, _ in dsts)
        if not (wrong_src or wrong_dst):
            return "", ""
        parts = ([f"reads {self.src} src_buff entries"] if self.src != ANY else []) + (
            [f"writes {self.dst} dst_buff entries"] if self.dst != ANY else []
        )
        return "", f"op {self.name!r} {' and '.join(parts)}{' only' if len(parts) == 1 else ''}"

    def _entries_error(self, srcs: list[tuple[bool, int]], dsts: list[tuple[bool, int]]) -> tuple[str, str]:
        name = self.name
        if self.reduces and len({s for _, s in srcs + dsts}) != 1:
            return "", f"op {name!r} needs every src_buff and dst_buff entry of one size"
        if len(srcs) < self.min_src:
            return "", f"op {name!r} needs a plain src_buff[0] and at least one packet entry"
        if len(dsts) < self.min_dst:
            return "", f"op {name!r} needs a plain dst_buff[0] and a packet dst_buff[1]"
        if any(r for r, _ in dsts[: self.local_head]):
            return "", f"op {name!r} writes local dst_buff[0..{self.local_head - 1}]"
        if self.local_dst and all(r for r, _ in dsts):
            return "", f"op {name!r} writes at least one local dst_buff entry"
        return "", ""

    def _ids_error(self, n_remote: int, nchannels: int, nsemaphores: int) -> tuple[str, str]:
        if self.channels in (LISTED, PER_REMOTE):
            need = n_remote if self.channels == PER_REMOTE else max(nchannels, 1)
            if nchannels != need and not (self.channels == PER_REMOTE and nchannels == 0 and not self.signals):
                return (
                    "channel_ids",
                    f"op {self.name!r} needs {need} channel id(s), one per remote entry, got {nchannels}",
                )
        if self.semaphores and not nsemaphores:
            return "semaphore_ids", f"op {self.name!r} needs at least one semaphore id"
        return "", ""


def _table(*specs: OpSpec) -> MappingProxyType[str, OpSpec]:
    return MappingProxyType({s.name: s for s in specs})


# Each row below is one of these with its name, doc and what it does beyond them.
_COPY = OpSpec("", "", "transfer", buffers=True, pairwise=True)
_SEND = replace(_COPY, channels=PER_REMOTE, dst=REMOTE)
_REDUCE = OpSpec("", "", "transfer", buffers=True, reduces=True)

OPS = _table(
    OpSpec("nop", "nothing (a thread-block-local sync on the GPU)", "nop"),
    OpSpec("barrier", "wait until num_threadblocks thread blocks of the GPU reached barrier barrier_id", "barrier"),
    OpSpec("signal", "signal on every channel in channel_ids", "signal", channels=LISTED),
    OpSpec("wait", "wait on every channel in channel_ids", "wait", channels=LISTED),
    OpSpec(
        "rlxsignal",
        "signal without ordering this block's earlier writes (MSCCL++ relaxedSignal): weft runs it as "
        "signal, which orders more, never less",
        "signal",
        channels=LISTED,
    ),
    OpSpec(
        "rlxwait",
        "wait without acquiring the peer's writes (MSCCL++ relaxedWait): run as wait",
        "wait",
        channels=LISTED,
    ),
    OpSpec(
        "pipeline",
        "run ops once per unit_size bytes of iter_context.num_chunks chunks, in order (MSCCL++ handlePipeline)",
        "nop",
        container=True,
    ),
    OpSpec(
        "flush", "nothing for memory channels (their writes are visible at the signal)", "flush", channels=ANY_CHANNELS
    ),
    OpSpec(
        "sem_acquire",
        "take one from every semaphore in semaphore_ids (waiting while it is 0)",
        "sem_acquire",
        semaphores=True,
    ),
    OpSpec("sem_release", "add one to every semaphore in semaphore_ids", "sem_release", semaphores=True),
    replace(_SEND, name="put", doc="copy local src[j] to remote dst[j] through channel_ids[j]"),
    replace(_SEND, name="pws", doc="put, then signal on the same channels", signals=True),
    replace(
        _SEND, name="pwsf", doc="pws, then flush (a flush does nothing on memory channels)", signals=True, flushes=True
    ),
    replace(
        _COPY,
        name="get",
        doc="copy remote src[j] (through channel_ids[j]) to local dst[j] (MSCCL++'s handleGet at 1f5f065d "
        "swaps the two entries' offsets: the same where their indices are equal)",
        channels=PER_REMOTE,
        src=REMOTE,
    ),
    replace(_COPY, name="copy", doc="copy local src[j] to local dst[j]"),
    replace(_REDUCE, name="re", doc="sum of every local src, written to every local dst", local_dst=True),
    replace(
        _REDUCE,
        name="res",
        doc="re, also written to every remote dst (the k-th through channel_ids[k])",
        channels=PER_REMOTE,
        dst=ANY,
    ),
    replace(
        _REDUCE,
        name="rre",
        doc="sum of every src, local or remote (the k-th remote through channel_ids[k]), to local dsts",
        channels=PER_REMOTE,
        src=ANY,
        dst=ANY,
        local_dst=True,
    ),
    replace(
        _REDUCE,
        name="rres",
        doc="rre, also written to every remote dst (channels: remote srcs first, then remote dsts)",
        channels=PER_REMOTE,
        src=ANY,
        dst=ANY,
    ),
    replace(
        _SEND,
        name="ppkt",
        doc="local plain src[j] -> remote scratch dst[j] as packets (channel_ids[j])",
        packet_dst=ALL_PACKETS,
    ),
    replace(
        _SEND,
        name="rppkt",
        doc="local packets src[j] (waits for them) -> remote scratch dst[j] as packets; one src goes to every dst",
        packet_src=ALL_PACKETS,
        packet_dst=ALL_PACKETS,
        broadcast=True,
    ),
    replace(
        _COPY, name="upkt", doc="local packets src[j] (waits for them) -> local plain dst[j]", packet_src=ALL_PACKETS
    ),
    replace(
        _COPY,
        name="cpkt",
        doc="local plain src[j] -> local scratch dst[j] as packets (MSCCL++ copyToPackets)",
        packet_dst=ALL_PACKETS,
    ),
    replace(
        _REDUCE,
        name="repkt",
        doc="src[0] local plain + every later src as local packets (waits) -> every local plain dst",
        min_src=2,
        local_dst=True,
        packet_src=PACKETS_AFTER_FIRST,
    ),
    replace(
        _REDUCE,
        name="respkt",
        doc="repkt, also written as packets to every remote scratch dst (channel_ids[k])",
        channels=PER_REMOTE,
        dst=ANY,
        min_src=2,
        packet_src=PACKETS_AFTER_FIRST,
        packet_dst=REMOTE_PACKETS,
    ),
    replace(
        _REDUCE,
        name="recpkt",
        doc="repkt into local plain dst[0], also as packets into local scratch dst[1]",
        min_src=2,
        min_dst=2,
        packet_src=PACKETS_AFTER_FIRST,
        packet_dst=PACKETS_AFTER_FIRST,
    ),
    replace(
        _REDUCE,
        name="recspkt",
        doc="recpkt, also as packets to every remote scratch dst[2..] (channel_ids[k])",
        channels=PER_REMOTE,
        dst=ANY,
        min_src=2,
        min_dst=2,
        local_head=2,
        packet_src=PACKETS_AFTER_FIRST,
        packet_dst=PACKETS_AFTER_FIRST,
    ),
)


# The ops a port channel carries (MSCCL++'s port channel: put, put-with-signal, put-with-signal-and-flush, signal,
# wait, flush, and rppkt, whose proxy copies packets it has read locally into the peer's scratch). A port channel
# reaches another host through a proxy: it never reads remote memory.
PORT_OPS = frozenset({"put", "pws", "pwsf", "rppkt", "signal", "wait", "flush"})


def op_spec(name: str) -> OpSpec:
    return OPS[name]
