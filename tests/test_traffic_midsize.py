"""bench/traffic_midsize.py: the mid-size fit of the traffic model and its committed predictions (issue 33)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from _bench import bench_script

from schedules.traffic import MIDSIZE_H200X4, predict_us

ROOT = Path(__file__).parent.parent
PREDICTIONS = ROOT / "bench" / "results" / "traffic_predictions_midsize_4xh200.json"


@pytest.mark.parametrize(
    "name",
    [
        "twoshot-allreduce-hgx_h200:gpus=4-ll-x32-t512-max8MB",
        "direct-allreduce-hgx_h200:gpus=4-simple-x64-p2-t512-2s-mp",
        "twoshot-allreduce-hgx_h200:gpus=4-simple-x128-pull-mp",
        "twoshot-allreduce-hgx_h200:gpus=4-lamport-x16-max16MB",
    ],
)
def test_a_measured_plan_is_compiled_again_from_its_name(name):
    script = bench_script("traffic_midsize")
    assert script.compiled(*script.options_of(name)).name == name


def test_the_committed_predictions_are_the_models_own():
    doc = json.loads(PREDICTIONS.read_text())
    assert doc["parameters"] == asdict(MIDSIZE_H200X4)
    script = bench_script("traffic_midsize")
    row = next(r for r in doc["predictions"] if r["plan"] == doc["winners"][str(16 << 20)][0])
    plan = script.compiled(*script.options_of(row["plan"]))
    assert predict_us(plan, row["size"], MIDSIZE_H200X4) == pytest.approx(row["predicted_us"], abs=0.01)


def test_every_predicted_size_ranks_the_shapes_fastest_first():
    doc = json.loads(PREDICTIONS.read_text())
    for size, plans in doc["winners"].items():
        times = {r["plan"]: r["predicted_us"] for r in doc["predictions"] if r["size"] == int(size)}
        ranked = [times[p] for p in plans]
        assert ranked == sorted(ranked) and ranked[0] == min(times.values())
