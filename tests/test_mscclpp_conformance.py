"""Every plan weft writes is what MSCCL++'s executor reads: schedules/mscclpp_format.py restates
src/core/executor/execution_plan.cc field by field, and weft's codegen output passes it untouched."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from codegen import compile_schedule
from executor.reference.prove import check_plan
from schedules.collectives import NAMES, Collective
from schedules.mscclpp_format import OP_NAMES, conformance_errors, mscclpp_verdict
from schedules.ops import OPS, SWITCH_OPS
from schedules.plan.io import dumps_plan, load_plan, parse_plan
from schedules.plan.types import current_format
from synth import baselines
from synth.errors import NotApplicable
from topologies.catalog import build
from weft.pipeline import check_sizes

ROOT = Path(__file__).parent
CORPUS = ROOT / "fixtures" / "mscclpp" / "plans"


@cache
def _topology(spec: str):
    return build(spec)


@cache
def _schedule(spec: str, method: str, name: str):
    topology = _topology(spec)
    try:
        return getattr(baselines, method)(topology, Collective(name, topology.nranks))
    except NotApplicable:
        return None


def _written(spec: str, method: str, name: str, **options) -> dict:
    return json.loads(dumps_plan(compile_schedule(_schedule(spec, method, name), _topology(spec), **options)))


CASES = [
    case
    for case in (
        [
            ("hgx_h200:gpus=2", m, n, o)
            for m in baselines.METHODS
            for n in NAMES
            for o in (
                {"protocol": "simple"},
                {"protocol": "ll"},
                {"protocol": "simple", "instances": 8},
                {"protocol": "simple", "pipeline": 2, "double_scratch": True},
                {"protocol": "simple", "inplace": True},
            )
        ]
        + [
            ("hypercube:d=3", m, n, o)
            for m in ("direct", "ring")
            for n in ("allreduce", "allgather", "alltoall")
            for o in ({"protocol": "simple"}, {"protocol": "ll", "instances": 2})
        ]
    )
    if _schedule(*case[:3]) is not None
]  # the baselines that exist for that collective there


@pytest.mark.parametrize(
    "spec,method,name,options",
    CASES,
    ids=[f"{s}-{m}-{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for s, m, n, o in CASES],
)
def test_every_plan_weft_writes_passes_mscclpp_s_parser_rules(spec, method, name, options):
    doc = _written(spec, method, name, **options)
    assert conformance_errors(doc) == []
    assert doc["weft"]["channel_ids"] == "threadblock"  # ops name the block's channels, as MSCCL++ indexes them
    plan = parse_plan(doc, "written.json")
    assert json.loads(dumps_plan(plan)) == doc  # read back, it writes the same file


def test_written_plans_name_channels_by_the_threadblocks_list():
    doc = _written("hgx_h200:gpus=4", "direct", "allreduce", protocol="simple", instances=2)
    subsets = 0
    for gpu in doc["gpus"]:
        for tb in gpu["threadblocks"]:
            listed = [c for ref in tb["channels"] for c in ref["channel_ids"]]
            used = {c for op in tb["ops"] for c in op.get("channel_ids", [])}
            assert used <= set(range(len(listed)))
            subsets += listed != list(range(len(gpu["channels"][0]["connected_to"])))
    assert subsets  # blocks list subsets of the GPU's channels, where block index and GPU id differ


def test_the_rules_catch_what_mscclpp_would_reject():
    doc = _written("hgx_h200:gpus=2", "direct", "allreduce", protocol="simple")
    tb = doc["gpus"][0]["threadblocks"][0]
    op = next(o for o in tb["ops"] if o["name"] == "signal")
    op["channel_ids"] = [len(tb["channels"][0]["channel_ids"])]  # past the block's list
    op["tpkt"] = 1
    del doc["inplace"]
    errors = conformance_errors(doc)
    assert any(e.startswith("inplace: missing") for e in errors)
    assert any("channel_ids" in e and "past the block" in e for e in errors)
    assert any(e.endswith("tpkt: not a field MSCCL++'s executor reads") for e in errors)
    assert mscclpp_verdict(doc).startswith("MSCCL++'s executor would refuse it: inplace: missing")


def test_legacy_weft_plans_rewrite_into_the_current_format():
    # plans written before ops named the block's channels read with GPU ids and write either way
    plan = load_plan(ROOT / "gpu" / "plans" / "allgather-direct-simple-x16.json")
    assert plan.weft.channel_ids == "gpu"
    rewritten = json.loads(dumps_plan(current_format(plan)))
    assert conformance_errors(rewritten) == []
    again = parse_plan(rewritten, "rewritten.json")
    assert [(op.name, op.channel_ids) for g in again.gpus for tb in g.threadblocks for op in tb.ops] == [
        (name, op.channel_ids)
        for g in plan.gpus
        for tb in g.threadblocks
        for op in tb.ops
        for name in (("put", "signal") if op.name == "pws" else (op.name,))
    ]
    assert check_plan(again, [check_sizes(again)[0]], ["fp32"], back_to_back=1).ok  # one launch, as it was proved


def test_the_op_table_covers_every_op_mscclpp_parses():
    assert set(OPS) | set(SWITCH_OPS) == OP_NAMES  # the rest of the corpus's names (glre) MSCCL++ itself refuses
    for path in sorted(CORPUS.glob("*.json")):
        for gpu in json.loads(path.read_text())["gpus"]:
            for tb in gpu["threadblocks"]:
                assert {op["name"] for op in tb["ops"]} <= OP_NAMES | {"glre"}


def test_16_rank_plans_fit_mscclpp_s_fixed_limits():
    # dgx2's direct all-reduce sums 16 entries (MSCCL++'s Operation holds 10): codegen sums 10, then adds the rest;
    # its ring all-reduce runs 90 ops per thread block (MSCCL++ holds 64): the block continues in a new one
    direct = _written("dgx2", "direct", "allreduce", protocol="simple")
    ring = _written("dgx2", "ring", "allreduce", protocol="simple")
    for doc in (direct, ring):
        assert conformance_errors(doc) == [] and mscclpp_verdict(doc) == "MSCCL++'s executor reads it"
    sums = [op for tb in direct["gpus"][0]["threadblocks"] for op in tb["ops"] if op["name"] in ("re", "rre")]
    assert max(len(op["src_buff"]) for op in sums) == 10
    tbs = ring["gpus"][0]["threadblocks"]
    assert tbs[0]["ops"][-1]["name"] == "sem_release" and tbs[-1]["ops"][0]["name"] == "sem_acquire"
    assert check_plan(parse_plan(ring, "ring.json"), [check_sizes(parse_plan(ring, "r"))[0]], ["fp32"]).ok


def test_a_pull_plan_s_get_is_named_where_mscclpp_would_swap_its_offsets():
    # MSCCL++'s handleGet adds the source's offset to the destination buffer and the reverse; a pull all-gather
    # reads the peer's input chunk 0 into its output chunk 1, which MSCCL++ would run the other way round
    doc = _written("hgx_h200:gpus=2", "direct", "allgather", protocol="simple", pull=True)
    assert "differs from src_buff[0].index 0; MSCCL++'s handleGet" in mscclpp_verdict(doc)
