"""The host/device contract, written once: ``cuda/contract.cuh`` is emitted from the Python tables (``gpu.tables``).

    python -m executor.gpu.contract        # rewrite executor/gpu/cuda/contract.cuh from the tables

The header holds what the host writes and the kernel reads: the integer types, the error kinds, the op kinds
(the op table's device kinds, then the kinds only the kernel has), the op record with ``static_assert``s of its
size and of every field's offset as numpy lays it out (``OP_DTYPE``), the buffer slots, and the interpreter's
parameters as a macro. The CUDA sources include it instead of copies of their own. tests/test_contract.py holds the
committed header byte-equal to ``emit()`` and compiles it with the host's C++ compiler, where the asserts hold the
compiler's layout to numpy's. (The offset asserts need ``offsetof``: nvcc and a host compiler define it, NVRTC, which
includes no headers, skips them and keeps the size asserts.)
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from executor.gpu import tables

HEADER = Path(__file__).parent / "cuda" / "contract.cuh"
C_TYPES = {np.dtype("<i4"): "int", np.dtype("<i8"): "i64"}
STRUCTS = ((tables.REF_DTYPE, "Ref"), (tables.OP_DTYPE, "Op"))
COLUMNS = 120  # .clang-format's limit
LENGTHS = {"kMaxRefs": tables.MAX_REFS, "kMaxChannels": tables.MAX_CHANNELS_PER_OP, "kMaxSlots": tables.MAX_SLOTS}
ARRAY_LENGTHS = {("Op", "channel"): "kMaxChannels", ("Op", "src"): "kMaxRefs", ("Op", "dst"): "kMaxRefs"}
FIELD_NOTES = {
    ("Ref", "offset"): "bytes from the buffer's base (packet bytes for packet references)",
    ("Ref", "buffer"): "the slot in the context's buffer table (Slot)",
    ("Ref", "flags"): "RefFlags",
    ("Op", "type"): "OpType, or a norm kind",
    ("Op", "nsrc"): "entries of src in use",
    ("Op", "ndst"): "entries of dst in use",
    ("Op", "nchannel"): "entries of channel in use",
    ("Op", "barrier_id"): "a barrier's id; a norm's row or weight bytes, or slice index; a reset's reset_ahead",
    ("Op", "barrier_count"): "a barrier's thread blocks; a norm row's slice count; Lamport scratch copies",
    ("Op", "plan_op"): "the op's index in its plan threadblock, for error reports",
    ("Op", "line_chunk"): "> 0: the op's packets are LL128 lines and this is the data bytes of one chunk",
    ("Op", "bytes"): "data bytes moved by a transfer",
    ("Op", "channel"): "channel ids (signal, wait), semaphore ids (sem_*); [0] a norm's eps bits",
    ("Op", "src"): "sources, read (and summed) in order",
    ("Op", "dst"): "destinations, each written the same bytes",
}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, COLUMNS, initial_indent="// ", subsequent_indent="// ")


def _aligned(decls: list[str], notes: list[str], indent: str = "") -> list[str]:
    """Declarations with their trailing comments in one column, as clang-format aligns consecutive ones."""
    width = max(map(len, decls))
    return [f"{indent}{d:<{width}}  // {n}" for d, n in zip(decls, notes, strict=True)]


def _enum(name: str, items: list[tuple[str, int]], note: str) -> list[str]:
    """One line where it fits (.clang-format: AllowShortEnumsOnASingleLine), else one enumerator a line."""
    one_line = f"enum {name} : int {{ {', '.join(f'{item} = {value}' for item, value in items)} }};"
    if len(one_line) <= COLUMNS:
        return [*_comment(note), one_line, ""]
    body = [f"  {item} = {value}," for item, value in items]
    body[-1] = body[-1].rstrip(",")
    return [*_comment(note), f"enum {name} : int {{", *body, "};", ""]


def _fields(dtype: np.dtype) -> list[tuple[str, np.dtype, int]]:
    """(name, type, byte offset) of a structured dtype's fields, in order."""
    assert dtype.fields is not None
    return [(name, spec[0], spec[1]) for name, spec in dtype.fields.items()]


def _struct(dtype: np.dtype, name: str) -> list[str]:
    decls = []
    for field, ftype, _ in _fields(dtype):
        if ftype.subdtype is not None:
            base, (length,) = ftype.subdtype
            ctype = dict((d, n) for d, n in STRUCTS).get(base) or C_TYPES[base]
            count = ARRAY_LENGTHS[(name, field)]
            assert LENGTHS[count] == length, f"{name}.{field} holds {length}, {count} is {LENGTHS[count]}"
            decls.append(f"{ctype} {field}[{count}];")
        else:
            decls.append(f"{C_TYPES[ftype]} {field};")
    lines = _aligned(decls, [FIELD_NOTES[(name, f)] for f, _, _ in _fields(dtype)], "  ")
    return [f"struct {name} {{", *lines, "};", ""]


