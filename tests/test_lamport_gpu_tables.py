"""The GPU interpreter's Lamport tables (executor.gpu.lamport, executor.gpu.tables): the opt-in, the rotating scratch,
the reset shares, the sentinel fill word, the fused call (the residual and the norm epilogue) run as the kernel runs
it, and that other protocols' tables are as they were. The kernel itself runs only in tests/gpu/test_lamport_gpu.py;
tests/test_cuda_compile.py builds it."""

from dataclasses import dataclass, replace

import numpy as np
import pytest

from codegen import compile_schedule
from executor.gpu import build, lamport
from executor.gpu.tables import (
    LAMPORT,
    LAMPORT_RESET,
    NORM_PREFETCH,
    NORM_ROWS,
    NORM_SLICE,
    PACKET,
    PAIRS,
    SCRATCH,
    SLOTS,
    TRANSFER,
    build_tables,
)
from executor.reference.norm import RowNorm, rms_norm
from executor.reference.prove import expected_outputs
from schedules.collectives import Collective
from schedules.lamport import SENTINEL_BITS, LamportBuffers
from synth.baselines import direct, twoshot
from topologies.catalog import build as build_topology


def _plan(baseline, n: int, protocol: str = "lamport"):
    return compile_schedule(
        baseline(build_topology(f"fully_connected:n={n}"), Collective("allreduce", n)), protocol=protocol
    )


def _refs(tables, field: str):
    return [op[field][k] for op in tables.ops for k in range(op["n" + field])]


def test_the_interpreter_takes_a_lamport_plan_with_no_opt_in():
    assert build_tables(_plan(direct, 2), 0, 1024).lamport_buffers == 3


@pytest.mark.parametrize("baseline", [direct, twoshot])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_lamport_tables_rotate_the_scratch_and_move_the_data_alone(baseline, dtype):
    plan = _plan(baseline, 4)
    nbytes = 64 << 10
    t = build_tables(plan, 1, nbytes, dtype=dtype)
    cb = plan.chunk_bytes(nbytes)
    assert t.scratch_bytes == max(g.scratch_chunks for g in plan.gpus) * cb  # 1x the data: no flag words
    assert (t.scratch_copies, t.scratch_stride, t.scratch_alloc) == (3, t.scratch_bytes, 3 * t.scratch_bytes)
    word = t.scratch_fill
    assert word == (SENTINEL_BITS["fp32"] if dtype == "fp32" else 0x80008000)
    transfers = [op for op in t.ops if op["type"] in (TRANSFER, PAIRS)]
    assert transfers and all(op["barrier_count"] == 3 for op in transfers)  # the kernel's copy count
    refs = _refs(t, "src") + _refs(t, "dst")
    scratch = [r for r in refs if r["buffer"] == SLOTS["s"] or r["flags"] & LAMPORT]
    assert not any(r["flags"] & PACKET for r in refs)  # no LL packets
    assert any(r["flags"] & LAMPORT for r in refs) and all(r["flags"] & SCRATCH for r in scratch)


def _polls(op) -> bool:
    return any(op["src"][k]["flags"] & LAMPORT for k in range(op["nsrc"]))


@pytest.mark.parametrize("baseline", [direct, twoshot])
def test_each_block_resets_right_before_its_first_poll_or_last(baseline):
    """The reset's stores issue while the block's puts fly and before it waits for its peers' data (the launch's
    end would otherwise wait for them); a block that polls nothing resets last."""
    t = build_tables(_plan(baseline, 4), 1, 1 << 16, dtype="bf16")
    for ops in [t.ops[t.tb_start[b] : t.tb_start[b + 1]] for b in range(t.nthreadblocks)]:
        kinds = [int(op["type"]) for op in ops]
        assert kinds.count(LAMPORT_RESET) == 1
        at = kinds.index(LAMPORT_RESET)
        polls = [k for k, op in enumerate(ops) if op["type"] != LAMPORT_RESET and _polls(op)]
        assert at == (polls[0] - 1 if polls else len(ops) - 1), kinds
        assert not any(_polls(op) for op in ops[:at])


