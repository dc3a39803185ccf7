"""examples/tp_decode.py's arguments (torch on the CPU is enough): ``--no-pdl`` names the backends launched without
programmatic dependent launch, and anything else is refused by argparse (exit 2, one line)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tp_decode(monkeypatch):
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("tp_decode", ROOT / "examples" / "tp_decode.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tp_decode", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_pdl_names_the_backends_launched_without_it(monkeypatch):
    tp_decode = _tp_decode(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--batch", "1", "--no-pdl", "weft,flashinfer"])
    args, no_pdl = tp_decode.parse_args()
    assert no_pdl == {"weft", "flashinfer"} and args.batch == "1"
    monkeypatch.setattr(sys, "argv", ["tp_decode.py"])
    assert tp_decode.parse_args()[1] == set()


def test_an_unknown_backend_for_no_pdl_is_refused_in_one_line(monkeypatch, capsys):
    tp_decode = _tp_decode(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--no-pdl", "nccl"])
    with pytest.raises(SystemExit) as e:
        tp_decode.parse_args()
    assert e.value.code == 2 and "--no-pdl: nccl: only weft and flashinfer" in capsys.readouterr().err
