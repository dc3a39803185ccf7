"""Device tables -> the CUDA source of a kernel of their own: every op a compile-time constant, no op table.

A plan's thread blocks mostly come in families: instance k of a one-shot runs the ops of instance 0 with its offsets
(and channels, barriers) moved by k times a step. So the blocks are grouped into *classes*, runs of blocks
``first, first + stride, ...`` whose op records agree field by field up to a term linear in the block's position
``k`` in the run, and each class becomes one straight-line sequence of ``weft::Op{...}`` constants whose fields
read ``A`` or ``A + D * k``. With the op runners inlined (``WEFT_RUNNER``, common.cuh) the compiler folds them into
the code. The ops are the device tables' (``executor.gpu.tables.build_tables``), so a compiled kernel runs exactly
what the interpreter would for that rank, size, dtype and variant; the tables stay the one lowering.

>>> from schedules.plan import load_plan
>>> from executor.gpu.tables import build_tables
>>> t = build_tables(load_plan("tests/fixtures/plans/allpairs_allreduce_2.json"), 0, 1024)
>>> [(c.first, c.stride, c.count, len(c.base)) for c in block_classes(t)]
[(0, 1, 1, 7)]
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.errors import ExecutorError
from executor.gpu.build import BATCHED_THREADS, DTYPE_SUFFIX
from executor.gpu.tables import (
    FLUSH,
    LAMPORT,
    LAMPORT_RESET,
    NOP,
    NORM_PREFETCH,
    OP_DTYPE,
    PAIRS,
    PEER_SLOTS,
    SCRATCH,
    SLOTS,
    TRANSFER,
    DeviceTables,
    tripwire_op,
)

MAX_EMITTED_OPS = 1024  # constant ops one kernel holds (past it the source, and its build, grow too large to pay)
D_TYPES = {"fp32": "weft::F32", "fp16": "weft::F16", "bf16": "weft::BF16"}
GENERATOR_VERSION = "3"  # bump when the emitted form changes (it is part of every cache key)
# Ops whose threads each work on their own units and wait for no other thread of the block: between two of them that
# share no memory the block's barrier can go (``barriers``). Control ops run on thread 0 while the block waits, and
# the norm epilogue sums over the block: a barrier stays on both sides of those.
DATA_OPS = frozenset({TRANSFER, PAIRS, LAMPORT_RESET, NORM_PREFETCH, FLUSH})


@dataclass(frozen=True)
class BlockClass:
    """Blocks ``first + stride * k`` (k < count) whose records are ``base + k * delta`` (flattened, op by op)."""

    first: int
    stride: int
    count: int
    start: int  # block ``first``'s first op in the tables (block k's: start + k * start_step)
    start_step: int
    base: np.ndarray  # (ops, leaves) int64: the first block's records, flattened (``_flatten``)
    delta: np.ndarray  # (ops, leaves) int64: the change per step along the class

    @property
    def blocks(self) -> range:
        return range(self.first, self.first + self.stride * self.count, self.stride)

    def records(self, block: int) -> np.ndarray:
        """The OP_DTYPE records this class gives ``block`` (one of its blocks)."""
        k = (block - self.first) // self.stride
        return _unflatten(self.base + k * self.delta)


@dataclass(frozen=True)
class CompiledSource:
    """One kernel's source, its entry, and the key it is cached under."""

    entry: str
    code: str  # the whole translation unit (includes compiled.cuh from executor/gpu/cuda)
    plan_struct: str  # the ``Plan`` type alone (contract.cuh's types), which a host compiler can check
    key: str


NAMES: tuple[str, ...] = OP_DTYPE.names or ()
FIELDS: dict[str, Any] = dict(OP_DTYPE.fields or {})


# The flattened record: every integer leaf of OP_DTYPE in declaration order, with its C type.
def _leaves() -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for name in NAMES:
        field = FIELDS[name][0]
        if field.subdtype is None:
            out.append((name, field == np.dtype("<i8")))
        elif field.subdtype[0].names is None:
            out += [(f"{name}[{i}]", field.subdtype[0] == np.dtype("<i8")) for i in range(field.shape[0])]
        else:
            ref = field.subdtype[0]
            out += [
                (f"{name}[{i}].{r}", ref.fields[r][0] == np.dtype("<i8"))
                for i in range(field.shape[0])
                for r in ref.names
            ]
    return out


