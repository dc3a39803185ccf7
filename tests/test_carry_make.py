"""bench/carry_make.sh, which makes the folders device calls carry from the package index: a wrong folder name or a
missing REV is refused in one line, exit 2, before it fetches or writes anything (the fetches need the index)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(
    "args,said", [(["bogus"], "unknown folder 'bogus'"), ([], "unknown folder ''"), (["base"], "base REV")]
)
def test_a_wrong_folder_is_refused_before_anything_is_fetched_or_written(tmp_path, args, said):
    exclude = ROOT / ".git" / "info" / "exclude"
    before = exclude.read_bytes() if exclude.exists() else None
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "carry_make.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "WHL": str(tmp_path / "wheels")},
        timeout=30,
    )
    assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "wheels").exists()
    assert (exclude.read_bytes() if exclude.exists() else None) == before
