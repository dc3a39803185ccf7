"""What MSCCL++'s executor reads from a plan file, field by field: a check that a plan weft writes runs there.

Each rule below restates what ``src/core/executor/execution_plan.cc`` (``ExecutionPlan::Impl``: the constructor,
``loadExecutionPlan``, ``parseChannels``, ``parseRemoteBuffer``, ``setupChannels``, ``setupRemoteBuffers``,
``setupSemaphores``, ``setupOperations``, ``setupOperation``) and ``src/core/include/execution_common.hpp`` (the
fixed-size ``Operation`` and ``DeviceExecutionPlan``) at MSCCL++ commit 1f5f065d require: a key it reads with
``obj[key]`` must be present, one it reads with ``value``/``contains`` may be absent, an enum string must be one
its converters know, and a list must fit the array it is copied into. weft's own record (the ``"weft"`` object) is
the one key outside the format; nothing else may be there, so no field is silently dropped by MSCCL++.

>>> conformance_errors({"name": "x"})[0]
'collective: missing (read as obj["collective"])'
"""

from __future__ import annotations

from typing import Any

# getOpType in execution_plan.cc: every op name the C++ parser accepts
OP_NAMES = frozenset(
    {
        "nop",
        "barrier",
        "put",
        "pws",
        "pwsf",
        "get",
        "copy",
        "signal",
        "wait",
        "flush",
        "re",
        "res",
        "rre",
        "rres",
        "ppkt",
        "rppkt",
        "respkt",
        "cpkt",
        "upkt",
        "repkt",
        "recpkt",
        "recspkt",
        "glres",
        "gstore",
        "gstorepkt",
        "rlxsignal",
        "rlxwait",
        "pipeline",
        "sem_acquire",
        "sem_release",
    }
)
CHANNEL_TYPES = frozenset({"memory", "port", "none", "switch"})  # convertToChannelType
BUFFER_TYPES = frozenset({"i", "o", "s"})  # convertToBufferType
# execution_common.hpp
MAX_CHANNEL, MAX_CHANNEL_PER_OPERATION, MAX_OPERATION = 16, 8, 64
MAX_BUFFERS_PER_OPERATION = 2 + 8  # MAX_LOCAL_BUFFER_PER_OPERATION + MAX_CHANNEL_PER_OPERATION
MAX_DEVICE_SYNCERS, MAX_DEVICE_SEMAPHORES = 16, 16

TOP_KEYS = frozenset(
    {
        "name",
        "collective",
        "protocol",
        "inplace",
        "reuse_resources",
        "use_double_scratch_buffer",
        "buffer_alignment",
        "min_message_size",
        "max_message_size",
        "num_threads_per_block",
        "gpus",
    }
)
GPU_KEYS = frozenset(
    {
        "id",
        "input_chunks",
        "output_chunks",
        "scratch_chunks",
        "channels",
        "remote_buffers",
        "semaphores",
        "threadblocks",
    }
)
THREADBLOCK_KEYS = frozenset({"id", "channels", "remote_buffer_refs", "ops"})
OP_KEYS = frozenset(
    {
        "name",
        "channel_type",
        "channel_ids",
        "tbg_info",
        "src_buff",
        "dst_buff",
        "barrier_id",
        "num_threadblocks",
        "semaphore_ids",
        "iter_context",
        "ops",
        "reduce_op",
    }
)
BUFF_KEYS = frozenset({"type", "buffer_id", "switch_channel_id", "index", "size"})


def conformance_errors(doc: dict[str, Any], extra_top: frozenset[str] = frozenset({"weft"})) -> list[str]:
    """Every way ``doc`` (a plan as written to a file) departs from what MSCCL++'s executor reads; [] if none."""
    errors: list[str] = []
    need = _Need(errors)
    for key in ("name", "collective", "inplace", "protocol", "gpus"):  # obj[...] in the constructor and loader
        need.present(doc, key, key)
    need.keys(doc, TOP_KEYS | extra_top, "")
    need.type(doc, "inplace", bool, "inplace")
    for key in ("reuse_resources", "use_double_scratch_buffer"):
        need.type(doc, key, bool, key)
    for key in ("buffer_alignment", "min_message_size", "max_message_size", "num_threads_per_block"):
        need.type(doc, key, int, key)
    if doc.get("protocol") not in ("Simple", "LL", None):
        errors.append(f"protocol: {doc['protocol']!r} (the loader tests for 'LL'; anything else runs Simple)")
    gpus = doc.get("gpus") or []
    for rank, gpu in enumerate(gpus):
        _gpu(need, gpu, rank, len(gpus))
    return errors