LEAVES = _leaves()
# The leaves that decide the code's shape, equal across a class: what each op is, how many references it reads
# and writes, and each reference's buffer slot and flags. The others (offsets, lengths, channel and barrier ids)
# may move along it.
STRUCTURAL = np.asarray(
    [
        name in ("type", "nsrc", "ndst", "nchannel", "line_chunk") or name.endswith((".buffer", ".flags"))
        for name, _ in LEAVES
    ]
)


RESET_LEAVES = [i for i, (name, _) in enumerate(LEAVES) if name in ("barrier_id", "barrier_count")]  # a reset's copy


def _flatten(records: np.ndarray) -> np.ndarray:
    """(ops, leaves) int64 from OP_DTYPE records, leaves in LEAVES order."""
    cols = []
    for name in NAMES:
        column = records[name]
        if column.dtype.names is None:
            cols.append(column.reshape(len(records), -1).astype(np.int64))
        else:
            stacked = np.stack([column[r].astype(np.int64) for r in column.dtype.names], axis=-1)
            cols.append(stacked.reshape(len(records), -1))
    return np.concatenate(cols, axis=1) if cols else np.zeros((0, len(LEAVES)), np.int64)


def _unflatten(flat: np.ndarray) -> np.ndarray:
    out = np.zeros(len(flat), OP_DTYPE)
    at = 0
    for name in NAMES:
        column = out[name]
        if column.dtype.names is None:
            width = int(np.prod(column.shape[1:], dtype=np.int64))
            out[name] = flat[:, at : at + width].reshape(column.shape)
            at += width
        else:
            fields = column.dtype.names
            width = column.shape[1] * len(fields)
            block = flat[:, at : at + width].reshape(len(flat), column.shape[1], len(fields))
            for j, r in enumerate(fields):
                out[name][r] = block[:, :, j]
            at += width
    return out


def block_classes(tables: DeviceTables) -> list[BlockClass]:
    """The tables' thread blocks as classes (module docstring), in order of their first block."""
    starts = tables.tb_start.tolist()
    flat = _flatten(tables.ops) if len(tables.ops) else np.zeros((0, len(LEAVES)), np.int64)
    blocks = [flat[starts[b] : starts[b + 1]] for b in range(tables.nthreadblocks)]
    shape_of = [(len(ops), ops[:, STRUCTURAL].tobytes()) for ops in blocks]
    by_shape: dict[tuple, list[int]] = {}
    for b, shape in enumerate(shape_of):
        by_shape.setdefault(shape, []).append(b)
    classes = []
    for members in by_shape.values():
        i = 0
        while i < len(members):
            found = _run(members[i:], blocks, starts)
            classes.append(found)
            i += found.count
    return sorted(classes, key=lambda c: c.first)


def _run(members: list[int], blocks: list[np.ndarray], starts: list[int]) -> BlockClass:
    """The longest class from ``members[0]`` on: blocks equally spaced whose records (and first op indices) move by
    one step each."""
    b0 = members[0]
    if len(members) == 1:
        return BlockClass(b0, 1, 1, starts[b0], 0, blocks[b0], np.zeros_like(blocks[b0]))
    stride, delta, step = members[1] - b0, blocks[members[1]] - blocks[b0], starts[members[1]] - starts[b0]
    count = 2
    for k, b in enumerate(members[2:], start=2):
        if b != b0 + k * stride or starts[b] != starts[b0] + k * step:
            break
        if not np.array_equal(blocks[b], blocks[b0] + k * delta):
            break
        count += 1
    return BlockClass(b0, stride, count, starts[b0], step, blocks[b0], delta)


@dataclass(frozen=True)
class Touch:
    """Memory one op reference reads or writes: which memory (``_memory``), and where in it: ``lo``..``hi`` bytes
    in this execution's layout, moving by ``step`` bytes a block along its class; ``exact`` False where the reference
    is packets, whose footprint is not its bytes (the whole memory counts)."""

    memory: str
    lo: int
    hi: int
    step: int
    exact: bool
    copy: bool  # in the scratch copy of this execution (a Lamport reference), else at its offset alone