def _asserts(dtype: np.dtype, name: str) -> list[str]:
    size = dtype.itemsize
    lines = [f'static_assert(sizeof({name}) == {size}, "{name}: {size} bytes, as numpy lays it out");']
    offsets = [
        f'static_assert(offsetof({name}, {field}) == {offset}, "{name}.{field} at byte {offset}");'
        for field, _, offset in _fields(dtype)
    ]
    return [*lines, "#ifdef offsetof", *offsets, "#endif", ""]


def _macro(name: str, parts: list[str]) -> list[str]:
    return [f"#define {name} {', '.join(parts)}"]


def emit() -> str:
    """The header's text, from the tables."""
    kinds = [(f"k{_camel(kind)}", code) for kind, code in tables.DEVICE_CODES.items()]
    kinds += [(f"k{_camel(kind)}", code) for kind, code in tables.KERNEL_ONLY_CODES.items()]
    norms = [("kNormRows", tables.NORM_ROWS), ("kNormPrefetch", tables.NORM_PREFETCH)]
    norms += [("kNormSlice", tables.NORM_SLICE)]
    slots = [(f"k{n}Slot", tables.SLOTS[t]) for t, n in (("i", "Input"), ("o", "Output"), ("s", "Scratch"))]
    params = [f"{ctype} {name}" for name, ctype in tables.KERNEL_PARAMS]
    trace_name, trace_type = tables.TRACE_PARAM
    lines = [
        "// Generated from executor/gpu/tables.py by executor/gpu/contract.py: do not edit; run",
        "// `python -m executor.gpu.contract` after changing the tables (tests/test_contract.py checks it is current).",
        "// The host/device contract: what the host writes and the interpreter reads.",
        "#pragma once",
        "",
        "typedef unsigned int u32;",
        "typedef unsigned long long u64;",
        "typedef long long i64;",
        "",
        "namespace weft {",
        "",
        *_enum(
            "ErrorKind",
            [(f"k{k.name}", k.code) for k in tables.ERROR_KINDS],
            "Error kinds written into the host-visible error record (tables.ERROR_KINDS says each to the user).",
        ),
        *_aligned(
            [f"constexpr int {name} = {value};" for name, value in LENGTHS.items()],
            ["entries of an op's src and of its dst", "entries of an op's channel", "buffer slots a launch binds"],
        ),
        f"enum RefFlags : int {{ kPacket = {tables.PACKET}, kScratch = {tables.SCRATCH}, "
        f"kLamport = {tables.LAMPORT} }};",
        "",
        *_enum(
            "Slot",
            [*slots, ("kPeerSlots", tables.PEER_SLOTS)],
            "The buffer slots: the local buffers, then remote_buffers[k] at kPeerSlots + k, then the residual, weight, "
            "normed rows.",
        ),
        *_enum(
            "OpType",
            kinds,
            "The device op kinds: the op table's (schedules.ops.DEVICE_KINDS), then kPairs, a transfer of plain "
            "src[j] -> dst[j] for every j, side by side, and kLamportReset, the sentinel over a block's share of the "
            "Lamport scratch copy that is free.",
        ),
        *_comment(
            "The fused RMSNorm epilogue's kinds, outside the op table's, which other ops extend: the rows a "
            "reduction completed; the weight prefetched first in a block that runs the epilogue; one slice of a row "
            "several blocks sum."
        ),
        *[f"constexpr int {name} = {code};" for name, code in norms],
        "",
        *[line for dtype, name in STRUCTS for line in _struct(dtype, name)],
        *[line for dtype, name in STRUCTS for line in _asserts(dtype, name)],
        "}  // namespace weft",
        "",
        "// The interpreter's parameters in order (tables.KERNEL_PARAMS), and the same names as arguments; a",
        "// -DWEFT_TRACE build takes the trace buffer last.",
        "// clang-format off",
        *_macro("WEFT_KERNEL_PARAMS", params),
        *_macro("WEFT_KERNEL_ARGS", [name for name, _ in tables.KERNEL_PARAMS]),
        "#ifdef WEFT_TRACE",
        f"#define WEFT_TRACE_PARAM , {trace_type} {trace_name}",
        f"#define WEFT_TRACE_ARG , {trace_name}",
        "#else",
        "#define WEFT_TRACE_PARAM",
        "#define WEFT_TRACE_ARG",
        "#endif",
        "// clang-format on",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    HEADER.write_text(emit(), encoding="utf-8")