class _Need:
    def __init__(self, errors: list[str]):
        self.errors = errors

    def present(self, obj: dict[str, Any], key: str, where: str) -> bool:
        if key not in obj:
            self.errors.append(f"{where}: missing (read as obj[{key!r}])".replace("'", '"'))
            return False
        return True

    def keys(self, obj: dict[str, Any], known: frozenset[str], where: str) -> None:
        for key in sorted(set(obj) - known):
            self.errors.append(f"{where}{'.' if where else ''}{key}: not a field MSCCL++'s executor reads")

    def type(self, obj: dict[str, Any], key: str, kind: type, where: str) -> None:
        if key in obj and (not isinstance(obj[key], kind) or (kind is int and isinstance(obj[key], bool))):
            self.errors.append(f"{where}: must be {kind.__name__}, got {obj[key]!r}")

    def within(self, items: list[Any], limit: int, where: str, what: str) -> None:
        if len(items) > limit:
            self.errors.append(f"{where}: {len(items)} {what}; MSCCL++ copies at most {limit} (execution_common.hpp)")


def _gpu(need: _Need, gpu: dict[str, Any], rank: int, nranks: int) -> None:
    at = f"gpus[{rank}]"
    for key in ("id", "input_chunks", "output_chunks", "scratch_chunks", "threadblocks"):
        need.present(gpu, key, f"{at}.{key}")
    need.keys(gpu, GPU_KEYS, at)
    if gpu.get("id") != rank:
        need.errors.append(f"{at}.id: {gpu.get('id')!r}; the loader requires gpus[rank].id == rank")
    memory = 0
    for k, ch in enumerate(gpu.get("channels", [])):
        where = f"{at}.channels[{k}]"
        if ch.get("channel_type") not in CHANNEL_TYPES:
            need.errors.append(f"{where}.channel_type: {ch.get('channel_type')!r} is not a channel type")
        elif ch["channel_type"] != "switch" and need.present(ch, "connected_to", f"{where}.connected_to"):
            memory += len(ch["connected_to"]) if ch["channel_type"] == "memory" else 0
            for j, peer in enumerate(ch["connected_to"]):
                if not 0 <= peer < nranks:
                    need.errors.append(f"{where}.connected_to[{j}]: rank {peer} does not exist ({nranks} ranks)")
    nremote = len(gpu.get("remote_buffers", []))
    for k, b in enumerate(gpu.get("remote_buffers", [])):
        where = f"{at}.remote_buffers[{k}]"
        for key in ("rank", "type", "access_channel_types"):
            need.present(b, key, f"{where}.{key}")
        if b.get("type") not in BUFFER_TYPES:
            need.errors.append(f"{where}.type: {b.get('type')!r} is not a buffer type")
        for t in b.get("access_channel_types", []):
            if t not in CHANNEL_TYPES:
                need.errors.append(f"{where}.access_channel_types: {t!r} is not a channel type")
    for k, s in enumerate(gpu.get("semaphores", [])):
        need.present(s, "init_value", f"{at}.semaphores[{k}].init_value")
    for t, tb in enumerate(gpu.get("threadblocks", [])):
        _threadblock(need, tb, f"{at}.threadblocks[{t}]", t, memory, nremote, len(gpu.get("semaphores", [])))