def _memory(slot: int, tables: DeviceTables) -> str:
    """Which memory a buffer slot names, as far as a block's ops can tell: one name may be several slots that
    could be one buffer. The input and output are one buffer in an in-place plan, and apart otherwise (a call whose
    output overlaps its input runs the interpreter: ``executor.gpu.engine.overlapping``); the residual, the norm
    weight and the normalized rows are the caller's and could be either; a peer's buffer is named by its rank and
    type (two slots may name one)."""
    if slot == SLOTS["s"]:
        return "scratch"
    if PEER_SLOTS <= slot < PEER_SLOTS + len(tables.remote_buffers):
        rank, kind = tables.remote_buffers[slot - PEER_SLOTS]
        return f"peer {rank} {kind}"
    if slot in (SLOTS["i"], SLOTS["o"]) and not tables.inplace:
        return "input" if slot == SLOTS["i"] else "output"
    return "caller"


def _touches(
    record: np.ndarray, moved: np.ndarray, tables: DeviceTables, reset_apart: bool
) -> tuple[list[Touch], list[Touch]]:
    """What one op record reads and writes (``moved``: the same op one block further along its class). A Lamport
    reset writes the scratch copy a later execution uses (``barrier_id`` copies ahead of this one's, out of
    ``barrier_count``), which no op of this execution touches: with ``reset_apart`` it touches nothing here."""
    if int(record["type"]) == LAMPORT_RESET and reset_apart:
        ahead, copies = int(record["barrier_id"]), int(record["barrier_count"])
        if copies > 1 and ahead % copies:
            return [], []
    length = int(record["bytes"])

    def touch(field: str, k: int) -> Touch:
        ref, flags = record[field][k], int(record[field][k]["flags"])
        at, step = int(ref["offset"]), int(moved[field][k]["offset"]) - int(ref["offset"])
        exact = flags in (0, LAMPORT | SCRATCH)  # plain data, or Lamport data in this execution's copy
        return Touch(_memory(int(ref["buffer"]), tables), at, at + length, step, exact, bool(flags & SCRATCH))

    return (
        [touch("src", k) for k in range(int(record["nsrc"]))],
        [touch("dst", k) for k in range(int(record["ndst"]))],
    )


CALLER = {"caller", "input", "output"}  # the memories a caller's buffer (the residual, the norm's) may be


def _overlap(a: Touch, b: Touch) -> bool:
    """Whether two touches may reach the same bytes in some block of the class."""
    if not (a.memory == b.memory or ("caller" in (a.memory, b.memory) and {a.memory, b.memory} <= CALLER)):
        return False
    if not (a.exact and b.exact and a.memory == b.memory and a.copy == b.copy and a.step == b.step):
        return True  # packets, another layout, or ranges that move apart along the class: take them as one
    return a.lo < b.hi and b.lo < a.hi


def _conflict(a: tuple[list[Touch], list[Touch]], b: tuple[list[Touch], list[Touch]]) -> bool:
    """Whether two ops may touch the same bytes, one of them writing."""
    (ra, wa), (rb, wb) = a, b
    return any(_overlap(x, y) for x in wa for y in rb + wb) or any(_overlap(x, y) for x in ra for y in wb)


def barriers(records: np.ndarray, moved: np.ndarray, tables: DeviceTables, reset_apart: bool = True) -> list[bool]:
    """For each op record of a block (nops included, never followed by one), whether the block's barrier follows
    it (``moved``: the records of the block one step further along its class, or the same records for a class of
    one): where this op or the next is not a data op, or the next may touch bytes that an op since the last barrier
    writes (or write bytes one reads). Between data ops with nothing in common each thread goes on as soon as its
    own units are done, as the peers' straight-line kernels do; after a block's last op none is needed (the
    kernel's end orders it).

    A failure needs no barrier either: the thread that timed out goes on to the next barrier, where the block stops
    together, and every wait on the way ends as soon as the error record is set (``Deadline``)."""
    ops = [i for i in range(len(records)) if int(records[i]["type"]) != NOP]
    after = [False] * len(records)
    since: list[tuple[list[Touch], list[Touch]]] = []
    for i, j in zip(ops, ops[1:], strict=False):
        here, nxt = int(records[i]["type"]), int(records[j]["type"])
        since.append(_touches(records[i], moved[i], tables, reset_apart))
        step = _touches(records[j], moved[j], tables, reset_apart)
        if here in DATA_OPS and nxt in DATA_OPS and not any(_conflict(f, step) for f in since):
            continue
        after[i] = True
        since = []
    return after


