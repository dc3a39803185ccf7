"""LL128 lines in the device tables (executor/gpu/tables.py) and the data layout the kernel's line path uses."""

import numpy as np
import pytest

from executor.errors import ExecutorError
from executor.gpu.tables import LINE_BYTES, LINE_DATA, PACKET, TRANSFER, build_tables, lines_possible
from topologies.catalog import build
from weft.pipeline import compile_and_verify
from weft.synthesis import synthesize

TOPOLOGY = "hgx_h200:gpus=2"


@pytest.fixture(scope="module")
def plans():
    topology = build(TOPOLOGY)
    schedule = synthesize(topology, "allreduce", "direct")
    return {p: compile_and_verify(schedule, topology, protocol=p) for p in ("ll", "simple")}


def test_lines_are_for_ll_plans_with_chunks_of_whole_words(plans):
    ll, simple = plans["ll"], plans["simple"]
    assert lines_possible(ll, 1 << 20) and not lines_possible(simple, 1 << 20)
    assert not lines_possible(ll, 24)  # chunks of 12 bytes are not whole 8-byte words
    with pytest.raises(ExecutorError, match="cannot move as LL128 lines"):
        build_tables(simple, 0, 1 << 20, lines=True)


def test_packet_transfers_carry_the_chunk_size_and_scratch_shrinks(plans):
    ll = plans["ll"]
    plain, lined = build_tables(ll, 0, 1 << 20), build_tables(ll, 0, 1 << 20, lines=True)
    cb = lined.chunk_bytes
    assert lined.scratch_bytes == plain.scratch_bytes // (2 * cb) * -(-cb // LINE_DATA) * LINE_BYTES
    assert lined.scratch_bytes < plain.scratch_bytes and lined.lines and not plain.lines
    for rec in lined.ops:
        packets = any(rec["src"][k]["flags"] & PACKET for k in range(rec["nsrc"])) or any(
            rec["dst"][k]["flags"] & PACKET for k in range(rec["ndst"])
        )
        assert rec["line_chunk"] == (cb if rec["type"] == TRANSFER and packets else 0)
    assert not plain.ops["line_chunk"].any()


@pytest.mark.parametrize("chunk", [8, 120, 128, 4096, 131072, 1000])
def test_every_data_word_has_one_place_in_the_lines(chunk):
    """The kernel's mapping (run_transfer_lines): line g of an op, lane j, words 0-1 (lane 7: word 0 only)."""
    per_chunk = -(-chunk // LINE_DATA)
    chunks = 3
    seen = np.zeros(chunks * chunk // 8, np.int32)
    packet_end = 0
    for g in range(chunks * per_chunk):
        c = g // per_chunk
        for lane in range(8):
            data = c * chunk + (g - c * per_chunk) * LINE_DATA + 16 * lane
            for w in range(1 if lane == 7 else 2):
                if data + 8 * w + 8 <= (c + 1) * chunk:
                    seen[(data + 8 * w) // 8] += 1
            packet_end = max(packet_end, g * LINE_BYTES + 16 * lane + 16)
    assert (seen == 1).all() and packet_end <= chunks * per_chunk * LINE_BYTES
