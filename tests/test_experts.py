"""The expert exchange's layout on the CPU (executor.gpu.experts): where the fused dispatch and combine put each row,
stated as numpy references, against the layer's all-to-all path (examples/moe_routing.py), and the all-to-all
implementation's arithmetic against those references bit for bit (torch on the CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from executor.gpu.experts import ExpertLayout, reference_combine, reference_dispatch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import moe_routing as moe  # noqa: E402

HIDDEN = 8


def _all_to_all(sends: list[np.ndarray]) -> list[np.ndarray]:
    """Equal-split all_to_all_single over every rank: block j of rank i's input becomes block i of rank j's output."""
    blocks = [np.split(s, len(sends)) for s in sends]
    return [np.concatenate([blocks[i][j] for i in range(len(sends))]) for j in range(len(sends))]


def _routed(layout: ExpertLayout, seed: int):
    rng = np.random.default_rng(seed)
    ids = np.arange(layout.experts)
    xs = [rng.standard_normal((layout.tokens, HIDDEN)).astype(np.float32) for _ in range(layout.ranks)]
    logits = [rng.standard_normal((layout.tokens, layout.experts)) * 3 for _ in range(layout.ranks)]
    routed = [moe.route(lg, ids, np) for lg in logits]
    rows = [moe.assign(e, ids, layout.capacity) for e, _ in routed]
    return xs, rows, [g.astype(np.float32) for _, g in routed]


CASES = [  # (ranks, experts, tokens, capacity): the last three drop claims
    (2, 8, 1, 1),
    (4, 8, 16, 4),
    (4, 16, 64, 8),
    (2, 4, 12, 2),
    (4, 8, 32, 3),
    (8, 8, 5, 1),
]


@pytest.mark.parametrize("ranks, experts, tokens, capacity", CASES)
def test_dispatch_puts_each_claim_where_the_all_to_all_and_the_expert_major_reorder_put_it(
    ranks, experts, tokens, capacity
):
    layout = ExpertLayout(ranks, experts, capacity, tokens, HIDDEN, "fp32")
    xs, rows, _ = _routed(layout, ranks * 1000 + tokens)
    sends = []
    for x, r in zip(xs, rows, strict=True):
        buffer = np.full((layout.trash + 1, HIDDEN), np.nan, np.float32)
        moe.dispatch(buffer, x, r)
        sends.append(buffer[: layout.trash])
    fused = reference_dispatch(layout, xs, rows)
    for rank, received in enumerate(_all_to_all(sends)):
        np.testing.assert_array_equal(fused[rank], moe.expert_major(received, ranks, layout.local, capacity))


@pytest.mark.parametrize("ranks, experts, tokens, capacity", CASES)
def test_combine_returns_each_expert_row_to_its_claim_and_sums_as_the_all_to_all_path(ranks, experts, tokens, capacity):
    layout = ExpertLayout(ranks, experts, capacity, tokens, HIDDEN, "fp32")
    xs, rows, gates = _routed(layout, ranks * 2000 + tokens)
    if capacity < tokens * 2 * ranks // experts:
        assert any((r >= layout.trash).any() for r in rows)  # the case under test: some claims dropped
    received = reference_dispatch(layout, xs, rows)
    done = [np.tanh(r) * (1 + rank) for rank, r in enumerate(received)]  # each rank's "experts", row by row
    outputs = [moe.token_major(d, ranks, capacity) for d in done]
    fused = reference_combine(layout, done, rows, gates)
    for rank, back in enumerate(_all_to_all(outputs)):
        returned = np.concatenate([back, np.zeros((1, HIDDEN), np.float32)])  # the trash row stays zero
        np.testing.assert_allclose(fused[rank], moe.combine(returned, rows[rank], gates[rank], experts, capacity))


def test_every_held_row_goes_back_to_the_place_dispatch_took_it_from():
    layout = ExpertLayout(4, 8, 3, 5, HIDDEN)
    for source in range(layout.ranks):
        for row in range(layout.trash):
            rank, held = layout.received_row(source, row)
            assert layout.returned_row(rank, held) == (source, row)
    targets = {layout.received_row(s, r) for s in range(layout.ranks) for r in range(layout.trash)}
    assert len(targets) == layout.ranks * layout.trash == layout.ranks * layout.held  # one place each, none shared


@pytest.mark.parametrize(
    "layout, words",
    [
        (ExpertLayout(4, 6, 1, 1, 4096), "do not split evenly over 4 ranks"),
        (ExpertLayout(2, 8, 1, 1, 4095), "not a multiple of 16 bytes"),
        (ExpertLayout(2, 8, 1, 1, 4096, "fp64"), "dtype fp64"),
        (ExpertLayout(2, 8, 0, 1, 4096), "must be positive"),
    ],
)
def test_a_layout_the_kernels_cannot_run_is_refused_in_one_line(layout, words):
    assert words in layout.refusal() and "\n" not in layout.refusal()
    assert ExpertLayout(4, 8, 2, 3, 4096, "bf16").refusal() == ""


# The all-to-all implementation (torch, on the CPU). Marked gpu: torch is on the GPU machines (and their CPU twin).


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_all_to_all_path_rounds_as_the_fused_combine_does_bit_for_bit(dtype):
    torch = pytest.importorskip("torch")
    from executor.inference.experts import PlainExperts, torch_dtype

    layout = ExpertLayout(1, 8, 5, 23, 64, dtype)  # one rank: the all-to-all is a copy; capacity 5 drops claims
    element = torch_dtype(layout)
    xs, rows, gates = _routed(ExpertLayout(1, 8, 5, 23, HIDDEN, "fp32"), 3)
    x = torch.randn(layout.tokens, layout.hidden, generator=torch.Generator().manual_seed(1)).to(element)
    rows_t = torch.from_numpy(rows[0]).T.contiguous().T  # a transposed view, as assign_onehot returns
    gates_t = torch.from_numpy(gates[0])
    plain = PlainExperts(layout, lambda out, inp: out.copy_(inp), torch.device("cpu"))
    received = plain.dispatch(x, rows_t)
    done = (received.float() * 1.5 - 0.25).to(element)
    got = plain.combine(done, rows_t, gates_t)
    ref = reference_combine(layout, [done.float().numpy()], [rows[0]], [gates[0]])[0]
    assert torch.equal(got, torch.from_numpy(ref).to(element))
    expected = reference_dispatch(layout, [x.float().numpy()], [rows[0]])[0]
    assert torch.equal(received.float(), torch.from_numpy(expected))


@pytest.mark.gpu
def test_a_call_that_does_not_fit_the_exchange_is_refused_naming_the_argument():
    torch = pytest.importorskip("torch")
    from executor.inference.experts import PlainExperts

    layout = ExpertLayout(1, 8, 2, 4, 64, "bf16")
    plain = PlainExperts(layout, lambda out, inp: out.copy_(inp), torch.device("cpu"))
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    rows = torch.zeros(4, 2, dtype=torch.int64)
    wide = torch.zeros(8, 3, 64, dtype=torch.bfloat16)
    for call, words in (
        (lambda: plain.dispatch(x[:3], rows), "x is (3, 64)"),
        (lambda: plain.dispatch(x.float(), rows), "torch.float32; this exchange takes (4, 64) bf16"),
        (lambda: plain.dispatch(x, rows.int()), "rows is (4, 2) torch.int32"),
        (lambda: plain.combine(wide, rows, torch.zeros(4, 2)), "done is (8, 3, 64)"),
        (lambda: plain.combine(plain.dispatch(x, rows), rows, torch.zeros(4, 2).half()), "gates is (4, 2)"),
    ):
        with pytest.raises(ValueError, match="weft: expert_exchange") as e:
            call()
        assert words in str(e.value) and "\n" not in str(e.value)
