"""The main job end to end: synth --commit into a registry, then list, select, verify, export, import, remove."""

from __future__ import annotations

import json
import math

import pytest

from weft.cli import main


@pytest.fixture
def registry(tmp_path, monkeypatch):
    path = tmp_path / "registry"
    monkeypatch.setenv("WEFT_REGISTRY", str(path))
    return path


def committed_id(capsys) -> str:
    out = capsys.readouterr().out
    return next(
        w for line in out.splitlines() if "committed as" in line for w in [line.split("committed as ")[1].split()[0]]
    )


def test_synth_commit_then_select_and_verify(registry, capsys):
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    entry = committed_id(capsys)
    assert (registry / "entries" / f"{entry}.json").exists()
    assert main(["registry", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["id"] for e in listed] == [entry]
    assert main(["registry", "select", "-t", "ring:n=4", "allreduce", "--size", "4MB", "--json"]) == 0
    sel = json.loads(capsys.readouterr().out)
    assert sel["entry"] == entry and sel["basis"] == "predicted"
    assert main(["registry", "verify"]) == 0
    assert "1 ok, 0 bad" in capsys.readouterr().out


def test_select_for_another_topology_finds_no_plan(registry, capsys):
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    capsys.readouterr()
    assert main(["registry", "select", "-t", "fully_connected:n=4", "allreduce", "--size", "4MB"]) == 1
    assert "no plan" in capsys.readouterr().out


def test_verify_reports_a_corrupted_entry_and_select_skips_it(registry, capsys):
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    good = committed_id(capsys)
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", "direct", "--commit"]) in (0, 2)
    capsys.readouterr()
    bad = registry / "entries" / "broken.json"
    bad.write_text("{ not json")
    assert main(["registry", "verify"]) == 1
    out = capsys.readouterr().out
    assert "BAD broken" in out and f"ok  {good}" in out
    assert main(["registry", "select", "-t", "ring:n=4", "allgather", "--size", "1MB", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["entry"] is not None
    assert "broken.json" in captured.err
    # export writes the good entry, names the bad one and exits 1, as verify and rebuild-index do
    assert main(["registry", "export", str(registry.parent / "exported")]) == 1
    captured = capsys.readouterr()
    assert "broken" in captured.err and "1 unreadable skipped" in captured.out
    assert (registry.parent / "exported" / f"{good}.json").exists()


def test_export_then_import_into_another_registry(registry, tmp_path, capsys):
    assert main(["synth", "reducescatter", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    entry = committed_id(capsys)
    out_dir = tmp_path / "exported"
    assert main(["registry", "export", str(out_dir)]) == 0
    other = tmp_path / "other"
    assert main(["registry", "import", str(out_dir), "--registry", str(other)]) == 0
    assert (other / "entries" / f"{entry}.json").exists()
    assert main(["registry", "remove", entry, "--registry", str(other)]) == 0
    assert not (other / "entries" / f"{entry}.json").exists()


def exported_folder(tmp_path, capsys) -> tuple:
    """A folder holding one exported entry (a reducescatter ring plan), and that entry's id."""
    assert main(["synth", "reducescatter", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    entry = committed_id(capsys)
    out_dir = tmp_path / "exported"
    assert main(["registry", "export", str(out_dir)]) == 0
    capsys.readouterr()
    return out_dir, entry


def tampered_plan(tmp_path) -> dict:
    """A compiled plan with its waits removed, so every receive races: the reference executor refuses it."""
    plan_dir = tmp_path / "out"
    assert (
        main(["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "--compile", "-o", str(plan_dir / "s.json")])
        == 0
    )
    doc = json.loads(next(plan_dir.glob("*.plan.json")).read_text())
    for gpu in doc["gpus"]:
        for tb in gpu["threadblocks"]:
            tb["ops"] = [op for op in tb["ops"] if op["name"] != "wait"]
    return doc


@pytest.mark.parametrize(
    "bad, code, message",
    [
        (
            '{"format": 7}',
            2,
            "registry import {}: format: must be 'weft.registry-entry/2' or 'weft.registry-entry/1' "
            "(an exported entry) or absent",
        ),
        ('{"format": ["weft.registry-entry/1"]}', 2, "registry import {}: format: must be 'weft.registry-entry/2'"),
        ("[1]", 2, "plan {}: (top level): must be an object"),
        ("{", 2, "registry import {}: not valid JSON"),
    ],
)
def test_a_bad_file_in_an_import_folder_is_one_line_and_commits_nothing(registry, tmp_path, capsys, bad, code, message):
    out_dir, entry = exported_folder(tmp_path, capsys)
    path = out_dir / "zz-last.json"  # sorted after the good entry, which must not be committed either
    path.write_text(bad)
    other = tmp_path / "other"
    assert main(["registry", "import", str(out_dir), "--registry", str(other)]) == code
    err = capsys.readouterr().err
    assert err.startswith("weft: error: " + message.format(path)) and err.count("\n") == 1
    assert not (other / "entries").exists() or not any((other / "entries").iterdir())


def test_a_plan_that_fails_verification_in_an_import_folder_commits_nothing(registry, tmp_path, capsys):
    out_dir, entry = exported_folder(tmp_path, capsys)
    (out_dir / "zz-racy.plan.json").write_text(json.dumps(tampered_plan(tmp_path)))
    capsys.readouterr()
    other = tmp_path / "other"
    assert main(["registry", "import", str(out_dir), "--registry", str(other)]) in (1, 2)
    assert capsys.readouterr().err.count("\n") == 1
    assert not (other / "entries").exists() or not any((other / "entries").iterdir())


def test_committing_a_tampered_plan_is_refused_and_writes_nothing(registry, tmp_path, capsys):
    plan_dir = tmp_path / "out"
    assert (
        main(["synth", "allgather", "-t", "ring:n=4", "--method", "ring", "--compile", "-o", str(plan_dir / "s.json")])
        == 0
    )
    plan_file = next(plan_dir.glob("*.plan.json"))
    doc = json.loads(plan_file.read_text())
    for gpu in doc["gpus"]:
        for tb in gpu["threadblocks"]:
            tb["ops"] = [op for op in tb["ops"] if op["name"] != "wait"]  # no waits: every receive now races
    plan_file.write_text(json.dumps(doc))
    code = main(["registry", "commit", str(plan_file)])
    assert code in (1, 2)
    assert not (registry / "entries").exists() or not any((registry / "entries").iterdir())


def test_select_with_ll128_says_where_lines_run(capsys):
    """The committed 2xH200 registry holds LL plans measured both ways; at 1 MB lines won by over 2 µs."""
    from pathlib import Path

    committed = str(Path(__file__).parent.parent / "bench" / "registry_h200x2")
    base = ["registry", "select", "-t", "hgx_h200:gpus=2", "allreduce", "--registry", committed, "--json"]
    picks = {}
    for size, ll128 in (("1MB", True), ("1MB", False)):
        assert main([*base, "--size", size, *(["--ll128"] if ll128 else [])]) == 0
        picks[size, ll128] = json.loads(capsys.readouterr().out)
    assert picks["1MB", True]["lines"] and not picks["1MB", False]["lines"]
    assert picks["1MB", True]["time_us"] < picks["1MB", False]["time_us"]


def test_export_into_a_path_under_a_file_is_one_line(registry, tmp_path, capsys):
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    (tmp_path / "taken").write_text("a file")
    capsys.readouterr()
    assert main(["registry", "export", str(tmp_path / "taken" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weft: error: registry export ") and err.count("\n") == 1 and "taken" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["list"],
        ["rebuild-index"],
        ["remove", "x"],
        ["export", "out"],
        ["select", "allreduce", "-t", "ring:n=4", "--size", "1MB"],
    ],
)
def test_a_registry_location_that_is_a_file_is_one_line(tmp_path, capsys, argv):
    (tmp_path / "reg").write_text("a file")
    assert main(["registry", *argv, "--registry", str(tmp_path / "reg")]) == 2
    err = capsys.readouterr().err
    assert err == f"weft: error: registry {tmp_path / 'reg'}: not a directory\n"


def test_a_registry_that_cannot_be_created_is_one_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file")
    location = tmp_path / "taken" / "reg"
    assert (
        main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--commit", "--registry", str(location)]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"weft: error: registry {location}: cannot write: ") and err.count("\n") == 1


@pytest.mark.parametrize("id_", ["../index", "../baselines", "/etc/passwd", ".lock", ""])
def test_remove_and_show_take_entry_ids_only_never_other_files(registry, capsys, id_):
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    before = sorted(p.relative_to(registry) for p in registry.rglob("*"))
    capsys.readouterr()
    for command in ("remove", "show"):
        assert main(["registry", command, id_]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"weft: error: registry {registry}: no entry ") and err.count("\n") == 1
    assert sorted(p.relative_to(registry) for p in registry.rglob("*")) == before


def _commit_and_corrupt(registry, capsys, field: str, value) -> str:
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--commit"]) == 0
    entry = committed_id(capsys)
    path = registry / "entries" / f"{entry}.json"
    doc = json.loads(path.read_text())
    section, _, name = field.partition(".")
    if name:
        doc[section][name] = value
    else:
        doc[section] = value
    path.write_text(json.dumps(doc))
    return entry


@pytest.mark.parametrize(
    "field, value",
    [
        ("provenance.verification", "ok"),
        ("timings", []),
        ("timings.predicted_us", {"1024": 0}),
        ("timings.measured_us", {"1024": "fast"}),
        ("timings.predicted_us", {"1KB": 3.0}),
        ("timings.measured_us", [1]),
    ],
)
def test_a_malformed_entry_field_is_one_line_naming_the_file_and_field(registry, capsys, field, value):
    entry = _commit_and_corrupt(registry, capsys, field, value)
    assert main(["registry", "show", entry]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weft: error: registry entry ") and err.count("\n") == 1
    assert f"{entry}.json: {field}" in err
    assert main(["registry", "select", "-t", "ring:n=4", "allreduce", "--size", "1MB"]) == 1  # skipped, said so
    captured = capsys.readouterr()
    assert "no plan" in captured.out and f"{entry}.json: {field}" in captured.err


def test_select_of_an_entry_without_times_says_so(registry, capsys):
    _commit_and_corrupt(registry, capsys, "timings", {})
    assert main(["registry", "select", "-t", "ring:n=4", "allreduce", "--size", "1MB"]) == 0
    assert "none (no time recorded) at 1MB" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["select", "allgathr", "-t", "ring:n=4", "--size", "1MB"],
        ["select", "allgather", "-t", "ring:n=4", "--size", "1MB", "--dtype", "fp64"],
        ["list", "--collective", "allgathr"],
    ],
)
def test_an_unknown_collective_or_dtype_is_bad_input_not_an_empty_answer(registry, capsys, argv):
    assert main(["registry", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice" in err


def test_show_and_remove_take_a_plan_name_where_it_names_one_entry(tmp_path, capsys):
    reg = str(tmp_path / "reg")
    for method in ("ring", "direct"):
        assert (
            main(
                [
                    "synth",
                    "allreduce",
                    "-t",
                    "fully_connected:n=4",
                    "--method",
                    method,
                    "--commit",
                    "--registry",
                    reg,
                    "-o",
                    str(tmp_path / f"{method}.json"),
                ]
            )
            == 0
        )
    capsys.readouterr()
    name = "ring-allreduce-fully_connected:n=4-simple-x1"
    assert main(["registry", "show", name, "--registry", reg]) == 0
    shown = capsys.readouterr().out
    entry_id = shown.split(":")[0]
    assert f"plan {name} (" in shown
    assert main(["registry", "remove", name, "--registry", reg]) == 0
    assert capsys.readouterr().out == f"removed {entry_id} ({name})\n"
    assert main(["registry", "show", name, "--registry", reg]) == 2
    assert f"no entry {name!r}" in capsys.readouterr().err


def test_compiled_times_from_a_bench_file_are_recorded_apart_and_selected_only_for_a_compiling_executor(
    tmp_path, capsys
):
    """`weft bench --compiled` on 2xH200 (bench/results/compiled_ab_2xh200/ar_compiled.json) timed every registry plan
    interpreted and as its own kernel in one job; recorded into a copy of the registry it ran from, a compiling
    executor's selection runs the fastest kernel and says so, and a plain one keeps the interpreter's times."""
    import shutil
    from pathlib import Path

    root = Path(__file__).parent.parent
    results = root / "bench" / "results" / "compiled_ab_2xh200" / "ar_compiled.json"
    registry = tmp_path / "registry"
    shutil.copytree(root / "bench" / "registry_h200x2", registry)
    assert main(["registry", "record", str(results), "--registry", str(registry)]) == 0
    capsys.readouterr()
    row = next(r for r in json.loads(results.read_text())["rows"] if r["size"] == 1024)
    base = ["registry", "select", "-t", "hgx_h200:gpus=2", "allreduce", "--size", "1KB", "--registry", str(registry)]
    picks = {}
    for compiled in (False, True):
        assert main([*base, "--ll128", "--json", *(["--compiled"] if compiled else [])]) == 0
        picks[compiled] = json.loads(capsys.readouterr().out)
    assert picks[True]["compiled"] and not picks[False]["compiled"]
    # each of the file's kernel times is stored apart, as the entry's compiled table at 1 KB
    from registry.store import Registry

    kept = {e.plan.content_hash: e for e in Registry(str(registry)).entries(collective="allreduce")}
    for plan_hash, us in row["plans_compiled_us"].items():
        if plan_hash in kept and "+" not in plan_hash:
            assert kept[plan_hash].timings.measured_compiled_us[1024] == pytest.approx(us)
    # and the pick is the fastest time any serving entry holds there, whichever job measured it (the registry's
    # later jobs, the eighteenth session's sweep with LL128 lines, hold faster kernels than this file's)
    best = min(e.timings.estimate(1024, True, True)[1] or math.inf for e in kept.values() if e.key.covers(1024))
    assert picks[True]["time_us"] == pytest.approx(best) and best <= min(row["plans_compiled_us"].values())
    assert picks[True]["time_us"] < picks[False]["time_us"]
    assert main([*base, "--compiled"]) == 0
    assert "+compiled  measured" in capsys.readouterr().out
    # an export carries the compiled times to another registry, whose selection is the same
    assert main(["registry", "export", str(tmp_path / "out"), "--registry", str(registry)]) == 0
    assert main(["registry", "import", str(tmp_path / "out"), "--registry", str(tmp_path / "other")]) == 0
    capsys.readouterr()
    other = [*base[:-1], str(tmp_path / "other")]
    assert main([*other, "--ll128", "--json", "--compiled"]) == 0
    assert json.loads(capsys.readouterr().out) == picks[True]
