"""examples/tp_decode.py's tools (torch on the CPU is enough): ``--no-pdl`` names the backends launched without
programmatic dependent launch, and anything else is refused by argparse (exit 2, one line); ``--profile``'s table
of the step's kernels by family; and (on a GPU) NVML's clock counters for the GPU torch names."""

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


def test_weft_cluster_and_gemm_tail_default_as_the_communicator_and_a_cluster_below_one_is_refused(monkeypatch, capsys):
    tp_decode = _tp_decode(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tp_decode.py"])
    assert tp_decode.parse_args()[0].weft_cluster == 1 and not tp_decode.parse_args()[0].weft_gemm_tail
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--weft-cluster", "2", "--weft-gemm-tail"])
    assert tp_decode.parse_args()[0].weft_cluster == 2 and tp_decode.parse_args()[0].weft_gemm_tail
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--weft-cluster", "0"])
    with pytest.raises(SystemExit) as e:
        tp_decode.parse_args()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "--weft-cluster 0: a cluster holds 1 block or more" in err[-1]


def test_the_tail_ab_is_refused_beside_the_tail_itself_in_one_line(monkeypatch, capsys):
    tp_decode = _tp_decode(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--weft-tail-ab"])
    assert tp_decode.parse_args()[0].weft_tail_ab
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--weft-tail-ab", "--weft-gemm-tail"])
    with pytest.raises(SystemExit) as e:
        tp_decode.parse_args()
    assert e.value.code == 2 and "--weft-tail-ab: weft-fused-norm-tail is the tail's side" in capsys.readouterr().err


def test_step_kernels_sums_each_family_per_step_and_ranks_the_kernels(monkeypatch):
    """``--profile``'s table from (kernel name, start µs, µs) events of 2 replays: per step, by family, the top
    kernels, and the last replay's kernels in launch order with their starts from its first."""
    tp_decode = _tp_decode(monkeypatch)
    step = [
        ("weft_compiled_bf16_v16_ab12", 7.0),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 20.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 30.0),
        ("void flash_fwd_splitkv_kernel<...>", 11.0),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 9.0),
        ("allreduce_fusion_kernel_oneshot_lamport<...>", 6.0),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", 1.0),
    ]
    events, at = [], 1000.0
    for _ in range(2):  # two replays, each kernel 0.5 µs after the one before it ends
        for name, us in step:
            events.append((name, at, us))
            at += us + 0.5
    table = tp_decode.step_kernels(list(reversed(events)), replays=2, top=2)  # the profiler's order is not launch's
    assert table["classes_us"] == {
        "gemm": 50.0,
        "attention": 11.0,
        "nccl": 9.0,
        "weft": 7.0,
        "flashinfer": 6.0,
        "other": 1.0,
    }
    assert list(table["classes_us"]) == ["gemm", "attention", "nccl", "weft", "flashinfer", "other"]
    assert table["top"] == [
        ["sm90_xmma_gemm_bf16bf16_bf16f32", 30.0, 1.0],
        ["nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 20.0, 1.0],
    ]
    sequence = table["sequence"]
    assert [name for name, _, _ in sequence] == [name[:60] for name, _ in step]
    assert sequence[0][1] == 0 and sequence[1][1] == 7.5 and sequence[-1][2] == 1.0
    assert tp_decode.kernel_class("void rms_norm_kernel<c10::BFloat16>") == "norm"


def test_only_keeps_the_named_backends_and_refuses_others_in_one_line(monkeypatch, capsys):
    tp_decode = _tp_decode(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--backend", "nccl", "--only", "nccl"])
    args, no_pdl = tp_decode.parse_args()
    backends, comm, fi = tp_decode.make_backends(args, no_pdl, 0)
    assert list(backends) == ["nccl"] and comm is None and fi is None
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--backend", "nccl", "--only", "flashinfer-fused"])
    args, no_pdl = tp_decode.parse_args()
    with pytest.raises(SystemExit) as e:
        tp_decode.make_backends(args, no_pdl, 0)
    assert str(e.value) == "tp_decode: --only flashinfer-fused: not among this run's backends nccl"


def test_the_results_file_is_written_after_every_batch_and_says_when_it_is_complete(monkeypatch, tmp_path):
    """A run cut by its time limit (a cold machine building kernels) keeps the batches it measured."""
    import json

    tp_decode = _tp_decode(monkeypatch)
    monkeypatch.setattr(tp_decode.torch.cuda, "get_device_name", lambda device: "GPU")
    monkeypatch.setattr(tp_decode.torch.cuda.nccl, "version", lambda: (2, 28, 9))
    out = tmp_path / "tp.json"
    monkeypatch.setattr(sys, "argv", ["tp_decode.py", "--batch", "1,4", "--json", str(out)])
    args, no_pdl = tp_decode.parse_args()
    write = tp_decode._results_writer(args, no_pdl, 2, "cpu", {"nccl": None}, None, None, [1, 4])
    write([])
    assert json.loads(out.read_text())["complete"] is False
    write([{"batch": 1, "tp": 2}])
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["batches_planned"] == [1, 4] and [r["batch"] for r in doc["rows"]] == [1]
    write([{"batch": 1, "tp": 2}, {"batch": 4, "tp": 2}])
    assert json.loads(out.read_text())["complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tp.json"]  # written whole, then moved over the old
    args.json = None
    assert tp_decode._results_writer(args, no_pdl, 2, "cpu", {}, None, None, []) is None


def test_nvml_counts_this_gpus_clocks_held_down_by_torchs_uuid():
    """tp_decode's ``clock_violations_ns_by_rank``: NVML answers for the GPU torch names (a GPU and nvidia-ml-py
    needed), with the power policy among the counted ones."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from executor.gpu.clocks import violation_reader

    read = violation_reader(str(torch.cuda.get_device_properties(0).uuid))
    assert read is not None
    counts = read()
    assert "power" in counts and all(ns >= 0 for ns in counts.values())


CLOCK_LIMITS = r"""
import importlib.util, sys, tempfile
import torch.distributed as dist
from pathlib import Path
dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
spec = importlib.util.spec_from_file_location("tp_decode", Path(ROOT) / "examples" / "tp_decode.py")
tp_decode = importlib.util.module_from_spec(spec)
sys.modules["tp_decode"] = tp_decode  # its dataclasses look their module up
spec.loader.exec_module(tp_decode)
row = tp_decode.clock_limits({"power": 5_000, "low_utilization": 9_000_000, "thermal": 0})
assert row == {"clock_violations_ns_by_rank": [{"power": 5_000, "low_utilization": 9_000_000, "thermal": 0}]}, row
assert tp_decode.clock_limits({}) == {"clock_violations_ns_by_rank": [{}]}
dist.destroy_process_group()  # not left to the interpreter's exit, where gloo's teardown once aborted (-6)
print("all ok")
"""


def test_each_ranks_clock_limits_go_into_the_row_and_a_limit_that_counted_is_said():
    """``clock_limits`` on one CPU rank (gloo): the row holds every rank's counters as read; stderr names a power
    limit that counted (5 µs) and not the low-utilization time NVML also counts."""
    pytest.importorskip("torch")
    from cpu_rank import run_script

    done = run_script(f"ROOT = {str(ROOT)!r}\n" + CLOCK_LIMITS)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "clocks held down" in line]
    assert said == ["tp_decode: clocks held down while timing: rank 0 power 5 µs"], done.stderr[-2000:]
