"""All-to-all in the torch integration without GPUs: the argument rules of ``all_to_all_single``, which tuned plan
a job picks per size, and the bench rows that ``weft registry record`` stores for all-to-all as for all-reduce."""

from __future__ import annotations

import json

import pytest

from executor.inference.plans import PlanChoice, safe_back_to_back, split_refusal
from registry.store import Registry
from schedules.collectives import Collective
from topologies.catalog import build
from weft import publish
from weft.cli import main
from weft.pipeline import compile_and_verify
from weft.synthesis import synthesize

SPEC = "hgx_h200:gpus=4"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A registry holding the direct all-to-all as LL (to 1 MB) and Simple, each with 1 and 4 instances."""
    location = str(tmp_path_factory.mktemp("alltoall-registry"))
    topology = build(SPEC)
    schedule = synthesize(topology, "alltoall", "direct")
    entries = {}
    for protocol in ("ll", "simple"):
        for instances in (1, 4):
            plan = compile_and_verify(schedule, topology, protocol=protocol, instances=instances)
            entries[(protocol, instances)] = publish.commit(plan, topology, location, schedule)
    return location, entries


def test_equal_splits_are_accepted_and_malformed_calls_named():
    assert split_refusal((8, 4096), (8, 4096), True, True, 4) == ""
    assert split_refusal((32,), (8, 4), True, True, 4) == ""  # torch's rule: as many elements, first dims split
    assert "as many elements" in split_refusal((8, 4), (8, 2), True, True, 4)
    assert "input's first dimension (6)" in split_refusal((6, 4), (6, 4), True, True, 4)
    assert "one dtype" in split_refusal((8,), (8,), False, True, 4)


def test_every_tuned_alltoall_plan_can_run_back_to_back(tuned):
    _, entries = tuned
    assert all(safe_back_to_back(e.plan) for e in entries.values())


def test_a_job_takes_ll_for_small_alltoalls_and_simple_past_ll_range(tuned):
    location, _ = tuned
    choice = PlanChoice(Registry(location), build(SPEC).fingerprint, 4)
    assert choice.plan("alltoall", 64 << 10, "bf16").protocol == "LL"
    assert choice.plan("alltoall", 16 << 20, "bf16").protocol == "Simple"
    assert choice.plan("allreduce", 64 << 10, "bf16") is None


def _bench_file(path, entries, nccl_us: dict[int, float], weft_us: dict[int, float]) -> str:
    """An all-to-all results file as `weft bench alltoall` writes it (the fields record reads)."""
    bus = Collective("alltoall", 4).bus_factor
    rows = []
    for size in sorted(nccl_us):
        plan = entries[("ll", 1) if size <= 1 << 20 else ("simple", 4)].plan
        algbw = size / (weft_us[size] * 1e3)
        rows.append(
            {
                "size": size,
                "nccl_us": nccl_us[size],
                "symm_us": None,
                "weft_us": weft_us[size],
                "algbw": algbw,
                "busbw": algbw * bus,
                "speedup": nccl_us[size] / weft_us[size],
                "wrong": 0,
                "plan": plan.name,
                "plan_hash": plan.content_hash,
                "plans_us": {plan.content_hash: weft_us[size]},
            }
        )
    path.write_text(json.dumps({"collective": "alltoall", "dtype": "bf16", "nranks": 4, "mode": "graph", "rows": rows}))
    return str(path)


def test_registry_record_takes_an_alltoall_bench_and_selection_follows_it(tuned, tmp_path, capsys):
    location, entries = tuned
    sizes = (1 << 10, 64 << 10, 4 << 20, 64 << 20)
    nccl = {1 << 10: 20.0, 64 << 10: 25.0, 4 << 20: 40.0, 64 << 20: 300.0}
    weft = {1 << 10: 6.0, 64 << 10: 9.0, 4 << 20: 35.0, 64 << 20: 400.0}  # NCCL faster at 64 MB
    registry = str(tmp_path / "reg")
    for e in entries.values():  # a copy of the tuned registry, so the module's stays unmeasured
        publish.commit(e.plan, build(SPEC), registry)
    path = _bench_file(tmp_path / "gpu_alltoall_bf16_graph_4xh200.json", entries, nccl, weft)
    assert main(["registry", "record", path, "--registry", registry]) == 0
    assert "at 4 sizes" in capsys.readouterr().out
    choice = PlanChoice(Registry(registry), build(SPEC).fingerprint, 4)
    assert choice.plan("alltoall", 1 << 10, "bf16") == entries[("ll", 1)].plan  # measured beats predicted
    assert choice.plan("alltoall", 64 << 20, "bf16") is None
    assert choice.reason("alltoall", 64 << 20, "bf16").startswith("NCCL measured faster for alltoall")
    assert Registry(registry).nccl_times(build(SPEC).fingerprint, "alltoall") == {s: nccl[s] for s in sizes}
