"""Plans compiled to kernels (executor.gpu.compiled): the generated ops are the tables' ops, block for block; what the
generator refuses; the cache key; and (slow, nvcc) the generated source compiles for sm_90."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.errors import ExecutorError
from executor.gpu.compiled import build, source
from executor.gpu.tables import (
    FLUSH,
    LAMPORT,
    LAMPORT_RESET,
    NOP,
    NORM_ROWS,
    OP_DTYPE,
    PACKET,
    SCRATCH,
    SIGNAL,
    TRANSFER,
    build_tables,
    lines_possible,
)
from schedules.plan import load_plan

PLANS = sorted(Path("tests/gpu/plans").glob("*.json")) + sorted(Path("tests/gpu/plans4").glob("*.json"))
DTYPES = ("fp32", "fp16", "bf16")


def _tables(path: Path, rank: int = 0, dtype: str = "bf16"):
    plan = load_plan(path)
    return build_tables(plan, rank, plan.granule * 4, dtype=dtype)


def test_every_block_runs_the_tables_ops_on_every_rank_of_every_gpu_plan():
    for path in PLANS:
        plan = load_plan(path)
        for rank in range(plan.nranks):
            t = build_tables(plan, rank, plan.granule * 4)
            classes = source.block_classes(t)
            assert sorted(b for c in classes for b in c.blocks) == list(range(t.nthreadblocks)), path
            for c in classes:
                for b in c.blocks:
                    want = t.ops[t.tb_start[b] : t.tb_start[b + 1]]
                    assert c.records(b).tobytes() == want.tobytes(), (path.name, rank, b)
                    assert c.start + c.start_step * ((b - c.first) // c.stride) == t.tb_start[b]


def test_instances_share_one_class_with_offsets_moving_along_it():
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x8.json"))
    classes = source.block_classes(t)
    assert [(c.first, c.stride, c.count) for c in classes] == [(0, 2, 8), (1, 2, 8)]  # senders, receivers
    structural = classes[0].delta[:, source.STRUCTURAL]
    assert not structural.any()  # kinds, counts, slots and flags are the same code for every block of a class
    assert classes[0].delta.any()  # the offsets move


def test_the_source_names_each_op_as_a_constant_and_no_table():
    t = _tables(Path("tests/gpu/plans/allreduce-twoshot-simple-x8.json"))
    code = source.generate(t, "bf16", t.vector_bytes, "test", "h").code
    ops = code.count("step(weft::KindOf<") + code.count("step.unsynced(weft::KindOf<")
    assert ops == sum(len(c.base) for c in source.block_classes(t)) + 1  # + the tripwire
    assert "c.ops" not in code and "tb_start" not in code


def test_a_block_without_ops_compiles_to_an_empty_run():
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    empty_first = replace(t, tb_start=np.concatenate([[0], t.tb_start]).astype(np.int32))
    classes = source.block_classes(empty_first)
    assert classes[0].first == 0 and len(classes[0].base) == 0
    assert "return true;" in source.generate(empty_first, "bf16", 16, "test", "h").plan_struct


def test_padding_nops_compile_to_nothing():
    from codegen.rows import own_rows
    from executor.reference.norm import RowNorm

    ll = load_plan(Path("tests/gpu/plans/allreduce-direct-ll-x8.json"))
    t = build_tables(own_rows(ll, 2), 0, 8192, residual=True, norm=RowNorm(2048, 1e-6))
    nops = int((t.ops["type"] == NOP).sum())
    assert nops > 0  # the norm pads every block to one op count
    code = source.generate(t, "bf16", t.vector_bytes, "test", "h").plan_struct
    classes = source.block_classes(t)
    kept = sum(int((c.base[:, 0] != NOP).sum()) for c in classes)
    assert kept < sum(len(c.base) for c in classes)  # some class holds padding
    assert code.count("step(") + code.count("step.unsynced(") == kept + 1  # + the tripwire
    assert "KindOf<0," not in code  # no nop


def _op(kind: int, src=(), dst=(), nbytes: int = 64, **fields) -> np.ndarray:
    """One op record: ``src`` and ``dst`` as (slot, offset, flags)."""
    rec = np.zeros((), OP_DTYPE)
    rec["type"], rec["bytes"], rec["nsrc"], rec["ndst"] = kind, nbytes, len(src), len(dst)
    for field, refs in (("src", src), ("dst", dst)):
        for k, (slot, offset, flags) in enumerate(refs):
            rec[field][k] = (offset, slot, flags)
    for name, value in fields.items():
        rec[name] = value
    return rec


def _after(tables, *ops: np.ndarray, moved: tuple[np.ndarray, ...] | None = None) -> list[bool]:
    records = np.stack(ops)
    return source.barriers(records, records if moved is None else np.stack(moved), tables)


def test_a_barrier_follows_an_op_only_where_the_next_may_touch_what_it_touched():
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))  # out of place: input and output never overlap
    put = _op(TRANSFER, src=[(0, 0, 0)], dst=[(3, 0, PACKET)])
    reduce = _op(TRANSFER, src=[(0, 0, 0), (2, 0, PACKET)], dst=[(1, 0, 0)])
    forward = _op(TRANSFER, src=[(1, 0, 0)], dst=[(3, 128, PACKET)])  # reads what the reduction wrote
    elsewhere = _op(TRANSFER, src=[(1, 64, 0)], dst=[(1, 128, 0)])  # output bytes the reduction did not write
    assert _after(t, put, reduce) == [False, False]  # the put reads the input; no one writes it
    assert _after(t, reduce, forward) == [True, False]  # read after write, by other threads
    assert _after(t, reduce, elsewhere) == [False, False]
    assert _after(t, put, put) == [True, False]  # two packet writes to one peer's buffer: taken as one place
    # in place, the input is the output: the put's reads meet the reduction's writes
    assert _after(replace(t, inplace=True), put, reduce) == [True, False]
    # ranges that move apart along a class (another step a block) are taken as overlapping
    shifted = _op(TRANSFER, src=[(1, 64, 0)], dst=[(1, 192, 0)])
    assert _after(t, reduce, elsewhere, moved=(reduce, shifted)) == [True, False]


def test_control_ops_and_the_norm_keep_a_barrier_on_both_sides():
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    put = _op(TRANSFER, src=[(0, 0, 0)], dst=[(3, 0, PACKET)])
    flush, signal = _op(FLUSH), _op(SIGNAL, nchannel=1)
    assert _after(t, put, flush, signal, put) == [False, True, True, False]
    assert _after(t, put, _op(NOP), _op(NORM_ROWS), put) == [True, False, True, False]  # a nop is no op


def test_a_lamport_reset_of_a_later_copy_needs_no_barrier():
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    reset = _op(LAMPORT_RESET, dst=[(2, 0, SCRATCH)], barrier_id=2, barrier_count=3)
    poll = _op(TRANSFER, src=[(0, 0, 0), (2, 0, LAMPORT | SCRATCH)], dst=[(1, 0, 0)])
    assert _after(t, reset, poll) == [False, False]
    same_copy = _op(LAMPORT_RESET, dst=[(2, 0, SCRATCH)], barrier_id=3, barrier_count=3)  # 3 ahead of 3 copies
    assert _after(t, same_copy, poll) == [True, False]


def test_the_lamport_one_shots_run_without_a_barrier_and_the_two_shots_keep_theirs_around_semaphores():
    """The kernels the 4-GPU registry runs fastest at 16-256 KB: their ops share no memory, so no thread waits for
    another between them; a two-shot's semaphores still have the block's barrier before and after."""
    from topologies.catalog import build as topology
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    four = topology("hgx_h200:gpus=4")
    oneshot = compile_and_verify(
        synthesize(four, "allreduce", "direct"), four, 8, protocol="lamport", threads=512, multipeer=True
    )
    code = source.generate(build_tables(oneshot, 0, 65536), "bf16", 16, "one-shot", "h").plan_struct
    run = code.split("static bool tripwire")[0]
    assert "step(weft" not in run and run.count("step.unsynced(") == 3  # put, reset, reduce
    twoshot = compile_and_verify(synthesize(four, "allreduce", "twoshot"), four, 16, protocol="lamport", threads=512)
    t = build_tables(twoshot, 0, 1 << 20)
    for c in source.block_classes(t):
        records = c.records(c.first)
        kept = [r for r in records if int(r["type"]) != NOP]
        after = [a for a, r in zip(source.barriers(records, records, t), records, strict=True) if int(r["type"]) != NOP]
        for k, r in enumerate(kept):
            if int(r["type"]) not in source.DATA_OPS:
                assert (k == 0 or after[k - 1]) and (k == len(kept) - 1 or after[k]), (c.first, k)


def test_too_many_distinct_ops_are_refused_with_a_reason(monkeypatch):
    t = _tables(Path("tests/gpu/plans4/allreduce-ring-simple-x1.json"))
    monkeypatch.setattr(source, "MAX_EMITTED_OPS", 4)
    why = source.refusal(t, "bf16", t.vector_bytes)
    assert "distinct ops" in why and "holds 4" in why
    with pytest.raises(ExecutorError, match="not compiled: its blocks hold"):
        source.generate(t, "bf16", t.vector_bytes, "plan x", "h")


def test_an_unknown_dtype_or_width_is_refused():
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    assert "dtype" in source.refusal(t, "fp8", 16)
    assert "vector width" in source.refusal(t, "bf16", 2)
    assert source.refusal(t, "bf16", t.vector_bytes) == ""


def test_the_cache_key_follows_the_ops_the_headers_and_the_dtype():
    path = Path("tests/gpu/plans/allreduce-direct-ll-x8.json")
    plan = load_plan(path)
    small, large = (build_tables(plan, 0, plan.granule * k) for k in (4, 8))
    key = source.generate(small, "bf16", 16, "a", "h1").key
    assert source.generate(small, "bf16", 16, "another label", "h1").key == key  # the label is a comment only
    assert source.generate(large, "bf16", 16, "a", "h1").key != key  # other offsets: other constants
    assert source.generate(small, "bf16", 16, "a", "h2").key != key  # a header changed
    assert source.generate(small, "fp16", 16, "a", "h1").key != key
    # rank 1 of this symmetric plan runs the same ops with the same slots: one kernel serves both ranks
    assert source.generate(build_tables(plan, 1, plan.granule * 4), "bf16", 16, "a", "h1").key == key


def test_a_late_trigger_kernel_defines_it_and_is_cached_apart():
    """``late_trigger`` (the next programmatic launch starts at the kernel's end): the source defines
    WEFT_LATE_TRIGGER before the header, and its key and entry differ from the default kernel's, whose source is
    unchanged."""
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x8.json"))
    plain, late = (source.generate(t, "bf16", 16, "a", "h1", late_trigger=flag) for flag in (False, True))
    assert "WEFT_LATE_TRIGGER" not in plain.code and late.key != plain.key and late.entry != plain.entry
    lines = late.code.splitlines()
    assert lines.index("#define WEFT_LATE_TRIGGER 1") < lines.index('#include "compiled.cuh"')
    assert late.code.replace("#define WEFT_LATE_TRIGGER 1\n", "").replace(late.key, plain.key) == plain.code


def test_the_headers_hash_covers_the_compiled_kernels_header():
    assert "compiled.cuh" in build.HEADERS and "ops.cuh" in build.HEADERS
    assert len(build.headers_hash()) == 16


def test_the_flattened_record_round_trips():
    t = _tables(Path("tests/gpu/plans/allreduce-twoshot-ll-x8.json"))
    flat = source._flatten(t.ops)
    assert flat.shape == (len(t.ops), len(source.LEAVES))
    assert np.array_equal(source._unflatten(flat), t.ops)


def _stack_frames(report: str) -> dict[str, int]:
    """Each entry's stack frame bytes from ptxas's --resource-usage report."""
    found = re.findall(r"Function properties for (\w+)\s+(\d+) bytes stack frame", report)
    return {name: int(nbytes) for name, nbytes in found}


def _compile_together(sources: list[source.CompiledSource], tmp_path: Path, jobs: int = 1) -> str:
    """Builds the sources for sm_90 in `jobs` translation units, one nvcc process each, side by side (the whole set
    in one unit takes minutes of one core); returns nvcc's resource report over all of them."""
    unique = sorted({s.entry: s.code for s in sources}.items())  # plans with the same ops share one kernel
    chunks = [dict(unique[k::jobs]) for k in range(jobs) if unique[k::jobs]]

    def build_one(k: int) -> tuple[str, bytes]:
        unit, cubin = tmp_path / f"plans{k}.cu", tmp_path / f"plans{k}.cubin"
        unit.write_text("\n".join(chunks[k].values()))
        done = subprocess.run(
            [*build.nvcc_command(unit, "sm_90", cubin), "--resource-usage"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout + done.stderr, cubin.read_bytes()

    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        built = list(pool.map(build_one, range(len(chunks))))
    image = b"".join(cubin for _, cubin in built)
    for s in sources:
        assert s.entry.encode() in image
    return "".join(report for report, _ in built)


def _sources(paths: list[Path], dtypes: tuple[str, ...]) -> list[source.CompiledSource]:
    out = []
    for path in paths:
        for dtype in dtypes:
            t = _tables(path, dtype=dtype)
            out.append(source.generate(t, dtype, t.vector_bytes, path.name, build.headers_hash()))
    return out


nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.mark.slow
@nvcc
def test_compiled_kernels_build_for_sm90_with_their_ops_in_registers(tmp_path):
    """A handful of plans in every dtype (one with multi-peer pairs, walked from a per-warp turn), and the launch
    variants (LL128 lines, a residual, the RMSNorm epilogue, a Lamport plan, a Lamport plan with both, a 4-rank
    Lamport one-shot in batch mode, a 4-rank Lamport two-shot of 512 threads), in one nvcc call: each builds, and
    keeps no op in local memory."""
    from codegen.rows import own_rows
    from executor.reference.norm import RowNorm
    from topologies.catalog import build as topology
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    picks = [
        Path("tests/gpu/plans/allreduce-direct-ll-x8.json"),
        Path("tests/gpu/plans/allreduce-twoshot-simple-x8.json"),
    ]
    ll = load_plan(picks[0])
    h200 = topology("hgx_h200:gpus=2")
    lamport = compile_and_verify(synthesize(h200, "allreduce", "direct"), h200, protocol="lamport")
    four = topology("hgx_h200:gpus=4")
    # a 4-rank multi-peer one-shot in blocks of 256 threads: the batch kernel, its three peers' units fetched
    # together before any is polled again (channel.cuh), which must still fit the batch kernel's registers
    batch = compile_and_verify(
        synthesize(four, "allreduce", "direct"), four, 8, protocol="lamport", threads=256, multipeer=True
    )
    # a 4-rank Lamport two-shot in blocks of 512 threads: the 1024-thread bounds' 64 registers, three polled peers
    twoshot = compile_and_verify(synthesize(four, "allreduce", "twoshot"), four, 16, protocol="lamport", threads=512)
    variants = [
        build_tables(ll, 0, ll.granule * 64, lines=True),
        build_tables(ll, 0, ll.granule * 64, residual=True),
        build_tables(own_rows(ll, 2), 0, 8192, residual=True, norm=RowNorm(2048, 1e-6)),
        build_tables(lamport, 0, 65536),
        build_tables(lamport, 0, 65536, residual=True, norm=RowNorm(2048, 1e-6)),  # the fused call on Lamport
        build_tables(batch, 0, 65536),
        build_tables(twoshot, 0, 1 << 20),
    ]
    plain = _sources(picks[1:], ("bf16",)) + _sources(picks[:1], DTYPES)
    plain += [source.generate(t, "bf16", t.vector_bytes, "variant", build.headers_hash()) for t in variants]
    plain.append(source.generate(variants[2], "bf16", 16, "late trigger", build.headers_hash(), late_trigger=True))
    plain += _sources([Path("tests/gpu/plans4/allreduce-twoshot-simple-x8-2s-mp.json")], ("bf16",))
    frames = _stack_frames(_compile_together(plain, tmp_path))
    assert {s.entry: frames[s.entry] for s in plain} == {s.entry: 0 for s in plain}


@pytest.mark.gpu
@pytest.mark.slow
@nvcc
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="the whole set (minutes of nvcc) builds on GPU machines")
def test_every_gpu_test_plan_compiles_for_sm90_in_every_dtype(tmp_path):
    report = _compile_together(_sources(PLANS, DTYPES), tmp_path, jobs=min(16, os.cpu_count() or 1))
    assert "spill stores" in report


def test_every_op_of_a_compiled_plan_carries_the_plans_bound_on_its_references():
    """``refs_bound``: the most sources, destinations or channels of any op (the tripwire's included), handed to every
    op as KindOf's second argument, so that the kernel's loops over references unroll no further than a plan needs."""
    for path in PLANS:
        t = _tables(path)
        bound = source.refs_bound(t)
        assert bound == max(1, int(t.ops["nsrc"].max()), int(t.ops["ndst"].max()), int(t.ops["nchannel"].max()))
        assert 1 <= bound <= 16
        kinds = re.findall(r"KindOf<(\d+), (\d+)>", source.generate(t, "bf16", t.vector_bytes, path.name, "h").code)
        assert kinds and {int(refs) for _, refs in kinds} == {bound}, path
    four = _tables(Path("tests/gpu/plans4/allreduce-twoshot-simple-x8.json"))
    assert source.refs_bound(four) < 16  # a 4-rank plan's loops unroll a few times, not 16


MEMORY_OPS = re.compile(r"^\s*(?:@%p\d+\s+)?((?:ld|st|atom|red|fence|membar|bar|cp)\.[\w.]+)", re.M)


def _ptx(code: str, path: Path) -> str:
    path.write_text(code)
    ptx = path.with_suffix(".ptx")
    command = build.nvcc_command(path, "sm_90", ptx)
    command[command.index("-cubin")] = "-ptx"
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return ptx.read_text()


@pytest.mark.slow
@nvcc
def test_unrolling_to_the_plans_bound_builds_the_memory_traffic_of_unrolling_to_16(tmp_path):
    """The bound changes how far the loops over an op's references unroll, not what the kernel does: with it and
    with every Op's 16 (the form before it), the kernel issues the same loads, stores, atomics and fences, none in
    local memory. A bound below some op's count would drop that op's last references (a test of refs_bound)."""
    from topologies.catalog import build as topology
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    four = topology("hgx_h200:gpus=4")
    twoshot = compile_and_verify(synthesize(four, "allreduce", "twoshot"), four, 16, protocol="lamport", threads=512)
    ll = load_plan(Path("tests/gpu/plans4/allgather-direct-ll-x1.json"))
    cases = {
        "ll-lines": build_tables(ll, 3, ll.granule * 16, lines=True),
        "lamport-twoshot": build_tables(twoshot, 0, 1 << 20),
        "semaphores": _tables(Path("tests/gpu/plans4/allreduce-twoshot-simple-x8-2s-mp.json")),
    }
    for name, t in cases.items():
        code = source.generate(t, "bf16", t.vector_bytes, name, "h").code
        sixteen = re.sub(r"KindOf<(\d+), \d+>", r"KindOf<\1, 16>", code)
        assert sixteen != code
        bounded, unbounded = _ptx(code, tmp_path / f"{name}.cu"), _ptx(sixteen, tmp_path / f"{name}-16.cu")
        assert sorted(MEMORY_OPS.findall(bounded)) == sorted(MEMORY_OPS.findall(unbounded)), name
        assert ".local" not in bounded, name


HOST = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
HOST_PLANS = (
    Path("tests/gpu/plans/allreduce-direct-ll-x8.json"),
    Path("tests/gpu/plans4/allreduce-twoshot-simple-x8.json"),
    Path("tests/gpu/plans4/allgather-direct-simple-x4-mp.json"),
)
HARNESS = """
#include <cstdio>
#include <cstdlib>
#define __device__
#define __forceinline__
#include "contract.cuh"
namespace weft {
template <int K, int R>
struct KindOf {
  static constexpr int value = K;
  static constexpr int refs = R;
};
}  // namespace weft
%(structs)s
// Writes every block's ops as the struct emits them (the bytes of each weft::Op), then whether each block takes its
// own range and refuses a disarmed record's.
struct Dump {  // the kernel's Step, writing each op where the kernel runs it (with or without the barrier after)
  template <class Kind>
  bool operator()(Kind, const weft::Op& op) {
    if (Kind::value != op.type) std::abort();
    std::fwrite(&op, sizeof op, 1, stdout);
    return true;
  }
  template <class Kind>
  bool unsynced(Kind kind, const weft::Op& op) {
    return (*this)(kind, op);
  }
};
template <class Plan>
void dump(int blocks, const int* starts, int tripwire_index) {
  Dump step;
  for (int b = 0; b < blocks; ++b) {
    if (!Plan::run(b, step)) std::abort();
  }
  for (int b = 0; b < blocks; ++b) {
    const int own = Plan::expects(b, starts[b], starts[b + 1]) ? 1 : 0;
    const int disarmed = b == 0 ? tripwire_index : tripwire_index + 1;
    const int refused = Plan::expects(b, disarmed, b == 0 ? disarmed + 1 : disarmed) ? 0 : 1;
    std::fwrite(&own, sizeof own, 1, stdout);
    std::fwrite(&refused, sizeof refused, 1, stdout);
  }
}
int main(int argc, char** argv) {
  const int which = std::atoi(argv[1]);
%(calls)s
  return 0;
}
"""


@pytest.mark.skipif(HOST is None, reason="no host C++ compiler (c++, g++ or clang++) on PATH")
def test_the_emitted_source_holds_the_tables_ops_byte_for_byte(tmp_path):
    """The generated ``Plan`` types, compiled by the host's C++ compiler against contract.cuh: each block's ops as
    constructed from the emitted text are the tables' records, byte for byte, and each block takes its own range
    and refuses a disarmed graph record's."""
    from executor.gpu.build import source_dir

    tables = [_tables(p, rank=1) for p in HOST_PLANS]
    generated = [source.generate(t, "bf16", t.vector_bytes, "test", "h") for t in tables]
    structs, calls = [], []
    for k, (t, g) in enumerate(zip(tables, generated, strict=True)):
        structs.append(f"namespace p{k} {{\n{g.plan_struct}}}  // namespace p{k}")
        starts = ", ".join(map(str, t.tb_start.tolist()))
        calls.append(
            f"  if (which == {k}) {{\n    static const int s[] = {{{starts}}};\n"
            f"    dump<p{k}::Plan>({t.nthreadblocks}, s, {len(t.ops)});\n  }}"
        )
    unit = tmp_path / "plans.cpp"
    unit.write_text(HARNESS % {"structs": "\n".join(structs), "calls": "\n".join(calls)})
    binary = tmp_path / "plans"
    done = subprocess.run(
        [str(HOST), "-std=c++17", "-O0", f"-I{source_dir()}", "-o", str(binary), str(unit)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for k, t in enumerate(tables):
        out = subprocess.run([str(binary), str(k)], capture_output=True, check=True).stdout
        ops = t.ops[t.ops["type"] != NOP].tobytes()  # nops (padding) compile to nothing
        assert out[: len(ops)] == ops, HOST_PLANS[k].name
        checks = np.frombuffer(out[len(ops) :], np.int32).reshape(t.nthreadblocks, 2)
        assert checks.all(), (HOST_PLANS[k].name, checks.tolist())


def test_a_built_kernel_is_cached_by_its_key_and_rebuilt_where_its_hash_fails(tmp_path, monkeypatch):
    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    generated = source.generate(t, "bf16", t.vector_bytes, "test", build.headers_hash())
    builds = []
    monkeypatch.setattr(build, "nvrtc_cubin", lambda s, arch, trace=False: builds.append(s.entry) or b"cubin-bytes")
    cache = tmp_path / "kernels"
    path = build.cached_cubin_path(generated, "sm_90", directory=cache)
    assert path.read_bytes() == b"cubin-bytes" and generated.key in path.name
    assert cache.stat().st_mode & 0o777 == 0o700
    assert build.cached_cubin_path(generated, "sm_90", directory=cache) == path and len(builds) == 1
    path.write_bytes(b"tampered")  # its stored hash no longer matches: built again, never loaded
    build.cached_cubin_path(generated, "sm_90", directory=cache)
    assert len(builds) == 2 and path.read_bytes() == b"cubin-bytes"
    assert build.cached_cubin_path(generated, "sm_90", trace=True, directory=cache) != path  # the timed build


def test_weft_run_says_which_kernel_ran():
    from types import SimpleNamespace

    from weft.cli.gpu import _kernel_words

    plan = load_plan(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    assert _kernel_words(SimpleNamespace(compiled_refused={}), plan) == "; compiled kernel"
    refused = SimpleNamespace(compiled_refused={plan.content_hash: "too many ops"})
    assert _kernel_words(refused, plan) == "; interpreted (too many ops)"
    assert "port engine" in _kernel_words(SimpleNamespace(), plan)


def _bare_engine(gathered: list[str]):
    """An InterpreterEngine with only what ``_compile`` reads; ``gathered``: every rank's say in the agreement."""
    import contextlib
    from types import SimpleNamespace

    from executor.gpu.engine import InterpreterEngine

    engine: Any = object.__new__(InterpreterEngine)
    engine.rank, engine.device, engine._cc, engine._trace, engine.compiled_refused = 0, 0, "90", False, {}
    engine._late_trigger = False
    engine._cupy = SimpleNamespace(cuda=SimpleNamespace(Device=lambda device: contextlib.nullcontext()))
    engine._all_gather = lambda what, value: [value, *gathered]
    return engine


def _context(plan_hash: str):
    from types import SimpleNamespace

    t = _tables(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    return SimpleNamespace(tables=t, vector_bytes=16, nbytes=1024, plan_hash=plan_hash, compiled=None, compiled_why="")


def test_a_kernel_refused_on_any_rank_runs_the_interpreter_on_every_rank(monkeypatch):
    from executor.gpu import compiled

    plan = load_plan(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    monkeypatch.setattr(compiled, "kernel_for", lambda *args: "kernel")
    ctx = _context("h")
    _bare_engine(["rank 1: NVRTC failed"])._compile(ctx, "bf16", plan)  # built here, refused on rank 1
    assert ctx.compiled is None and ctx.compiled_why == "rank 1: NVRTC failed"
    ctx = _context("h")
    engine = _bare_engine([""])
    engine._compile(ctx, "bf16", plan)
    assert ctx.compiled == "kernel" and engine.compiled_refused == {}


def test_a_build_error_is_a_reason_not_a_crash(monkeypatch):
    from executor.gpu import compiled

    def broken(*args):
        raise RuntimeError("CUDA_ERROR_INVALID_IMAGE\nmore")

    plan = load_plan(Path("tests/gpu/plans/allreduce-direct-ll-x1.json"))
    monkeypatch.setattr(compiled, "kernel_for", broken)
    ctx, engine = _context("h"), _bare_engine([""])
    engine._compile(ctx, "bf16", plan)
    assert ctx.compiled is None and engine.compiled_refused["h"].endswith("RuntimeError: CUDA_ERROR_INVALID_IMAGE")


def _nvrtc_missing() -> str:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # no CuPy, or CuPy without the NVRTC library
        return f"needs CuPy's NVRTC: {type(e).__name__}"
    return ""


@pytest.mark.gpu
@pytest.mark.skipif(bool(_nvrtc_missing()), reason=_nvrtc_missing() or "NVRTC")
def test_prebuild_builds_each_missing_kernel_once_side_by_side_and_names_the_refused(tmp_path, monkeypatch):
    good = _sources(PLANS[:2], ("bf16",))
    broken = replace(good[0], entry="weft_compiled_broken", code=good[0].code + "\nthis is not CUDA;\n")
    refused = build.prebuild([*good, good[0], broken], "sm_90", threads=2, directory=tmp_path)
    assert list(refused) == ["weft_compiled_broken"] and "NVRTC failed for sm_90" in refused["weft_compiled_broken"]
    cubins = sorted(p.name for p in tmp_path.rglob("*.cubin"))
    assert cubins == sorted(f"{s.entry}-sm_90.cubin" for s in good)

    def no_build(source, arch, trace=False):
        raise AssertionError(f"{source.entry} was built again")

    monkeypatch.setattr(build, "nvrtc_cubin", no_build)  # a second prebuild finds every kernel in the cache
    assert build.prebuild(good, "sm_90", threads=2, directory=tmp_path) == {}


def test_precompile_builds_the_sources_a_compiled_call_would_launch_and_names_what_it_cannot(monkeypatch):
    from executor.gpu.engine import InterpreterEngine

    engine = object.__new__(InterpreterEngine)  # the fields precompile reads; no GPU
    engine.rank, engine.world_size, engine._cc, engine._trace, engine._late_trigger = 1, 2, "90", False, False
    engine._ll128 = False
    built: list[tuple[list[str], str]] = []

    def prebuild(sources, arch, threads=None, trace=False, directory=None):
        built.append(([s.entry for s in sources], arch))
        return {sources[-1].entry: "NVRTC said no"}

    monkeypatch.setattr(build, "prebuild", prebuild)
    plans = [load_plan(p) for p in PLANS[:2]]
    four = load_plan(Path("tests/gpu/plans4/allreduce-twoshot-simple-x8.json"))  # 4 ranks: not this job's
    calls = [(plans[0], plans[0].granule * 4, "bf16"), (plans[1], plans[1].granule * 8, "fp32"), (four, 4096, "bf16")]
    refused = engine.precompile(calls)

    headers = build.headers_hash()
    expected = []
    for p, n, d in calls[:2]:
        t = build_tables(p, 1, n, dtype=d)
        expected.append(source.generate(t, d, t.vector_bytes, "", headers).entry)
    assert built == [(expected, "sm_90")]  # the cache keys of the lazy path (kernel_for on the same tables)
    assert refused[f"plan {plans[1].name}: rank 1: {plans[1].granule * 8} B fp32"] == "NVRTC said no"
    (why,) = [w for k, w in refused.items() if k.startswith(f"plan {four.name}:")]
    assert why.endswith("written for 4 ranks, but the communicator has 2") and len(refused) == 2


def test_precompile_with_lines_builds_an_ll_plans_lines_kernel_beside_the_plain_one(monkeypatch):
    """With LL128 lines (the engine's ``ll128``, or ``lines=True``), an LL call's kernel with its packets as lines is
    what the call launches: precompile builds it too (the plain one stays, the fallback of an unaligned buffer), and
    nothing more for a plan whose size takes no lines or that moves no packets."""
    from executor.gpu.engine import InterpreterEngine

    engine = object.__new__(InterpreterEngine)
    engine.rank, engine.world_size, engine._cc, engine._trace, engine._late_trigger = 0, 2, "90", False, False
    engine._ll128 = True
    built: list[list[str]] = []

    def prebuild(sources, arch, threads=None, trace=False, directory=None):
        built.append([s.entry for s in sources])
        return {sources[1].entry: "NVRTC said no"}

    monkeypatch.setattr(build, "prebuild", prebuild)
    ll = load_plan(Path("tests/gpu/plans/allgather-direct-ll-x8.json"))
    simple = load_plan(Path("tests/gpu/plans/allgather-direct-simple-x16.json"))
    nbytes = 1 << 20
    assert lines_possible(ll, nbytes) and not lines_possible(simple, nbytes)
    calls = [(ll, nbytes, "bf16"), (simple, nbytes, "bf16")]
    headers = build.headers_hash()

    def entry(plan, lines: bool) -> str:
        t = build_tables(plan, 0, nbytes, lines=lines, dtype="bf16")
        return source.generate(t, "bf16", t.vector_bytes, "", headers).entry

    refused = engine.precompile(calls)
    assert built[-1] == [entry(ll, False), entry(ll, True), entry(simple, False)]
    assert entry(ll, True) != entry(ll, False)
    assert refused == {f"plan {ll.name}: rank 0: {nbytes} B bf16 (LL128 lines)": "NVRTC said no"}
    engine.precompile(calls, lines=False)  # a call's choice over the engine's
    assert built[-1] == [entry(ll, False), entry(simple, False)]


def test_a_call_whose_output_overlaps_its_input_runs_the_interpreter():
    """A compiled kernel takes an out-of-place plan's input and output as apart (``source.barriers``): a call that
    passes them overlapping (torch's in-place all-gather, a view of the output as the input) runs the interpreter."""
    from executor.gpu.engine import _Buffer, overlapping

    plan = load_plan(Path("tests/gpu/plans/allgather-direct-ll-x1.json"))
    assert not plan.inplace

    def at(pointer: int, nbytes: int) -> _Buffer:
        return _Buffer(pointer, nbytes, "fp32", 0, "torch")

    assert overlapping(plan, at(0x1000, 256), at(0x1000, 512))  # the input is the output's first half
    assert overlapping(plan, at(0x10FF, 1), at(0x1000, 256))
    assert not overlapping(plan, at(0x1100, 256), at(0x1000, 256))  # adjacent
    assert not overlapping(plan, at(0x1000, 256), None)


_SLOTS = (0, 1, 2, 3, 4)  # input, output, scratch, two peers' buffers (tests/gpu/plans4 have three peers)
_FLAGS = (0, PACKET, LAMPORT | SCRATCH)
_REF = st.tuples(st.sampled_from(_SLOTS), st.sampled_from((0, 32, 64)), st.sampled_from(_FLAGS))  # slot, offset, flags


def _byte_sets(rec: np.ndarray, t) -> tuple[set, set]:
    """What one op reads and writes, byte by byte (a reference's memory as ``source`` names it; packets and other
    layouts as their whole memory)."""
    if int(rec["type"]) == LAMPORT_RESET and int(rec["barrier_id"]) % int(rec["barrier_count"]):
        return set(), set()

    def cells(field: str) -> set:
        out: set[tuple] = set()  # (memory, layout, byte), or (memory, "whole")
        for k in range(int(rec[f"n{field}"])):
            ref = rec[field][k]
            memory = source._memory(int(ref["buffer"]), t)
            flags, lo = int(ref["flags"]), int(ref["offset"])
            if flags in (0, LAMPORT | SCRATCH):
                out |= {(memory, flags != 0, b) for b in range(lo, lo + int(rec["bytes"]))}
            else:
                out.add((memory, "whole"))
        return out

    return cells("src"), cells("dst")


def _meet(a: set, b: set) -> bool:
    """Whether two byte sets may share a byte: one byte in both; a whole memory and anything of that memory; or two
    bytes of one memory in its two layouts (at their offsets alone, and in this execution's Lamport copy, which lies
    anywhere in it)."""
    if a & b:
        return True
    return any(x[0] == y[0] and ("whole" in (x[1], y[1]) or x[1] != y[1]) for x in a for y in b)


@pytest.mark.parametrize("inplace", [False, True])
@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from((TRANSFER, TRANSFER, TRANSFER, LAMPORT_RESET, SIGNAL, FLUSH)),
            st.lists(_REF, max_size=3),
            st.lists(_REF, max_size=2),
            st.sampled_from((0, 1, 2)),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_no_two_ops_between_barriers_share_a_byte_one_of_them_writes(ops, inplace):
    """Against a byte-by-byte reference: between two barriers no op writes a byte another op there reads or writes
    (the input and output apart in an out-of-place plan, one buffer in an in-place one), and a control op has a
    barrier on both sides."""
    t = replace(_tables(Path("tests/gpu/plans4/allreduce-direct-ll-x1.json")), inplace=inplace)
    records = np.stack(
        [
            _op(kind, src, dst, nbytes=32, barrier_id=ahead, barrier_count=3)
            if kind == LAMPORT_RESET
            else _op(kind, src if kind == TRANSFER else (), dst if kind == TRANSFER else (), nbytes=32)
            for kind, src, dst, ahead in ops
        ]
    )
    after = source.barriers(records, records, t)
    group: list[int] = []
    for i in range(len(records)):
        kind = int(records[i]["type"])
        if kind not in source.DATA_OPS:
            assert (i == 0 or after[i - 1]) and (i == len(records) - 1 or after[i])
        for j in group:
            (ri, wi), (rj, wj) = _byte_sets(records[i], t), _byte_sets(records[j], t)
            assert not (_meet(wi, rj | wj) or _meet(ri, wj)), (j, i)
        group = [] if after[i] else [*group, i]