def refusal(tables: DeviceTables, dtype: str, vector: int) -> str:
    """Why these tables are not compiled (the engine then runs the interpreter), or ''."""
    if dtype not in D_TYPES:
        return f"dtype {dtype!r} has no compiled kernel (fp32, fp16, bf16)"
    if vector not in (16, 8, 4):
        return f"vector width {vector} B has no compiled kernel (16, 8, 4)"
    if tables.nthreadblocks == 0:
        return "no thread block runs on this rank"
    emitted = sum(len(c.base) for c in block_classes(tables))
    if emitted > MAX_EMITTED_OPS:
        return f"its blocks hold {emitted} distinct ops (a compiled kernel holds {MAX_EMITTED_OPS})"
    return ""


def _literal(value: int, wide: bool) -> str:
    return f"{value}LL" if wide else str(value)


def _expr(base: int, delta: int, wide: bool) -> str:
    k = "q" if wide else "k"
    if delta == 0:
        return _literal(base, wide)
    sign = "+" if delta > 0 else "-"
    return f"{_literal(base, wide)} {sign} {_literal(abs(delta), wide)} * {k}"


def _initializer(base: np.ndarray, delta: np.ndarray) -> str:
    """``weft::Op{...}`` of one op of a class, trailing zero entries of its arrays left out."""
    values = dict(zip((n for n, _ in LEAVES), zip(base.tolist(), delta.tolist(), strict=True), strict=True))
    wide = dict(LEAVES)
    parts = []
    for name in NAMES:
        field = FIELDS[name][0]
        if field.subdtype is None:
            parts.append(_expr(*values[name], wide[name]))
            continue
        n = field.shape[0]
        refs = field.subdtype[0].names
        entries = []
        for i in range(n):
            keys = [f"{name}[{i}]"] if refs is None else [f"{name}[{i}].{r}" for r in refs]
            entries.append([_expr(*values[key], wide[key]) for key in keys])
        used = list(entries)
        while used and all(x in ("0", "0LL") for x in used[-1]):
            used.pop()
        items = [e[0] if refs is None else "{" + ", ".join(e) + "}" for e in used]
        parts.append("{" + ", ".join(items) + "}")
    return "weft::Op{" + ", ".join(parts) + "}"


def refs_bound(tables: DeviceTables) -> int:
    """The most references (sources, destinations) or channels any op of ``tables`` has, the tripwire's included:
    how far the kernel's loops over an op's references unroll (ops.cuh's ``KindOf``; past it every turn would break
    at once). Every op's arrays hold 16: unrolled that far, a 4-rank LL all-gather kernel took nvcc 20 s, not 5."""
    ops = np.concatenate([tables.ops, np.asarray([tripwire_op()], OP_DTYPE)])
    return max(1, *(int(ops[field].max()) for field in ("nsrc", "ndst", "nchannel")))


def _step(base: np.ndarray, delta: np.ndarray, refs: int, barrier: bool = True) -> str:
    """One op handed to the kernel's step with its type as a type, so that only that type's branch is compiled, and
    the plan's ``refs_bound``, as far as its loops over references unroll; ``barrier``: the block's barrier after it
    (``step``), else none (``step.unsynced``)."""
    call = "step" if barrier else "step.unsynced"
    return f"{call}(weft::KindOf<{int(base[0])}, {refs}>{{}}, {_initializer(base, delta)})"


