"""The host/device contract is written once: contract.cuh is emitted from the Python tables, is current, compiles,
and its layout asserts hold under a real C++ compiler; the CUDA sources keep no copies of it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from executor.gpu import build, contract, tables

CUDA = Path(build.__file__).parent / "cuda"
COMPILER = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def test_the_committed_header_is_the_one_the_tables_emit():
    assert contract.HEADER.read_text(encoding="utf-8") == contract.emit(), "run: python -m executor.gpu.contract"


def _check_unit() -> str:
    """A translation unit that holds the header's names to the tables' values, not to the header's own text."""
    kinds = {**tables.DEVICE_CODES, **tables.KERNEL_ONLY_CODES}
    values = {f"k{''.join(p.capitalize() for p in kind.split('_'))}": code for kind, code in kinds.items()}
    values |= {"kNormRows": tables.NORM_ROWS, "kNormPrefetch": tables.NORM_PREFETCH, "kNormSlice": tables.NORM_SLICE}
    values |= {f"k{kind.name}": kind.code for kind in tables.ERROR_KINDS}
    values |= {"kMaxRefs": tables.MAX_REFS, "kMaxChannels": tables.MAX_CHANNELS_PER_OP, "kMaxSlots": tables.MAX_SLOTS}
    values |= {"kPacket": tables.PACKET, "kScratch": tables.SCRATCH, "kPeerSlots": tables.PEER_SLOTS}
    values |= {"kInputSlot": tables.SLOTS["i"], "kOutputSlot": tables.SLOTS["o"], "kScratchSlot": tables.SLOTS["s"]}
    lines = ["#include <type_traits>", '#include "contract.cuh"']
    lines += [
        f"static_assert(weft::{name} == {value}, {name!r:s});".replace("'", '"') for name, value in values.items()
    ]
    lines += [f"static_assert(sizeof(weft::Op) == {tables.OP_DTYPE.itemsize});"]
    lines += ["void launch(WEFT_KERNEL_PARAMS);", "void interpreter(WEFT_KERNEL_PARAMS WEFT_TRACE_PARAM) {"]
    params = (*tables.KERNEL_PARAMS, tables.TRACE_PARAM)
    lines += [f"  static_assert(std::is_same_v<decltype({name}), {ctype}>);" for name, ctype in params[:-1]]
    lines += ["#ifdef WEFT_TRACE", f"  static_assert(std::is_same_v<decltype({params[-1][0]}), {params[-1][1]}>);"]
    lines += ["#endif", "  launch(WEFT_KERNEL_ARGS);", "}"]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(COMPILER is None, reason="no host C++ compiler (c++, g++ or clang++) on PATH")
@pytest.mark.parametrize("flags", [(), ("-include", "cstddef"), ("-DWEFT_TRACE", "-include", "cstddef")])
def test_the_header_compiles_and_holds_the_tables_values_and_layout(tmp_path, flags):
    """Without <cstddef> as NVRTC sees it (sizes only), with it as nvcc does (every field's offset too), and the
    -DWEFT_TRACE build's parameters."""
    unit = tmp_path / "check.cpp"
    unit.write_text(_check_unit(), encoding="utf-8")
    command = [str(COMPILER), "-std=c++17", "-fsyntax-only", *flags, f"-I{CUDA}", "-x", "c++", str(unit)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(COMPILER is None, reason="no host C++ compiler (c++, g++ or clang++) on PATH")
def test_a_layout_that_drifts_from_numpys_fails_to_compile(tmp_path):
    header = contract.emit().replace("int plan_op; ", "i64 plan_op; ")  # 8 bytes where numpy has 4
    (tmp_path / "contract.cuh").write_text(header, encoding="utf-8")
    (tmp_path / "check.cpp").write_text('#include <cstddef>\n#include "contract.cuh"\n', encoding="utf-8")
    done = subprocess.run(
        [str(COMPILER), "-std=c++17", "-fsyntax-only", f"-I{tmp_path}", str(tmp_path / "check.cpp")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "Op.line_chunk at byte 28" in done.stderr


def test_the_cuda_sources_keep_no_copy_of_the_contract():
    defined = re.compile(
        r"\b(kMaxRefs|kMaxChannels|kMaxSlots|kNormRows|kNormPrefetch|kNormSlice|kNop|kPacket|kOk)\s*=|"
        r"struct (Op|Ref) \{|enum (OpType|ErrorKind|RefFlags)\b|typedef .* (u32|u64|i64);|#define WEFT_TRACE_PARAM"
    )
    assert "contract.cuh" in build.SOURCES and '#include "contract.cuh"' in (CUDA / "common.cuh").read_text()
    copies = {name: defined.findall((CUDA / name).read_text()) for name in build.SOURCES if name != "contract.cuh"}
    assert {name: found for name, found in copies.items() if found} == {}
