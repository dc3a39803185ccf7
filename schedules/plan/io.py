"""Reading and writing Plans: ``parse_plan`` checks every field of MSCCL++'s execution-plan JSON and resolves every
reference (the format is described in ``schedules.plan.types``); ``dumps_plan`` writes it deterministic and pretty.

>>> plan = parse_plan({"name": "x", "collective": "allgather", "protocol": "Simple", "inplace": False,
...     "gpus": [{"id": 0, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0, "threadblocks": [
...     {"id": 0, "ops": [{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
...     "dst_buff": [{"type": "o", "index": 0, "size": 1}]}]}]}]}, "x.json")
>>> plan.size_chunks, plan.accepts(64), plan.accepts(6), plan.runs(6), plan.padding(6).padded_bytes
(1, True, False, True, 8)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from schedules import mscclpp_format
from schedules.collectives import MAX_CHUNKS, NAMES, PLAN_ONLY, CollectiveError
from schedules.lamport import PROTOCOL as LAMPORT
from schedules.lamport import LamportBuffers
from schedules.mscclpp_format import kernel_shape_errors
from schedules.ops import OPS, PORT_OPS, SWITCH_OPS
from schedules.plan.types import (
    BUFFER_TYPES,
    CHANNEL_OPS,
    CHANNEL_TYPES,
    MAX_BUFFER_ALIGNMENT,
    MAX_MESSAGE_SIZE,
    MAX_MIN_MESSAGE_SIZE,
    MAX_THREADS_PER_BLOCK,
    PROTOCOLS,
    REFUSED_CHANNEL_TYPES,
    TEST_COLLECTIVE,
    WARP,
    BufferRef,
    Channel,
    ChannelRef,
    Gpu,
    Op,
    Plan,
    PlanError,
    PlanMeta,
    RemoteBuffer,
    RemoteBufferRef,
    Threadblock,
    channel_pairs,
    entry_target,
    op_channels,
    remote_target,
    unpaired_error,
)
from weftcore.gcpause import collector_paused
from weftcore.jsonfile import Fields, read_json, short_repr, write_text

_PLAIN_OP_FIELDS = mscclpp_format.OP_KEYS - {"iter_context", "ops"}  # an op other than a pipeline


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
    "(top level)": mscclpp_format.TOP_KEYS | {"weft", "lamport"},
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
    with collector_paused():  # a tree of small objects and no cycles (weftcore.gcpause)
        return _parse_plan(data, source)


def _parse_plan(data: object, source: str) -> Plan:
    rd = _Reader(source)
    doc = rd.obj(data, "(top level)")
    for key in ("name", "collective", "protocol", "gpus"):
        if key not in doc:
            raise rd.fail(key, "missing")
    if doc["protocol"] not in PROTOCOLS:
        raise rd.fail("protocol", f"must be 'Simple', 'LL' or '{LAMPORT}', got {doc['protocol']!r}")
    rotation = _parse_lamport(rd, doc)
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
        lamport=rotation,
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


def _parse_lamport(rd: _Reader, doc: dict[str, Any]) -> LamportBuffers | None:
    """A Lamport plan's rotation (required there, refused elsewhere); whether its reset can race is the
    verifier's question (``schedules.lamport.reset_race``), so that a racy plan is refused with its reason."""
    is_lamport = doc["protocol"] == LAMPORT
    if "lamport" not in doc:
        if is_lamport:
            raise rd.fail("lamport", f"missing: a {LAMPORT} plan says how its scratch rotates")
        return None
    if not is_lamport:
        raise rd.fail("lamport", f"only a {LAMPORT} plan rotates its scratch (this one is {doc['protocol']})")
    sub = rd.obj(doc["lamport"], "lamport")
    extra = sorted(set(sub) - {"buffers", "reset_ahead"})
    if extra:
        raise rd.fail(f"lamport.{extra[0]}", "field not supported by weft (weft reads buffers, reset_ahead)")
    for key in ("buffers", "reset_ahead"):
        if key not in sub:
            raise rd.fail(f"lamport.{key}", "missing")
    if rd.bool(doc.get("use_double_scratch_buffer", False), "use_double_scratch_buffer"):
        raise rd.fail("use_double_scratch_buffer", f"a {LAMPORT} plan rotates its scratch by lamport.buffers")
    return LamportBuffers(
        rd.int(sub["buffers"], "lamport.buffers", 1, 64), rd.int(sub["reset_ahead"], "lamport.reset_ahead", 0, 64)
    )


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
    counts = {ctype: len(gpu.peers(ctype)) for ctype in CHANNEL_TYPES}  # once a GPU, not once a block
    tbs = tuple(
        _parse_threadblock(rd, tb, f"{where}.threadblocks[{i}]", gpu, counts)
        for i, tb in enumerate(rd.list(doc.get("threadblocks"), f"{where}.threadblocks"))
    )
    for i, tb in enumerate(tbs):
        if tb.id != i:
            raise rd.fail(f"{where}.threadblocks[{i}].id", f"must be {i} (thread blocks are listed in id order)")
    return replace(gpu, threadblocks=tbs)


