"""Run a script as one torch.distributed rank on the CPU (gloo), with this checkout first on the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter (its own process group), its output captured, with no GPU visible: on a
    GPU machine, where these tests run too (``-m gpu``), a Communicator there would start the GPU executor that the
    scripts expect to be absent."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""},
    )
