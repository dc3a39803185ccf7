"""Thread-block clusters in weft's launches (executor.gpu.launch, the engine's ``cluster``): the launch config the
driver reads, which launches take a cluster, and the CLI's refusal of a cluster below 1. A clustered launch before
a clustered cuBLAS GEMM lets that GEMM run 7% faster (bench/gemm_after.py; the GPU side: tests/gpu/test_one_device.py).
"""

from __future__ import annotations

import contextlib
import io
import types

import pytest

from executor.errors import ExecutorError
from executor.gpu import launch
from executor.gpu.engine import InterpreterEngine
from weft.cli import main


def test_a_clustered_programmatic_launch_carries_both_attributes():
    config, attributes = launch.launch_config(16, 512, programmatic=True, cluster=2)
    assert (config.gridDimX, config.blockDimX, config.numAttrs) == (16, 512, 2)
    assert [config.attrs[i].id for i in range(2)] == [
        launch.PROGRAMMATIC_STREAM_SERIALIZATION,
        launch.CLUSTER_DIMENSION,
    ]
    assert bytes(config.attrs[1].value[:12]) == (2).to_bytes(4, "little") + (1).to_bytes(4, "little") * 2
    assert launch.cluster_of(config) == 2


def test_a_plain_launch_has_no_attributes_and_a_cluster_of_one():
    config, _ = launch.launch_config(3, 128, programmatic=False)
    assert config.numAttrs == 0 and not config.attrs
    assert launch.cluster_of(config) == 1
    clustered, _ = launch.launch_config(8, 128, programmatic=False, cluster=8)
    assert clustered.numAttrs == 1 and launch.cluster_of(clustered) == 8


@pytest.mark.parametrize("grid, cluster", [(3, 2), (16, 0), (16, 3)])
def test_a_cluster_that_does_not_divide_the_grid_is_refused_in_one_line(grid, cluster):
    with pytest.raises(ExecutorError) as e:
        launch.launch_config(grid, 128, programmatic=True, cluster=cluster)
    assert "\n" not in str(e.value) and f"grid of {grid}" in str(e.value)


class _Launcher:
    def __init__(self, fits: int):
        self.fits, self.asked = fits, 0

    def resident_clusters(self, function: int, block: int, cluster: int) -> int:
        self.asked += 1
        return self.fits


def _engine(cluster: int, cc: str = "90", fits: int = 66):
    return types.SimpleNamespace(_cluster=cluster, _cc=cc, _resident_clusters={}, _launcher=_Launcher(fits))


@pytest.mark.parametrize(
    "cluster, cc, blocks, fits, expected",
    [
        (2, "90", 16, 66, 2),  # Hopper, an even grid that fits: clusters of 2
        (2, "90", 132, 66, 2),  # the whole GPU, as many clusters as it holds
        (2, "90", 132, 65, 1),  # one cluster short (a GPC of an odd SM count): the blocks wait on each other
        (2, "90", 15, 66, 1),  # an odd grid
        (2, "80", 16, 66, 1),  # before Hopper: no clusters
        (1, "90", 16, 66, 1),  # asked for none
        (4, "100", 16, 33, 4),
    ],
)
def test_which_launches_take_a_cluster(cluster, cc, blocks, fits, expected):
    engine = _engine(cluster, cc, fits)
    assert InterpreterEngine._cluster_of(engine, "entry", 1, blocks, 512) == expected


def test_the_resident_clusters_are_asked_once_per_kernel_and_block_size():
    engine = _engine(2)
    for _ in range(3):
        InterpreterEngine._cluster_of(engine, "entry", 1, 16, 512)
    InterpreterEngine._cluster_of(engine, "entry", 1, 16, 256)
    assert engine._launcher.asked == 2


def test_an_engine_refuses_a_cluster_below_one_before_touching_the_gpu():
    with pytest.raises(ExecutorError, match="cluster 0"):
        InterpreterEngine(0, 2, store=object(), cluster=0)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "allreduce", "--cluster", "0"],
        ["run", "tests/gpu/plans/allreduce-direct-ll-x1.json", "--size", "1KB", "--cluster", "-2"],
    ],
)
def test_the_cli_refuses_a_cluster_below_one_in_one_line(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "--cluster" in lines[0], lines