def _threadblock(need: _Need, tb: dict[str, Any], at: str, index: int, memory: int, nremote: int, nsem: int) -> None:
    for key in ("id", "channels", "ops"):  # threadblock["channels"] is read without contains() in setupChannels
        need.present(tb, key, f"{at}.{key}")
    need.keys(tb, THREADBLOCK_KEYS, at)
    if tb.get("id") != index:
        need.errors.append(f"{at}.id: {tb.get('id')!r}; operations are stored by position, ids index them")
    listed: dict[str, int] = {}
    for k, ch in enumerate(tb.get("channels", [])):
        ctype = ch.get("channel_type")
        if ctype not in CHANNEL_TYPES:
            need.errors.append(f"{at}.channels[{k}].channel_type: {ctype!r} is not a channel type")
        for cid in ch.get("channel_ids", []):
            if ctype == "memory" and not 0 <= cid < memory:
                need.errors.append(f"{at}.channels[{k}].channel_ids: channel {cid} does not exist ({memory})")
        listed[ctype] = listed.get(ctype, 0) + len(ch.get("channel_ids", []))
    for ctype, n in listed.items():
        need.within([0] * n, MAX_CHANNEL, f"{at}.channels", f"{ctype} channels")
    refs: dict[str, int] = {}
    for k, ref in enumerate(tb.get("remote_buffer_refs", [])):
        ctype = ref.get("access_channel_type")
        for b in ref.get("remote_buffer_ids", []):
            if not 0 <= b < nremote:
                need.errors.append(f"{at}.remote_buffer_refs[{k}]: remote buffer {b} does not exist ({nremote})")
        refs[ctype] = refs.get(ctype, 0) + len(ref.get("remote_buffer_ids", []))
    for ctype, n in refs.items():
        need.within([0] * n, MAX_CHANNEL, f"{at}.remote_buffer_refs", f"{ctype} remote buffers")
    flat = 0
    for i, op in enumerate(tb.get("ops", [])):
        flat += 1 + len(op.get("ops", []))
        _op(need, op, f"{at}.ops[{i}]", listed, refs, nsem)
        for j, inner in enumerate(op.get("ops", [])):
            _op(need, inner, f"{at}.ops[{i}].ops[{j}]", listed, refs, nsem)
    need.within([0] * flat, MAX_OPERATION, f"{at}.ops", "operations (a pipeline counts its own ops too)")


def _op(need: _Need, op: dict[str, Any], at: str, listed: dict[str, int], refs: dict[str, int], nsem: int) -> None:
    need.present(op, "name", f"{at}.name")
    need.keys(op, OP_KEYS, at)
    name = op.get("name")
    if name not in OP_NAMES:
        need.errors.append(f"{at}.name: {name!r} is not an op getOpType knows")
    ctype = op.get("channel_type")
    if "channel_type" in op and ctype not in CHANNEL_TYPES:
        need.errors.append(f"{at}.channel_type: {ctype!r} is not a channel type")
    ids = op.get("channel_ids", [])
    need.within(ids, MAX_CHANNEL_PER_OPERATION, f"{at}.channel_ids", "channel ids")
    nlisted = listed.get(ctype, 0) if isinstance(ctype, str) else 0
    for cid in ids:  # the kernel indexes the block's own channel list (DeviceExecutionPlan.channels)
        if not 0 <= cid < nlisted:
            need.errors.append(f"{at}.channel_ids: {cid} is past the block's {nlisted} {ctype} channels")
    if name in ("pws", "pwsf") and ctype == "memory":
        need.errors.append(f"{at}.name: {name!r} on memory channels puts without a signal in MSCCL++'s kernel")
    for field in ("src_buff", "dst_buff"):
        entries = op.get(field, [])
        need.within(entries, MAX_BUFFERS_PER_OPERATION, f"{at}.{field}", "entries")
        for j, b in enumerate(entries):
            _entry(need, b, f"{at}.{field}[{j}]", ctype, refs)
    need.errors += kernel_shape_errors(op, at)
    _sync(need, op, at, nsem)


def _entry(need: _Need, b: dict[str, Any], where: str, ctype: object, refs: dict[str, int]) -> None:
    """One src_buff or dst_buff entry: its fields, and the remote buffer it names (if any)."""
    need.keys(b, BUFF_KEYS, where)
    for key in ("index", "size"):
        need.present(b, key, f"{where}.{key}")
    if "buffer_id" in b:
        if ctype not in ("memory", "port"):  # getRemoteBufferTypeWithId throws for any other type
            need.errors.append(f"{where}.buffer_id: needs the op's channel_type memory or port, got {ctype!r}")
        elif not 0 <= b["buffer_id"] < refs.get(str(ctype), 0):
            need.errors.append(
                f"{where}.buffer_id: {b['buffer_id']} is past the block's "
                f"{refs.get(str(ctype), 0)} {ctype} remote_buffer_refs"
            )
    elif b.get("type") not in BUFFER_TYPES and "switch_channel_id" not in b:
        need.errors.append(f"{where}: needs a type ('i', 'o', 's') or a buffer_id")


