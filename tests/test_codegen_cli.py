"""``weft compile`` and ``weft verify``, and the pipeline behind them: nothing is written unless it passed."""

import json
from pathlib import Path

import pytest

from schedules.collectives import Collective
from schedules.plan.io import load_plan
from schedules.plan.types import PlanError
from schedules.schedule import Schedule, Send, Step, save_schedule
from synth import baselines
from topologies.catalog import build
from weft import pipeline
from weft.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "plans"


@pytest.fixture()
def ring_schedule(tmp_path) -> Path:
    path = tmp_path / "ring.json"
    save_schedule(baselines.ring(build("ring:n=4"), Collective("allreduce", 4)), path)
    return path


def test_compile_writes_a_verified_plan(ring_schedule, tmp_path, capsys):
    out = tmp_path / "ring.plan.json"
    assert main(["compile", str(ring_schedule), "-t", "ring:n=4", "--instances", "2", "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    plan = load_plan(out)
    assert summary["plan_hash"] == plan.content_hash and plan.weft.instances == 2
    assert plan.weft.verification["ok"] and plan.weft.verification["plan_hash"] == plan.content_hash
    assert plan.weft.verification["dtypes"] == ["fp32", "fp16", "bf16"] and len(plan.weft.verification["sizes"]) == 3


def test_compile_to_msccl_xml(ring_schedule, tmp_path):
    out = tmp_path / "ring.xml"
    assert main(["compile", str(ring_schedule), "-t", "ring:n=4", "--format", "msccl-xml", "-o", str(out)]) == 0
    assert out.read_text().startswith('<algo name="ring-allreduce-ring')


def test_compile_for_the_wrong_topology_writes_nothing(ring_schedule, tmp_path, capsys):
    out = tmp_path / "x.plan.json"
    assert main(["compile", str(ring_schedule), "-t", "fully_connected:n=4", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("weft: error: ") and err.count("\n") == 1 and not out.exists()


def test_compile_bad_input_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "weft.schedule/1"}')
    assert main(["compile", str(bad), "-t", "ring:n=4", "-o", str(tmp_path / "o.json")]) == 2
    assert main(["compile", str(bad), "-t", "ring:n=4", "--instances", "0", "-o", str(tmp_path / "o.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 2 and not (tmp_path / "o.json").exists()


def test_verify_a_hand_written_plan(capsys):
    assert main(["verify", str(FIXTURES / "allpairs_allreduce_2_ll.json"), "--sizes", "8,1KB+8", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["ok"] and record["sizes"] == [8, 1032] and len(record["checks"]) == 6


def test_verify_a_broken_plan_is_exit_1(tmp_path, capsys):
    doc = json.loads((FIXTURES / "allpairs_allreduce_2.json").read_text())
    doc["gpus"][1]["threadblocks"][0]["ops"].pop(1)  # a signal nobody sends: rank 0 waits forever
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc))
    assert main(["verify", str(path)]) == 1
    assert "deadlock" in capsys.readouterr().err


def test_verify_a_schedule_needs_a_topology(ring_schedule, capsys):
    assert main(["verify", str(ring_schedule)]) == 2
    assert main(["verify", str(ring_schedule), "-t", "ring:n=4"]) == 0
    assert "ok" in capsys.readouterr().out


def test_verify_a_wrong_schedule_is_exit_1(tmp_path):
    wrong = Schedule(Collective("allgather", 2), build("ring:n=2").fingerprint, (Step(1, (Send(0, 0, 1),)),))
    path = tmp_path / "wrong.json"
    save_schedule(wrong, path)
    assert main(["verify", str(path), "-t", "ring:n=2"]) == 1


def test_save_plan_refuses_an_unverified_plan(tmp_path):
    from codegen import compile_schedule

    topology = build("ring:n=4")
    plan = compile_schedule(baselines.ring(topology, Collective("allgather", 4)), topology)
    with pytest.raises(PlanError, match="no passing verification record"):
        pipeline.save_plan(plan, tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_compile_and_verify_records_predictions_and_checks():
    topology = build("fully_connected:n=4")
    plan = pipeline.compile_and_verify(baselines.direct(topology, Collective("allreduce", 4)), topology)
    # the table `synth --commit` stores (issue 38): 1 KB to 1 GB in powers of 4, and what made it
    assert plan.protocol == "LL" and list(plan.weft.predicted_us) == [
        "1KB",
        "4KB",
        "16KB",
        "64KB",
        "256KB",
        "1MB",
        "4MB",
        "16MB",
        "64MB",
        "256MB",
        "1GB",
    ]
    assert plan.weft.prediction.startswith("alpha-beta model")
    assert pipeline.is_verified(plan)


@pytest.mark.parametrize("fmt", ["plan", "msccl-xml"])
def test_compile_to_an_unwritable_path_is_one_line_naming_it(ring_schedule, tmp_path, capsys, fmt):
    (tmp_path / "taken").write_text("a file, not a folder")
    (tmp_path / "folder").mkdir()
    for out in (tmp_path / "taken" / "x.json", tmp_path / "folder"):
        assert main(["compile", str(ring_schedule), "-t", "ring:n=4", "--format", fmt, "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("weft: error: ") and err.count("\n") == 1 and "Traceback" not in err
        assert str(out.parent if out.parent.name == "taken" else out) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "ring.json", "taken"]
    assert list((tmp_path / "folder").iterdir()) == []


@pytest.mark.parametrize(
    "field, value, where",
    [
        (("gpus", 0, "output_chunks"), 2**70, "gpus[0].output_chunks: at most"),
        (("weft", "predicted_us", "1KB"), "fast", "weft.predicted_us.1KB: must be a time in µs"),
    ],
)
def test_a_plan_field_out_of_range_is_one_line_naming_the_file_and_field(tmp_path, capsys, field, value, where):
    doc = json.loads((FIXTURES / "allpairs_allreduce_2_ll.json").read_text())
    doc.setdefault("weft", {}).setdefault("predicted_us", {})
    target = doc
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    bad = tmp_path / "bad.plan.json"
    bad.write_text(json.dumps(doc))
    for argv in (
        ["verify", str(bad)],
        ["registry", "commit", str(bad), "-t", "hgx_h200:gpus=2", "--registry", str(tmp_path / "reg")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"weft: error: plan {bad}: {where}") and err.count("\n") == 1
    assert not (tmp_path / "reg").exists()


def test_verify_refuses_a_negative_seed_in_one_line(capsys):
    assert main(["verify", str(FIXTURES / "allpairs_allreduce_2_ll.json"), "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "weft: error: weft verify: --seed must be a non-negative integer, got -1\n"


@pytest.mark.parametrize("key, value", [("options", "abc"), ("predicted_us", 3), ("solve_time", "slow")])
def test_a_malformed_schedule_meta_field_is_one_line_naming_it(ring_schedule, tmp_path, capsys, key, value):
    doc = json.loads(ring_schedule.read_text())
    doc["meta"][key] = value
    ring_schedule.write_text(json.dumps(doc))
    for argv in (
        ["verify", str(ring_schedule), "-t", "ring:n=4"],
        ["compile", str(ring_schedule), "-t", "ring:n=4", "-o", str(tmp_path / "o.json")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"weft: error: schedule {ring_schedule}: meta.{key}: must be ") and err.count("\n") == 1
    assert not (tmp_path / "o.json").exists()