def test_every_block_has_its_share_of_the_reset_and_the_shares_tile_its_copy():
    plan = _plan(direct, 4)
    nbytes = (1 << 20) + 48 * 4
    t = build_tables(plan, 2, nbytes, dtype="bf16")
    rotation = LamportBuffers()
    resets = []
    for b in range(t.nthreadblocks):
        ops = t.ops[t.tb_start[b] : t.tb_start[b + 1]]
        (last,) = [op for op in ops if op["type"] == LAMPORT_RESET]
        assert (last["barrier_id"], last["barrier_count"]) == (rotation.reset_ahead, rotation.buffers)
        assert last["dst"][0]["buffer"] == SLOTS["s"] and last["dst"][0]["flags"] == SCRATCH
        resets.append((int(last["dst"][0]["offset"]), int(last["bytes"])))
    assert sum(1 for op in t.ops if op["type"] == LAMPORT_RESET) == t.nthreadblocks
    own = plan.gpus[2].scratch_chunks * plan.chunk_bytes(nbytes)
    assert resets[0][0] == 0 and sum(b for _, b in resets) == own  # this rank's whole copy, once
    assert all(a + n == b for (a, n), (b, _) in zip(resets, resets[1:], strict=False))
    assert all(offset % t.vector_bytes == 0 and size % t.vector_bytes == 0 for offset, size in resets)