def _plan_struct(classes: list[BlockClass], tables: DeviceTables) -> str:
    refs = refs_bound(tables)
    lines = ["struct Plan {", "  __device__ __forceinline__ static bool expects(int b, int first, int end) {"]
    for c in classes:
        lines.append(f"    if ({_member(c)}) {{")
        lines.append(f"      const int k = {_position(c)};")
        lines.append(f"      return first == {c.start} + {c.start_step} * k && end == first + {len(c.base)};")
        lines.append("    }")
    lines += ["    return false;", "  }", ""]
    lines += ["  template <class Step>", "  __device__ __forceinline__ static bool run(int b, Step& step) {"]
    for c in classes:
        lines.append(f"    if ({_member(c)}) {{  // blocks {c.first}, {c.first + c.stride}, ... ({c.count})")
        lines.append(f"      const int k = {_position(c)};")
        lines.append("      const i64 q = k;")
        lines.append("      (void)q;")
        # nops (the padding that gives the interpreter blocks of one op count) compile to nothing; the barriers
        # are the class's (the memories its ops touch are its structure, alike in every block of it)
        moves = c.delta[:, RESET_LEAVES].any()  # a reset whose copy ahead moves along the class is taken as touching
        after = barriers(_unflatten(c.base), _unflatten(c.base + c.delta), tables, reset_apart=not moves)
        ops = [_step(c.base[i], c.delta[i], refs, after[i]) for i in range(len(c.base)) if c.base[i][0] != NOP]
        lines.append("      return " + (" &&\n             ".join(ops) or "true") + ";")  # a block may hold no op
        lines.append("    }")
    lines += ["    return true;", "  }", ""]
    tw = _flatten(np.asarray([tripwire_op()], OP_DTYPE))[0]
    lines += [
        "  template <class Step>",
        "  __device__ __forceinline__ static bool tripwire(Step& step) {",
        "    const int k = 0;",
        "    const i64 q = 0;",
        "    (void)k;",
        "    (void)q;",
        f"    return {_step(tw, np.zeros_like(tw), refs)};",
        "  }",
        "};",
    ]
    return "\n".join(lines) + "\n"


def _member(c: BlockClass) -> str:
    last = c.first + c.stride * (c.count - 1)
    test = f"b >= {c.first} && b <= {last}"
    return test + (f" && (b - {c.first}) % {c.stride} == 0" if c.stride > 1 else "")


def _position(c: BlockClass) -> str:
    return f"(b - {c.first}) / {c.stride}" if c.stride > 1 else f"b - {c.first}"


def generate(
    tables: DeviceTables,
    dtype: str,
    vector: int,
    label: str,
    headers_hash: str,
    trace: bool = False,
    late_trigger: bool = False,
) -> CompiledSource:
    """The kernel for ``tables`` (one rank's, at one size, dtype and variant) with ``vector``-byte units;
    ``late_trigger``: the next programmatic launch starts at this kernel's end, not its start (WEFT_LATE_TRIGGER).

    ``label``: what the source's first line names (plan, rank, size); ``headers_hash``: the CUDA headers' hash, part
    of the cache key with the generated code itself, so that a change to either builds anew. Raises ExecutorError
    with ``refusal``'s reason where it does not compile them."""
    why = refusal(tables, dtype, vector)
    if why:
        raise ExecutorError(f"executor: {label}: not compiled: {why}")
    classes = block_classes(tables)
    struct = _plan_struct(classes, tables)
    batch = tables.threads <= BATCHED_THREADS
    threads, per_sm = (BATCHED_THREADS, 2) if batch else (1024, 1)  # the interpreter's bounds: the same residency
    lamport = "true" if tables.lamport_buffers else "false"
    digest = hashlib.sha256(
        "\n".join(
            [
                GENERATOR_VERSION,
                headers_hash,
                dtype,
                str(vector),
                str(tables.threads),
                lamport,
                str(trace),
                *(["late_trigger"] if late_trigger else []),  # the keys of the default kernels stay as they were
                struct,
            ]
        ).encode()
    ).hexdigest()[:20]
    entry = f"weft_compiled_{DTYPE_SUFFIX[dtype]}_v{vector}_{digest}"
    space = f"weft_plan_{digest}"  # one per kernel, so that several sources can share a translation unit
    body = "\n".join([f"namespace {space} {{", struct.rstrip("\n"), f"}}  // namespace {space}", ""])
    code = "\n".join(
        [
            f"// Generated by executor/gpu/compiled/source.py for {label}: do not edit.",
            *(["#define WEFT_LATE_TRIGGER 1"] if late_trigger else []),
            '#include "compiled.cuh"',
            "",
            body,
            f"WEFT_COMPILED({entry}, {D_TYPES[dtype]}, {vector}, {threads}, {per_sm}, {str(batch).lower()}, "
            f"{lamport}, {space}::Plan)",
            "",
        ]
    )
    return CompiledSource(entry, code, struct, digest)
