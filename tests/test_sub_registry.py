"""bench/sub_registry.py: a registry of some of another's entries, their times kept, for a device job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _bench import bench_script

from registry.store import Registry

ROOT = Path(__file__).parent.parent
SOURCE = ROOT / "bench" / "registry_h200x4"
P = "direct-allreduce-hgx_h200:gpus=4-"


def test_the_named_entries_are_copied_with_their_times_and_nothing_else(tmp_path):
    names = [P + "lamport-x64-t256-mp", P + "ll-x64-t512-max8MB"]
    ids = bench_script("sub_registry").copy_entries(SOURCE, tmp_path / "sub", names)
    sub = Registry(str(tmp_path / "sub"))
    entries = {e.plan.name: e for e in sub.entries()}
    assert sorted(entries) == sorted(names) and sorted(e.id for e in entries.values()) == sorted(ids)
    source = {e.plan.name: e for e in Registry(str(SOURCE)).entries() if e.plan.name in names}
    for name in names:
        assert entries[name].timings == source[name].timings  # measured times kept
    assert json.loads((tmp_path / "sub" / "baselines.json").read_text()) == json.loads(
        (SOURCE / "baselines.json").read_text()
    )
    assert sub.index_problems() == []


def test_a_bad_name_or_an_existing_folder_ends_in_one_line_with_nothing_written(tmp_path):
    script = ROOT / "bench" / "sub_registry.py"
    bad = subprocess.run(
        [sys.executable, str(script), str(SOURCE), str(tmp_path / "sub"), P + "lamport-x3-t9"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "0 entries hold plan" in bad.stderr
    assert not (tmp_path / "sub").exists()
    (tmp_path / "taken").mkdir()
    taken = subprocess.run(
        [sys.executable, str(script), str(SOURCE), str(tmp_path / "taken"), P + "lamport-x64-t256-mp"],
        capture_output=True,
        text=True,
    )
    assert taken.returncode == 2 and "already exists" in taken.stderr and list((tmp_path / "taken").iterdir()) == []
