"""NCCL's measured times in the registry: selection runs NCCL where NCCL measured faster than every plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_registry import TOPO, commit

from executor.inference.plans import PlanChoice
from registry.store import Registry, RegistryError
from topologies.catalog import build
from weft import publish
from weft.cli import main

COMMITTED = Path(__file__).parent.parent / "bench"


def measured_pair(tmp_path):
    """A registry with one plan measured at 1 KB–16 MB and NCCL measured from 1 KB to 64 MB."""
    reg = Registry(tmp_path)
    entry = commit(reg, "plan")
    for size, us in ((1 << 10, 5.0), (1 << 20, 20.0), (16 << 20, 120.0)):
        reg.record_timing(entry.id, size, us)
    reg.record_nccl(TOPO, "allgather", {1 << 10: 12.0, 1 << 20: 25.0, 16 << 20: 100.0, 64 << 20: 330.0})
    return reg, entry


def test_nccl_is_selected_where_it_measured_faster_than_every_plan(tmp_path):
    reg, entry = measured_pair(tmp_path)
    assert reg.select(TOPO, "allgather", 1 << 20).entry.id == entry.id
    sel = reg.select(TOPO, "allgather", 16 << 20)
    assert sel.entry is None and sel.basis == "nccl" and sel.time_us == pytest.approx(100.0)
    assert sel.reason == (
        "NCCL measured faster for allgather at 16777216 bytes (100.0 µs against 120.0 µs for the fastest plan, plan)"
    )
    # between measured sizes both sides interpolate: at 4 MB the plan's 20 -> 120 and NCCL's 25 -> 100 lines cross
    # (4 MB: plan 20·6^0.5 = 49.0, NCCL 25·4^0.5 = 50.0): the plan still wins there
    assert reg.select(TOPO, "allgather", 4 << 20).entry.id == entry.id


def test_outside_nccls_measured_sizes_or_against_a_prediction_the_plan_stays(tmp_path):
    reg, entry = measured_pair(tmp_path)
    reg.record_nccl(TOPO, "allgather", {1 << 10: 1.0})  # NCCL "faster" at 1 KB: the plan loses there
    assert reg.select(TOPO, "allgather", 1 << 10).basis == "nccl"
    assert reg.select(TOPO, "allgather", 256 << 20).entry.id == entry.id  # past NCCL's largest size: unknown
    reg2 = Registry(tmp_path / "predicted-only")
    predicted = commit(reg2, "other", predicted={1 << 20: 500.0})
    reg2.record_nccl(TOPO, "allgather", {1 << 10: 1.0, 1 << 30: 2.0})
    sel = reg2.select(TOPO, "allgather", 1 << 20)
    assert sel.entry.id == predicted.id and sel.basis == "predicted"  # a prediction is not a time on the machine
    assert reg.nccl_times(TOPO, "allreduce") == {} and reg.nccl_times("topo-ffffffffffffffff", "allgather") == {}


def test_the_inference_choice_falls_back_to_nccl_with_the_reason(tmp_path):
    from test_inference_cpu import MINE, _commit

    entry = _commit(str(tmp_path), MINE, "direct")  # an LL one-shot: safe back to back, as a job needs
    reg, fingerprint = Registry(tmp_path), build(MINE).fingerprint
    reg.record_timing(entry.id, 1 << 10, 4.0)
    reg.record_timing(entry.id, 64 << 10, 30.0)
    reg.record_nccl(fingerprint, "allreduce", {1 << 10: 9.0, 64 << 10: 12.0})
    choice = PlanChoice(reg, fingerprint, 2)
    assert choice.plan("allreduce", 1 << 10, "bf16") == entry.plan and choice.reason("allreduce", 1 << 10, "bf16") == ""
    assert choice.plan("allreduce", 64 << 10, "bf16") is None
    assert choice.reason("allreduce", 64 << 10, "bf16").startswith("NCCL measured faster for allreduce at 65536")
    assert (
        choice.plan("allgather", 1 << 10, "bf16") is None and choice.reason("allgather", 1 << 10, "bf16") == "no plan"
    )


def test_nccl_times_under_a_fabrics_two_fingerprints_are_read_together(tmp_path):
    """A switched fabric answers to its own fingerprint and a legacy one (``Topology.fingerprints``); NCCL's times
    recorded under each, by benches of entries keyed either way, are one table, the fabric's own winning."""
    topology = build("hgx_h200:gpus=4")
    own, legacy = topology.fingerprints
    reg = Registry(tmp_path)
    reg.record_nccl(legacy, "allreduce", {1 << 10: 12.0, 16 << 20: 100.0})
    reg.record_nccl(own, "allreduce", {1 << 10: 13.0, 1 << 20: 22.0})
    assert reg.nccl_times(topology.fingerprints, "allreduce") == {1 << 10: 13.0, 1 << 20: 22.0, 16 << 20: 100.0}


