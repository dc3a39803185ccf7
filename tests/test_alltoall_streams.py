"""Issue 36's MoE hang on the CPU reference executor: two executions of one LL all-to-all context on one rank that
no stream orders (``comm.capture(alltoall_sizes=...)`` prepared the size on the current stream, then the graph's
warm-up ran on a side stream at once) race on the buffers that the communicator's staging shares between calls.
On the GPU the same pair also breaks LL's "one execution ahead" bound, so a peer's packets were overwritten
before it read them and it waited for them until the timeout. ``executor.inference.streams`` orders such calls,
and the timeout's message now names unequal launches as a cause.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from executor.errors import ExecutorTimeout
from executor.gpu.engine import InterpreterEngine
from executor.reference.machine import PlanRace, _Machine
from executor.reference.prove import chunk_elems, random_inputs
from topologies.catalog import build
from weft.pipeline import compile_and_verify
from weft.synthesis import synthesize


class SecondStream(_Machine):
    """Rank 0's launch 1 is issued on another stream: it starts once its host work began, not after launch 0."""

    def _host_ready(self, key: tuple[int, int]) -> bool:
        launch, rank = key
        if (launch, rank) == (1, 0):
            return self.hosts[(0, 0)].started
        return super()._host_ready(key)


@pytest.fixture(scope="module")
def run():
    topology = build("hgx_h200:gpus=2")
    plan = compile_and_verify(synthesize(topology, "alltoall", "direct"), topology, protocol="ll")
    elems = chunk_elems(plan, 4096, "fp32")
    rng = np.random.default_rng(36)
    inputs = [random_inputs(plan, elems, rng) for _ in range(3)]

    def launch(machine: type[_Machine]) -> None:
        m = machine(plan, elems, "fp32", inputs)
        m.run(deadline_ops=10 * sum(len(t.ops) for t in m.threads) + 100)

    return launch


def test_launches_ordered_by_one_stream_run_back_to_back(run):
    run(_Machine)


def test_a_launch_on_a_second_stream_races_with_the_one_before_it(run):
    with pytest.raises(PlanRace, match="rank 0"):
        run(SecondStream)


def test_a_packet_timeout_names_unequal_launches_as_a_cause():
    engine: Any = InterpreterEngine.__new__(InterpreterEngine)  # a bare engine: only what the error path reads
    engine.rank, engine.timeout_s, engine._contexts = 2, 30.0, {}
    engine._roster = SimpleNamespace(raise_if_lost=lambda *args: None)  # no peer exited
    engine._error = np.array([1, 2, 2, 8, 0, -1, 0, 0], np.int32)  # packets never arrived: rank 2, block 8, op 0
    with pytest.raises(ExecutorTimeout, match="two launches of it on one rank that no stream orders") as info:
        engine._raise_device_error(recover=False)  # as inside a capture, where the MoE layer found it
    assert str(info.value).startswith("executor: rank 2: threadblock 8: op 0: timed out after 30 s: packets never")
