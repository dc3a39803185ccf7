"""`-o` writes only to regular files or new paths: an existing FIFO, character device, socket or directory given
as an output is refused in one line before anything is written, by every command that writes (issue 41)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "results" / "gpu_allgather_bf16_graph_2xh200.json"
FACTS = ROOT / "tests" / "fixtures" / "nvml" / "h200x2_nv18.json"


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _char_device(path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    return path


def _socket(path: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    return path


NODES = {"fifo": _fifo, "chardev": _char_device, "socket": _socket}


@pytest.fixture(scope="module")
def schedule(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("s") / "ring.json"
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "-o", str(path)]) == 0
    return path


def _commands(schedule: Path, target: Path) -> dict[str, list[str]]:
    return {
        "synth": ["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "-o", str(target)],
        "compile": ["compile", str(schedule), "-t", "ring:n=4", "-o", str(target)],
        "compile-xml": ["compile", str(schedule), "-t", "ring:n=4", "--format", "msccl-xml", "-o", str(target)],
        "topo export": ["topo", "export", "dgx1", "-o", str(target)],
        "topo detect": ["topo", "detect", "--facts", str(FACTS), "-o", str(target)],
        "topo detect --record": ["topo", "detect", "--facts", str(FACTS), "--record", str(target)],
        "plot bench": ["plot", "bench", str(BENCH), "-o", str(target)],
    }


@pytest.mark.parametrize("node", sorted(NODES))
@pytest.mark.parametrize(
    "command", ["synth", "compile", "compile-xml", "topo export", "topo detect", "topo detect --record", "plot bench"]
)
def test_a_special_file_as_output_is_refused_and_left_as_it_was(tmp_path, capsys, schedule, node, command):
    target = NODES[node](tmp_path / ("out.png" if command.startswith("plot") else "out.json"))
    before = os.lstat(target)
    capsys.readouterr()
    assert main(_commands(schedule, target)[command]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "will not write" in err and str(target) in err, err
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temp file, nothing beside it


def test_a_directory_as_a_file_output_is_refused(tmp_path, capsys, schedule):
    folder = tmp_path / "out.json"
    folder.mkdir()
    assert main(_commands(schedule, folder)["compile"]) == 2
    assert "it is a directory" in capsys.readouterr().err and not any(folder.iterdir())


def test_registry_export_into_a_fifo_or_onto_one_inside_the_folder_is_refused(tmp_path, capsys, schedule):
    registry = tmp_path / "reg"
    plan = tmp_path / "p.plan.json"
    assert main(["compile", str(schedule), "-t", "ring:n=4", "-o", str(plan)]) == 0
    assert main(["registry", "commit", str(plan), "-t", "ring:n=4", "--registry", str(registry)]) == 0
    fifo = _fifo(tmp_path / "export")
    capsys.readouterr()
    assert main(["registry", "export", str(fifo), "--registry", str(registry)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    folder = tmp_path / "folder"
    folder.mkdir()
    assert main(["registry", "export", str(folder), "--registry", str(registry)]) == 0
    written = next(folder.glob("*.json"))
    written.unlink()
    _fifo(written)
    capsys.readouterr()
    assert main(["registry", "export", str(folder), "--registry", str(registry)]) == 2
    assert "will not write: it is a FIFO" in capsys.readouterr().err and stat.S_ISFIFO(os.lstat(written).st_mode)


def test_a_regular_file_is_still_replaced(tmp_path, schedule):
    out = tmp_path / "p.json"
    out.write_text("old")
    assert main(_commands(schedule, out)["compile"]) == 0
    assert out.read_text().startswith("{")


def test_the_kernel_cache_never_replaces_a_node_planted_in_it(tmp_path):
    from executor.errors import ExecutorError
    from executor.gpu import build

    fifo = _fifo(tmp_path / "interpreter-sm_90-x.cubin.sha256")
    with pytest.raises(ExecutorError, match="will not write: it is a FIFO"):
        build.write_private(tmp_path, fifo, "digest\n")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == [fifo.name]