@pytest.mark.parametrize(("nbytes", "blocks"), [(0, 3), (16, 4), (1000, 3), (1 << 20, 7), (4100, 1)])
def test_reset_shares_tile_the_copy_in_whole_units(nbytes, blocks):
    shares = lamport.reset_shares(nbytes, blocks)
    assert len(shares) == blocks and sum(n for _, n in shares) == nbytes
    assert [first for first, _ in shares] == list(np.cumsum([0] + [n for _, n in shares[:-1]]))
    assert all(first % lamport.RESET_UNIT == 0 for first, _ in shares)
    assert max(n for _, n in shares) - min(n for _, n in shares[:-1] or shares) <= lamport.RESET_UNIT


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_the_fill_word_is_every_element_negative_zero(dtype):
    word = np.array([lamport.sentinel_word(dtype)], np.uint32)
    as_type = {"fp32": np.float32, "fp16": np.float16}.get(dtype)
    if as_type is None:  # bf16: the high halves of float32 words
        elements = (word.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        elements = word.view(as_type)
    assert (elements == 0).all() and np.signbit(elements).all()


@pytest.mark.parametrize("protocol", ["ll", "simple"])
def test_other_protocols_tables_hold_nothing_of_lamport(protocol):
    plan = _plan(twoshot, 2, protocol)
    t = build_tables(plan, 0, 64 << 10, dtype="bf16")
    assert (t.lamport_buffers, t.scratch_fill) == (0, 0)
    assert t.scratch_stride == (t.scratch_bytes if t.double_scratch else 0)  # the kernel's scratch_half, as before
    assert not any(op["type"] == LAMPORT_RESET for op in t.ops)
    assert not any(r["flags"] & LAMPORT for r in _refs(t, "src") + _refs(t, "dst"))


def test_a_lamport_plan_launches_the_lamport_twin_of_its_kernel():
    assert build.kernel_name("bf16", 16, 1024, lamport=True) == "weft_interpret_bf16_v16_lamport"
    assert build.kernel_name("fp16", 8, 256, lamport=True) == "weft_interpret_f16_v8_b256_lamport"
    assert build.kernel_name("fp32", 4) == "weft_interpret_f32_v4"


# --- the tables run as the kernel would run them ------------------------------------------------------------------


def _without_resets(ops: np.ndarray) -> np.ndarray:
    out = ops.copy()
    out["type"][out["type"] == LAMPORT_RESET] = 0
    return out


@dataclass(frozen=True)
class Fused:
    """The fused call's operands, alike on every rank: the residual (output-sized), the weight (one row), the rows."""

    residual: np.ndarray  # float32
    weight: np.ndarray  # float32
    norm: RowNorm


class _Kernel:
    """Every rank's fp32 tables run as the Lamport kernel runs them (executor/gpu/cuda/lamport.cuh): scratch filled
    with the sentinel, a transfer's Lamport sources polled until no word holds it, -0.0 mapped on a Lamport store,
    copy ``epoch % buffers``, each block's reset of its share of copy ``(epoch + reset_ahead) % buffers`` after its
    ops; signals, waits, semaphores and barriers as the kernel's counters (semaphore.cuh). A block is a generator
    that yields False while it waits and True after each op."""

    def __init__(self, plan, nbytes: int, drop_resets: bool = False, fused: Fused | None = None) -> None:
        self.sentinel = np.uint32(lamport.sentinel_word("fp32"))
        self.fused = fused
        norm = fused.norm if fused else None
        self.tables = [
            build_tables(plan, r, nbytes, dtype="fp32", residual=fused is not None, norm=norm)
            for r in range(plan.nranks)
        ]
        if drop_resets:  # every reset op a nop
            self.tables = [replace(t, ops=_without_resets(t.ops)) for t in self.tables]
        self.mem = [
            {
                "i": np.zeros(t.input_bytes // 4, np.uint32),
                "o": np.zeros(t.output_bytes // 4, np.uint32),
                "s": np.zeros(t.scratch_alloc // 4, np.uint32),  # as fill_scratch: zeros, then the copies' sentinel
            }
            for t in self.tables
        ]
        for t, mem in zip(self.tables, self.mem, strict=True):
            mem["s"][: t.scratch_bytes * t.lamport_buffers // 4] = self.sentinel
            if fused is not None:  # the residual, the weight and the normalized rows: the slots after the peers'
                mem["r"] = fused.residual.view(np.uint32).copy()
                mem["w"] = fused.weight.view(np.uint32).copy()
                mem["n"] = np.zeros(t.output_bytes // 4, np.uint32)
        self.inbound = [np.zeros(max(len(t.channel_peers), 1), np.int64) for t in self.tables]
        self.expected = [np.zeros(max(len(t.channel_peers), 1), np.int64) for t in self.tables]
        self.sems = [np.array([v for i in t.semaphore_init for v in (i, 0)] or [0], np.int64) for t in self.tables]
        self.barriers: list[dict[int, list[int]]] = [{} for _ in self.tables]

    def words(self, r: int, ref, shift: int, count: int) -> np.ndarray:
        slot, remote = int(ref["buffer"]), self.tables[r].remote_buffers
        if slot < 3 or slot >= 3 + len(remote):
            peer, btype = r, "ios"[slot] if slot < 3 else "rwn"[slot - 3 - len(remote)]
        else:
            peer, btype = remote[slot - 3]
        first = (int(ref["offset"]) + (shift if ref["flags"] & SCRATCH else 0)) // 4
        return self.mem[peer][btype][first : first + count]

    def block(self, r: int, b: int, epoch: int):
        t = self.tables[r]
        for op in t.ops[t.tb_start[b] : t.tb_start[b + 1]]:
            kind = int(op["type"])
            if kind in (TRANSFER, PAIRS):
                yield from self.transfer(r, op, epoch % int(op["barrier_count"]) * t.scratch_stride)
            elif kind == LAMPORT_RESET:
                shift = (epoch + int(op["barrier_id"])) % int(op["barrier_count"]) * t.scratch_stride
                self.words(r, op["dst"][0], shift, int(op["bytes"]) // 4)[:] = self.sentinel
            elif kind == NORM_ROWS:
                self.norm(r, op, int(op["barrier_id"]) // 4)
            elif kind == NORM_SLICE:
                yield from self.norm_slice(r, op, epoch)
            elif kind == NORM_PREFETCH:
                pass  # a cache hint
            else:
                yield from self.control(r, op)
            yield True

    def transfer(self, r: int, op, shift: int):
        count = int(op["bytes"]) // 4
        srcs = [self.words(r, op["src"][k], shift, count) for k in range(op["nsrc"])]
        polled = [s for k, s in enumerate(srcs) if op["src"][k]["flags"] & LAMPORT]
        while any((s == self.sentinel).any() for s in polled):
            yield False
        if op["type"] == PAIRS:
            moves = [(srcs[j].copy(), [j]) for j in range(op["ndst"])]
        else:
            total = srcs[0].view(np.float32).copy()
            for s in srcs[1:]:
                total = total + s.view(np.float32)
            moves = [(total.view(np.uint32), list(range(op["ndst"])))]
        for value, dsts in moves:
            for d in dsts:
                mapped = op["dst"][d]["flags"] & LAMPORT
                self.words(r, op["dst"][d], shift, count)[:] = (
                    np.where(value == self.sentinel, 0, value) if mapped else value
                )

    def norm(self, r: int, op, row: int, rstd: np.ndarray | None = None) -> None:
        """norm.cuh's epilogue over the op's rows (or its slice, with the row's ``rstd``): x * rstd * weight."""
        count = int(op["bytes"]) // 4
        x = self.words(r, op["src"][0], 0, count).view(np.float32).reshape(-1, min(row, count))
        if rstd is None:
            mean = np.float32(np.sum(x.astype(np.float64) ** 2, axis=-1) / row)
            rstd = np.float32(1.0) / np.sqrt(mean + np.int32(op["channel"][0]).view(np.float32))
        weight = self.words(r, op["src"][1], 0, min(row, count)).view(np.float32)
        normed = (x * np.asarray(rstd, np.float32).reshape(-1, 1)) * weight
        self.words(r, op["dst"][0], 0, count)[:] = normed.astype(np.float32).reshape(-1).view(np.uint32)

    def norm_slice(self, r: int, op, epoch: int):
        """kNormSlice: the slice's sum of squares into its LL8 slot with the execution's flag, a wait for the row's
        every slot to hold this execution's, then the slice normalized with the row's rstd."""
        count, slices, index = int(op["bytes"]) // 4, int(op["barrier_count"]), int(op["barrier_id"])
        x = self.words(r, op["src"][0], 0, count).view(np.float32)
        slots = self.words(r, op["src"][2], 0, 2 * slices)
        slots[2 * index : 2 * index + 2] = (np.float32(np.sum(x.astype(np.float64) ** 2)).view(np.uint32), epoch + 1)
        while (slots[1::2] != epoch + 1).any():
            yield False
        total = np.sum(slots[0::2].view(np.float32), dtype=np.float32)
        rstd = np.float32(1.0) / np.sqrt(
            total / np.float32(count * slices) + np.int32(op["channel"][0]).view(np.float32)
        )
        self.norm(r, op, count * slices, rstd)

    def control(self, r: int, op):
        kind, ids = int(op["type"]), [int(k) for k in op["channel"][: op["nchannel"]]]
        t = self.tables[r]
        if kind == 2:  # signal
            for ch in ids:
                self.inbound[t.channel_peers[ch]][t.paired_channel[ch]] += 1
        elif kind in (3, 6):  # wait, sem_acquire: the next ticket, until its signal or release
            if kind == 3:
                counters = [(self.inbound[r], ch, self.expected[r], ch) for ch in ids]
            else:
                counters = [(self.sems[r], 2 * s, self.sems[r], 2 * s + 1) for s in ids]
            for have, h, want, w in counters:
                want[w] += 1
                while have[h] < want[w]:
                    yield False
        elif kind == 7:  # sem_release
            for sem in ids:
                self.sems[r][2 * sem] += 1
        elif kind == 1:  # barrier over barrier_count blocks (a monotonic counter)
            counter, blocks = self.barriers[r].setdefault(int(op["barrier_id"]), [0]), int(op["barrier_count"])
            arrival, counter[0] = counter[0], counter[0] + 1
            while counter[0] < (arrival // blocks + 1) * blocks:
                yield False
        else:
            assert kind == 0, f"the emulator runs no op kind {kind}"


def _inputs(kernel: _Kernel, calls: int, rng) -> list[list[np.ndarray]]:
    """Each call's inputs: small integers (exact sums) and -0.0, about a fifth of them, and element 0 everywhere."""
    out = []
    for _ in range(calls):
        per_rank = [rng.integers(-8, 9, t.input_bytes // 4).astype(np.float32) for t in kernel.tables]
        for x in per_rank:
            x[(x == 0) | (rng.random(len(x)) < 0.2)] = -0.0
            x[0] = -0.0
        out.append(per_rank)
    return out


def _emulate(
    plan, nbytes: int, calls: int, seed: int, drop_resets: bool = False, fused: Fused | None = None
) -> list[str]:
    """``calls`` calls of ``plan`` back to back on every rank (``_Kernel``), each rank starting its next call once its
    own blocks are done, blocks stepped in a random order; what differed from the exact sum, or why nothing ran."""
    rng = np.random.default_rng(seed)
    kernel = _Kernel(plan, nbytes, drop_resets, fused)
    inputs = _inputs(kernel, calls, rng)
    call = [0] * plan.nranks
    running: dict[int, list] = {}
    problems: list[str] = []

    def start(r: int) -> None:
        kernel.mem[r]["i"][:] = inputs[call[r]][r].view(np.uint32)
        running[r] = [kernel.block(r, b, call[r]) for b in range(kernel.tables[r].nthreadblocks)]

    def finish(r: int) -> None:
        got = kernel.mem[r]["o"].view(np.float32)
        if fused is None:  # the collective's definition, chunk by chunk (exact: small integers)
            elems = plan.chunk_bytes(nbytes) // 4
            want_chunks = expected_outputs(plan.collective_spec(), inputs[call[r]], elems, "fp32")[r]
            wrong = sum(int((got[i * elems : (i + 1) * elems] != c).sum()) for i, c in want_chunks.items())
            if wrong:
                problems.append(f"rank {r} call {call[r]}: {wrong} wrong")
        else:
            want = np.asarray(np.sum(inputs[call[r]], axis=0, dtype=np.float32)) + fused.residual
            if not np.array_equal(got, want[: len(got)]):
                problems.append(f"rank {r} call {call[r]}: {int((got != want[: len(got)]).sum())} wrong")
        if fused is not None:
            rows = want.reshape(-1, fused.norm.row_elems)
            normed = rms_norm(rows, fused.weight, fused.norm.eps, "fp32").reshape(-1)
            wrong = int((kernel.mem[r]["n"].view(np.float32) != normed).sum())
            if wrong:
                problems.append(f"rank {r} call {call[r]}: {wrong} normalized elements wrong")
        call[r] += 1
        del running[r]
        if call[r] < calls:
            start(r)

    for r in range(plan.nranks):
        start(r)
    while running:
        live = [(r, g) for r, gens in running.items() for g in gens]
        progressed = False
        for k in rng.permutation(len(live)):
            r, g = live[k]
            try:
                progressed = next(g) or progressed
            except StopIteration:
                running[r].remove(g)
                progressed = True
                if not running[r]:
                    finish(r)
                break
        if not progressed:
            return problems + [f"no block can run: ranks at calls {call}"]
    return problems


@pytest.mark.parametrize("baseline", [direct, twoshot])
@pytest.mark.parametrize("n", [2, 4])
def test_the_tables_sum_exactly_over_seven_calls_back_to_back_as_the_kernel_runs_them(baseline, n):
    plan = _plan(baseline, n)
    for seed in range(3):
        assert _emulate(plan, 4096 * n, calls=7, seed=seed) == []


@pytest.mark.parametrize(
    ("spec", "collective", "method"),
    [
        ("hgx_h200:gpus=4", "allgather", "direct"),
        ("hgx_h200:gpus=4", "reducescatter", "direct"),
        ("hgx_h200:gpus=4", "alltoall", "direct"),
        ("hgx_h200:gpus=4", "allreduce", "ring"),
        ("hgx_h200:gpus=2", "allgather", "direct"),
    ],
)
@pytest.mark.parametrize("multipeer", [False, True])
def test_the_other_collectives_lamport_tables_run_seven_calls_as_the_kernel_runs_them(
    spec, collective, method, multipeer
):
    # `weft tune` makes Lamport variants of every collective by default: their tables, not only all-reduce's, must
    # give the collective's result over the three copies' reuse as the kernel runs them
    from weft.synthesis import synthesize

    topology = build_topology(spec)
    plan = compile_schedule(
        synthesize(topology, collective, method), topology, instances=2, protocol="lamport", multipeer=multipeer
    )
    for seed in range(2):
        assert _emulate(plan, 8 * plan.granule, calls=7, seed=seed) == []


def test_without_the_resets_a_later_call_reads_stale_data_or_waits_forever():
    found = _emulate(_plan(direct, 4), 4096 * 4, calls=7, seed=0, drop_resets=True)
    assert found and ("wrong" in found[0] or "no block can run" in found[-1])


@pytest.mark.parametrize("n,instances,rows", [(2, 1, 4), (2, 2, 1), (4, 1, 4), (4, 2, 1)])
def test_the_fused_tables_add_the_residual_and_normalize_over_seven_calls_as_the_kernel_runs_them(n, instances, rows):
    """The residual and the epilogue (rows whole, or split over 2 blocks that exchange their sums of squares in
    slots past the three copies) on the Lamport one-shot's tables, back to back, blocks in random orders: every
    call's output is the sum plus the residual, and its rows normalized, bit for bit (small integers: exact sums)."""
    plan = compile_schedule(
        direct(build_topology(f"fully_connected:n={n}"), Collective("allreduce", n)),
        protocol="lamport",
        instances=instances,
    )
    hidden = 256
    rng = np.random.default_rng(n)
    residual = rng.integers(-8, 9, rows * hidden).astype(np.float32)
    weight = rng.normal(1, 0.2, hidden).astype(np.float32)
    fused = Fused(residual, weight, RowNorm(hidden, 1e-5))
    for seed in range(2):
        assert _emulate(plan, rows * hidden * 4, calls=7, seed=seed, fused=fused) == []