@dataclass(frozen=True)
class _BlockLists:
    """What a block's ops are checked against, worked out once a block (not once an op or entry): the GPU channel
    ids it lists per channel type, and how many remote-buffer ids it lists per channel type."""

    channels: dict[str, tuple[int, ...]]
    remote: dict[str, int]

    @staticmethod
    def of(tb: Threadblock) -> _BlockLists:
        remote = {ctype: 0 for ctype in CHANNEL_TYPES}
        for ref in tb.remote_buffer_refs:
            remote[ref.access_channel_type] = remote.get(ref.access_channel_type, 0) + len(ref.remote_buffer_ids)
        return _BlockLists({ctype: tb.channel_list(ctype) for ctype in CHANNEL_TYPES}, remote)


def _parse_threadblock(rd: _Reader, data: object, where: str, gpu: Gpu, counts: dict[str, int]) -> Threadblock:
    doc = rd.obj(data, where)
    _known(rd, doc, "threadblock", where)
    channels = []
    for k, c in enumerate(rd.list(doc.get("channels", []), f"{where}.channels")):
        c = rd.obj(c, f"{where}.channels[{k}]")
        ctype = rd.channel_type(c.get("channel_type"), f"{where}.channels[{k}].channel_type")
        ids = rd.list(c.get("channel_ids"), f"{where}.channels[{k}].channel_ids")
        nchannels = counts[ctype]
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
    lists = _BlockLists.of(tb)
    ops = tuple(
        _parse_op(rd, op, f"{where}.ops[{i}]", gpu, lists)
        for i, op in enumerate(rd.list(doc.get("ops"), f"{where}.ops"))
    )
    return replace(tb, ops=ops)


def _parse_pipeline(rd: _Reader, doc: dict[str, Any], where: str, gpu: Gpu, tb: _BlockLists) -> Op:
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


def _parse_op(rd: _Reader, data: object, where: str, gpu: Gpu, tb: _BlockLists) -> Op:
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
    rd: _Reader, doc: dict[str, Any], where: str, name: str, tb: _BlockLists
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
    listed = tb.channels[channel_type]
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


def _parse_ref(rd: _Reader, data: object, where: str, gpu: Gpu, tb: _BlockLists, channel_type: str | None) -> BufferRef:
    doc = rd.obj(data, where)
    _known(rd, doc, "buffer entry", where)
    index = rd.int(doc.get("index", doc.get("offset")), f"{where}.index")
    size = rd.int(doc.get("size"), f"{where}.size", 1)
    if "buffer_id" in doc:
        buffer_id = rd.int(doc["buffer_id"], f"{where}.buffer_id")
        if channel_type is None or not 0 <= buffer_id < tb.remote.get(channel_type, 0):  # Threadblock.remote_buffer_id
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
                    rank, btype = entry_target(gpu, tb, op, ref, r)
                    limit = plan.gpus[rank].buffer_chunks(btype)
                    if ref.index + ref.size > limit:
                        raise rd.fail(
                            f"gpus[{r}].threadblocks[{t}].ops[{i}]",
                            f"chunks {ref.index}..{ref.index + ref.size - 1} of rank {rank}'s {btype!r} "
                            f"buffer are out of range ({limit} chunks)",
                        )
