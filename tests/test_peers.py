"""The peers of `weft bench` (gpu/peers.py) where FlashInfer is not installed, as in CI: the bench learns why
each peer is absent and goes on; the shape a flat all-reduce runs as in FlashInfer's [tokens, hidden] kernels."""

from __future__ import annotations

import importlib.util

import pytest

from executor.gpu import peers
from executor.gpu.bench import Peers

NOT_INSTALLED = importlib.util.find_spec("flashinfer") is None


@pytest.mark.parametrize(
    "numel, shape", [(512, (1, 512)), (8192, (1, 8192)), (4 * 8192, (4, 8192)), (8192 + 8, (1, 8200))]
)
def test_a_flat_all_reduce_runs_as_rows_of_the_hidden_size_where_they_divide(numel, shape):
    assert peers.rows(numel) == shape


@pytest.mark.parametrize(
    "max_bytes, world, tokens", [(256 << 20, 2, 16384), (256 << 20, 4, 16383), (1 << 20, 4, 64), (1024, 4, 5)]
)
def test_a_flashinfer_workspace_stays_below_its_int32_clear_offset(max_bytes, world, tokens):
    # 4 ranks × 256 MB is a 1 GiB Lamport slot: FlashInfer's one-shot would clear 2 GiB before it (gpu/peers.py)
    assert peers.max_tokens_for(max_bytes, world) == tokens
    assert world * tokens * peers.HIDDEN * 2 < peers.LAMPORT_SLOT_LIMIT


@pytest.mark.skipif(not NOT_INSTALLED, reason="FlashInfer is installed here")
def test_without_flashinfer_the_bench_records_why_each_peer_is_absent():
    made = Peers.create(1 << 20)
    assert made.flashinfer is None and made.vllm is None
    assert set(made.absent) == {"flashinfer", "vllm"}
    assert all(why.startswith("PeerUnavailable: flashinfer: ModuleNotFoundError") for why in made.absent.values())


@pytest.mark.skipif(not NOT_INSTALLED, reason="FlashInfer is installed here")
def test_the_bench_makes_only_the_peers_asked_for():
    assert Peers.create(1 << 20, ("vllm",)).absent.keys() == {"vllm"}


@pytest.mark.skipif(not NOT_INSTALLED, reason="FlashInfer is installed here")
def test_a_missing_flashinfer_is_one_line():
    assert peers.missing().count("\n") == 0 and "flashinfer" in peers.missing()
    assert peers.version() is None