def _sync(need: _Need, op: dict[str, Any], at: str, nsem: int) -> None:
    """An op's barrier, semaphores, thread-block group and pipeline fields."""
    if "barrier_id" in op and not 0 <= op["barrier_id"] < MAX_DEVICE_SYNCERS:
        need.errors.append(f"{at}.barrier_id: {op['barrier_id']} (MSCCL++ has {MAX_DEVICE_SYNCERS} device syncers)")
    sems = op.get("semaphore_ids", [])
    need.within(sems, MAX_DEVICE_SEMAPHORES, f"{at}.semaphore_ids", "semaphore ids")
    for s in sems:
        if not 0 <= s < nsem:
            need.errors.append(f"{at}.semaphore_ids: semaphore {s} does not exist ({nsem})")
    if "tbg_info" in op:
        for key in ("tb_id", "tbg_size"):
            need.present(op["tbg_info"], key, f"{at}.tbg_info.{key}")
    if op.get("name") == "pipeline":
        for key in ("iter_context", "ops"):
            need.present(op, key, f"{at}.{key}")
        for key in ("unit_size", "num_chunks"):
            need.present(op.get("iter_context", {}), key, f"{at}.iter_context.{key}")


# How MSCCL++'s execution kernel (execution_kernel.hpp) reads each op's entries, where it reads fewer than a plan can
# list: (the entries it reads, what the rest must be). "one": only entry 0; "local+remote": entry 0 local, the rest
# remote; "local+local": entry 0 local, the rest local too; "any": every entry, as listed.
_KERNEL_SHAPE = {  # op: (src_buff, dst_buff)
    "copy": ("one", "one"),
    "cpkt": ("one", "one"),
    "upkt": ("one", "one"),  # handleCopy, handleCopyPackets, ...
    "re": ("local+local", "one"),
    "res": ("local+local", "local+remote"),  # handleReduceSend
    "rre": ("local+remote", "one"),
    "rres": ("local+remote", "local+remote"),  # handleReadReduceSend
    "repkt": ("local+local", "one"),
    "respkt": ("local+local", "local+remote"),  # handleReduceSendPackets
    "recpkt": ("local+local", "two"),
    "recspkt": ("local+local", "two+remote"),  # handleReduceCopySendPackets
    "rppkt": ("one", "any"),  # handleReadPutPackets reads src_buff[0] for every destination
}


def kernel_shape_errors(op: dict[str, Any], at: str) -> list[str]:
    """Where MSCCL++'s kernel would run ``op`` (a plan file's op) otherwise than its entries say: entries it does not
    read, or reads as the other side (local vs remote), or reads at another offset."""
    errors: list[str] = []
    need = _Need(errors)
    name = op.get("name")
    srcs, dsts = op.get("src_buff", []), op.get("dst_buff", [])
    if name in ("put", "pws", "pwsf", "ppkt") and len({b.get("type") for b in srcs}) > 1:
        errors.append(
            f"{at}.src_buff: entries of types {sorted({str(b.get('type')) for b in srcs})}; "
            "MSCCL++'s handlePut reads every source from src_buff[0]'s buffer"
        )
    if name == "get":
        for j, (src, dst) in enumerate(zip(srcs, dsts, strict=False)):
            if src.get("index") != dst.get("index"):
                errors.append(
                    f"{at}.dst_buff[{j}].index: {dst.get('index')} differs from src_buff[{j}].index "
                    f"{src.get('index')}; MSCCL++'s handleGet adds each entry's offset to the other side's "
                    f"buffer, so it would copy the peer's chunk {dst.get('index')} into chunk "
                    f"{src.get('index')}"
                )
    if name not in _KERNEL_SHAPE:
        return errors
    for field, entries, shape in (
        ("src_buff", srcs, _KERNEL_SHAPE[name][0]),
        ("dst_buff", dsts, _KERNEL_SHAPE[name][1]),
    ):
        if shape == "any":
            continue
        head = 2 if shape.startswith("two") else 1
        if shape in ("one", "two") and len(entries) > head:
            need.errors.append(
                f"{at}.{field}: {len(entries)} entries; MSCCL++'s kernel runs op {name!r} on the first {head} only"
            )
        for j, b in enumerate(entries):
            remote = "buffer_id" in b
            if j < head and remote:
                need.errors.append(f"{at}.{field}[{j}]: MSCCL++'s kernel reads it as a local buffer")
            if j >= head and shape.endswith("+remote") and not remote:
                need.errors.append(f"{at}.{field}[{j}]: MSCCL++'s kernel reads it as a peer's buffer")
            if j >= head and shape.endswith("+local") and remote:
                need.errors.append(f"{at}.{field}[{j}]: MSCCL++'s kernel reads it as a local buffer")
    return errors


def mscclpp_verdict(doc: dict[str, Any]) -> str:
    """One line on whether MSCCL++'s executor reads ``doc``: its first departure, and how many more."""
    errors = conformance_errors(doc)
    if not errors:
        return "MSCCL++'s executor reads it"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"MSCCL++'s executor would refuse it: {errors[0]}{more}"