@pytest.mark.slow  # reads and selects over every committed entry: the slow tier (issue 35)
def test_the_committed_registries_run_nccl_only_where_it_measured_faster():
    """4×H200: NCCL's ring had measured faster than every plan at 16 MB (99.3 µs against 100.0, 2026-11-26), so the
    job ran NCCL there; the 2026-11-28 sweep (bench/results/s22_h200/gpu_allreduce_bf16_graph_4xh200_sweep4.json,
    recorded) timed the ring x128 plan at 94.4 µs against NCCL's 98.9, so a plan serves every size now. On 2×H200
    weft measured faster at every size, so nothing changes. The case where NCCL wins is
    test_nccl_is_selected_where_it_measured_faster_than_every_plan's."""
    four = PlanChoice(Registry(COMMITTED / "registry_h200x4"), build("hgx_h200:gpus=4").fingerprints, 4, ll128=True)
    for size in (1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20):
        assert four.plan("allreduce", size, "bf16") is not None, size
    ring = four.plan("allreduce", 16 << 20, "bf16")
    assert ring is not None and ring.name == "ring-allreduce-hgx_h200:gpus=4-simple-x128"
    assert four.plan("allgather", 256 << 20, "bf16") is not None  # all-gather beats NCCL at every size
    two = PlanChoice(Registry(COMMITTED / "registry_h200x2"), build("hgx_h200:gpus=2").fingerprints, 2, ll128=True)
    for collective in ("allreduce", "reducescatter", "allgather"):
        for size in (1 << 10, 1 << 20, 16 << 20, 256 << 20):
            assert two.plan(collective, size, "bf16") is not None, (collective, size)


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"format": "other"}, "format"),
        ({"format": "weft.registry-baselines/1", "nccl_us": []}, "nccl_us"),
        (
            {"format": "weft.registry-baselines/1", "nccl_us": {"t": {"allreduce": {"1024": -3}}}},
            "nccl_us.t.allreduce.1024",
        ),
        (
            {"format": "weft.registry-baselines/1", "nccl_us": {"t": {"allreduce": {"1KB": 3}}}},
            "nccl_us.t.allreduce.1KB",
        ),
    ],
)
def test_a_malformed_baselines_file_is_refused_naming_the_file_and_field(tmp_path, doc, field):
    reg, _ = measured_pair(tmp_path)
    (tmp_path / "baselines.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match=f"baselines.json: {field}:"):
        reg.nccl_times(TOPO, "allgather")
    sel = reg.select(TOPO, "allgather", 1 << 20)  # the plans still serve; the damaged file is named once
    assert sel.entry is not None and len(sel.warnings) == 1 and f"baselines.json: {field}:" in sel.warnings[0]


def test_weft_registry_record_stores_a_bench_files_times(tmp_path, capsys):
    reg = Registry(tmp_path / "reg")
    a = commit(reg, "a")
    results = tmp_path / "bench.json"
    results.write_text(
        json.dumps(
            {
                "collective": "allgather",
                "rows": [
                    {
                        "size": 1 << 20,
                        "nccl_us": 10.0,
                        "weft_us": 30.0,
                        "wrong": 0,
                        "plan_hash": a.plan.content_hash,
                        "plans_us": {a.plan.content_hash: 30.0},
                    }
                ],
            }
        )
    )
    assert main(["registry", "record", str(results), "--registry", str(tmp_path / "reg")]) == 0
    assert "1 plan time and NCCL's at 1 size recorded" in capsys.readouterr().out  # singular: one of each
    assert reg.get(a.id).measured_us == {1 << 20: 30.0} and reg.nccl_times(TOPO, "allgather") == {1 << 20: 10.0}
    assert (
        main(["registry", "select", "allgather", "-t", TOPO, "--size", "1MB", "--registry", str(tmp_path / "reg")]) == 1
    )
    assert "no plan: NCCL measured faster for allgather at 1MB (10.0 µs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "doc, field",
    [
        ([], "must be an object"),
        ({"rows": []}, "collective"),
        ({"collective": "allgather"}, "rows"),
        ({"collective": "allgather", "rows": [{"size": 1}]}, r"rows\[0\].nccl_us"),
    ],
)
def test_a_bad_results_file_is_one_line_and_exit_2_recording_nothing(tmp_path, capsys, doc, field):
    results = tmp_path / "bench.json"
    results.write_text(json.dumps(doc))
    assert main(["registry", "record", str(results), "--registry", str(tmp_path / "reg")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(results) in err
    import re

    assert re.search(field, err)
    assert not (tmp_path / "reg" / "baselines.json").exists()
    with pytest.raises(RegistryError):
        publish.record_results_file(str(tmp_path / "missing.json"), str(tmp_path / "reg"))
