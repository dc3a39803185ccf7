"""Every wait over 2 s says what it is doing, through a progress callback that only the CLI prints (stderr)."""

from __future__ import annotations

import json
from pathlib import Path

from schedules.calibration import CalibrationError
from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]
PLANS = (
    "direct-allreduce-hgx_h200:gpus=2-ll-x1",
    "twoshot-allreduce-hgx_h200:gpus=2-simple-x32",
    "direct-allreduce-hgx_h200:gpus=2-ll-x8",
    "direct-allreduce-hgx_h200:gpus=2-simple-x1",
)


def test_topo_calibrate_reports_each_results_file_and_the_fit(tmp_path, capsys, monkeypatch):
    doc = json.loads((ROOT / "bench" / "results" / "gpu_allreduce_bf16_graph_2xh200.json").read_text())
    for row in doc["rows"]:  # four of its plans: the plans are rebuilt for real
        row["median_us"] = {k: v for k, v in row["median_us"].items() if k[5:] in PLANS}
    small = tmp_path / "four_plans.json"
    small.write_text(json.dumps(doc))

    def no_fit(*args):  # the fit itself (seconds of least squares) is tests/test_calibration.py's
        raise CalibrationError("not fitted in this test")

    monkeypatch.setattr("weft.calibrate.fit", no_fit)
    monkeypatch.setattr("weft.cli.PROGRESS_AFTER_S", 0.0)  # as if the rebuild took seconds
    assert main(["topo", "calibrate", "hgx_h200:gpus=2", str(small)]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0] == "weft: calibrate: rebuilding the plans timed in four_plans.json"
    assert lines[1].startswith("weft: calibrate: fitting the model to ") and lines[1].endswith(" measurements")
    assert lines[2:] == ["weft: error: not fitted in this test"] and out == ""


def test_compile_reports_codegen_and_each_proof_on_stderr(tmp_path, capsys, monkeypatch):
    import weft.cli

    schedule = tmp_path / "trees.json"
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "trees", "-o", str(schedule)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(weft.cli, "PROGRESS_AFTER_S", 0.0)  # as if the compile took minutes
    assert main(["compile", str(schedule), "-t", "ring:n=4", "-o", str(tmp_path / "trees.plan.json")]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("weft: compiling trees-allreduce") and lines[1].startswith("weft: proving trees-")
    assert sum(": ok" in line for line in lines) == 9  # 3 sizes x 3 dtypes, one line each
    assert out.startswith("plan trees-allreduce")


def test_synth_commit_reports_every_plan_it_proves(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WEFT_REGISTRY", str(tmp_path / "registry"))
    assert (
        main(["synth", "allreduce", "-t", "fully_connected:n=4", "--method", "pareto", "--commit", "-o", str(tmp_path)])
        == 0
    )
    out, err = capsys.readouterr()
    committed = [line for line in out.splitlines() if "committed as" in line]
    assert len(committed) == sum(line.startswith("committing ") for line in err.splitlines()) >= 2
    assert sum(line.startswith("compiling ") for line in err.splitlines()) >= 2


def test_a_plan_narrowed_to_large_messages_is_proven_at_small_sizes_of_the_same_ops():
    import weft
    from weft import publish

    topo = weft.catalog("ring:n=4")
    plan = weft.compile(weft.synthesize(topo, "allreduce", "ring"), topo)
    large = publish.narrow(plan, 32 << 20, 0)
    record = large.weft.verification
    assert record["ok"] and record["plan_hash"] == large.content_hash != plan.content_hash
    assert max(record["sizes"]) < 1 << 20 <= large.min_message_size
    assert weft.commit(large, topo, weft.Registry("memory://narrowed")).plan.min_message_size == 32 << 20
