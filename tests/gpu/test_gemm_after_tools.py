"""bench/gemm_after.py's arguments (torch on the CPU is enough): which ``--mix`` backends it takes (two backends'
calls together, or a backend's call and an empty kernel's launch as its spare) and what ``--weft-variants`` passes
to the Communicator."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gemm_after(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location("gemm_after", ROOT / "bench" / "gemm_after.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gemm_after", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "mix, ok",
    [
        ("weft/flashinfer", True),  # weft's call before the MLP, FlashInfer's after it
        ("weft+flashinfer", True),
        ("flashinfer>weft", True),
        ("none+cluster8", True),  # an empty kernel's launch as the spare
        ("cluster2>weft", True),
        ("weft/cluster8", False),  # a probe is never a call of its own
        ("cluster8+none", False),
        ("weft", False),
        ("weft+flashinfer+none", False),
        ("weft+nvshmem", False),
    ],
)
def test_mix_takes_two_backends_or_a_backend_and_a_probe_as_its_spare(monkeypatch, mix, ok):
    assert _gemm_after(monkeypatch).mix_ok(mix) is ok


def test_every_weft_variant_is_options_the_interpreter_engine_takes(monkeypatch):
    from executor.gpu.engine import InterpreterEngine

    taken = set(inspect.signature(InterpreterEngine.__init__).parameters)
    variants = _gemm_after(monkeypatch).WEFT_VARIANTS
    assert {"c1", "c2", "tail"} <= set(variants)
    assert all(set(options) <= taken for options in variants.values())
    assert variants["tail"] == {"gemm_tail": True} and variants["c2"] == {"cluster": 2}
