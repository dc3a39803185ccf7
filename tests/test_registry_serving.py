"""Select serves only what fits and what was proven (issue 39.1), backends fail in one line (39.3), and a commit
killed at its rename is found and repaired (issue 41).

Plans are real: the 2-rank all-pairs all-reduce fixture (committed for hgx_h200:gpus=2) and, where a plan must not
fit, a 4-rank direct all-reduce compiled for hgx_h200:gpus=4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry.pack import unpack
from registry.store import Registry, RegistryError, entry_id
from schedules.collectives import Collective
from schedules.plan.io import parse_plan
from weft.cli import main

ROOT = Path(__file__).parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "plans" / "allpairs_allreduce_2.json"
H200X2 = "hgx_h200:gpus=2"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def committed(tmp_path: Path, capsys) -> tuple[Path, str]:
    """A registry holding the fixture plan, committed for 2×H200 (proven on this machine as it commits)."""
    registry = tmp_path / "registry"
    code, out, _ = run(["registry", "commit", str(FIXTURE), "-t", H200X2, "--registry", str(registry)], capsys)
    assert code == 0
    return registry, out.split()[1]


def four_rank_plan_doc() -> dict:
    """A 4-rank direct all-reduce plan with its ``weft`` block removed (so it names no topology of its own)."""
    from codegen import compile_schedule
    from schedules.collectives import Collective
    from synth import baselines
    from topologies import resolve

    topology = resolve("hgx_h200:gpus=4")
    doc = compile_schedule(baselines.direct(topology, Collective("allreduce", 4)), topology).to_json()
    del doc["weft"]
    return doc


def fake_commit(registry: Path, doc: dict, topology: str, name: str = "hgx_h200:gpus=2") -> str:
    """Commit ``doc`` through the library, with a verification record that says it passed (as a forger would)."""
    plan = parse_plan(doc, "plan")
    provenance = {
        "solver": "direct",
        "weft_version": "test",
        "topology_name": name,
        "verification": {"ok": True, "plan_hash": plan.content_hash, "dtypes": ["fp32"]},
    }
    return Registry(registry).commit(plan, topology, provenance, {1024: 5.0, 1 << 30: 5e4}).id


# ---- what fits --------------------------------------------------------------------------------------------------
def test_a_four_rank_plan_is_refused_at_commit_for_two_gpus(tmp_path, capsys):
    plan = tmp_path / "four.json"
    plan.write_text(json.dumps(four_rank_plan_doc()))
    code, _, err = run(["registry", "commit", str(plan), "-t", H200X2, "--registry", str(tmp_path / "r")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "4 ranks, but topology hgx_h200:gpus=2 has 2" in err
    assert not (tmp_path / "r" / "entries").exists()


def test_a_four_rank_plan_keyed_for_two_gpus_is_not_selected_nor_imported(tmp_path, capsys):
    from topologies import resolve

    registry = tmp_path / "forged"
    fake_commit(registry, four_rank_plan_doc(), resolve(H200X2).fingerprint)
    code, out, _ = run(
        ["registry", "select", "allreduce", "-t", H200X2, "--size", "1MB", "--registry", str(registry)], capsys
    )
    assert code == 1 and out.startswith("no plan: no allreduce plan for hgx_h200:gpus=2 at 1MB")
    assert run(["registry", "export", str(tmp_path / "out"), "--registry", str(registry)], capsys)[0] == 0
    code, _, err = run(["registry", "import", str(tmp_path / "out"), "--registry", str(tmp_path / "r")], capsys)
    assert code == 2 and "4 ranks, but topology hgx_h200:gpus=2 has 2" in err
    assert not (tmp_path / "r" / "entries").exists()


# ---- what was proven --------------------------------------------------------------------------------------------
def forge(registry: Path, id: str, op: str = "re") -> str:
    """Drop rank 0's first ``op`` from the entry's plan (its reduction: a wrong all-reduce that still parses) and
    recompute every hash, the id and the index, as someone with write access to a shared registry could."""
    path = registry / "entries" / f"{id}.json"
    doc = unpack(json.loads(path.read_text()), str(path))  # the whole plan (a /1 document, which weft reads too)
    ops = next(b["ops"] for b in doc["plan"]["gpus"][0]["threadblocks"] if any(o["name"] == op for o in b["ops"]))
    del ops[next(i for i, o in enumerate(ops) if o["name"] == op)]
    del doc["plan"]["weft"]["hash"]
    plan = parse_plan(doc["plan"], "forged")
    doc["plan"]["weft"]["hash"] = plan.content_hash
    doc["plan"]["weft"].get("verification", {})["plan_hash"] = plan.content_hash
    doc["provenance"]["verification"]["plan_hash"] = plan.content_hash
    doc["id"] = entry_id(plan, doc["key"]["topology"])
    path.unlink()
    (registry / "entries" / f"{doc['id']}.json").write_text(json.dumps(doc))
    Registry(registry).rebuild_index()
    return doc["id"]


def test_a_forged_entry_is_refused_at_select_before_it_runs(tmp_path, capsys):
    registry, id = committed(tmp_path, capsys)
    forged = forge(registry, id)
    assert Registry(registry).get(forged).plan.nranks == 2  # the forgery reads as a good entry
    code, out, err = run(
        ["registry", "select", "allreduce", "-t", H200X2, "--size", "1MB", "--registry", str(registry)], capsys
    )
    assert code == 1 and out.startswith("no plan:")
    assert f"refused {forged}: its plan failed on the reference executor" in err
    sel = Registry(registry).select(Registry(registry).get(forged).key.topology, "allreduce", 1 << 20)
    assert sel.entry is not None and sel.entry.id == forged  # without the proof, the forgery would have served


def committed_for_inference(tmp_path: Path) -> tuple[Path, str]:
    """A registry holding a one-shot LL all-reduce for 2×H200, which the torch communicators may serve (it runs
    back to back on the same buffers: ``safe_back_to_back``)."""
    from synth import baselines
    from topologies import resolve
    from weft import publish
    from weft.pipeline import compile_and_verify

    topology, registry = resolve(H200X2), tmp_path / "registry"
    schedule = baselines.direct(topology, Collective("allreduce", 2))
    entry = publish.commit(compile_and_verify(schedule, topology, protocol="ll"), topology, str(registry), schedule)
    return registry, entry.id


def plan_choice(registry: Path, **options):
    """What the torch communicators ask on a 2×H200 machine."""
    from executor.inference.plans import PlanChoice
    from topologies import resolve

    return PlanChoice(Registry(registry), resolve(H200X2).fingerprints, 2, **options)


def test_a_forged_entry_is_refused_by_the_torch_plan_choice_before_it_runs(tmp_path):
    registry, id = committed_for_inference(tmp_path)
    forged = forge(registry, id, "repkt")
    choice = plan_choice(registry)
    assert [e.id for e in choice.entries] == [forged]  # the forgery reads as a good entry, back to back included
    assert choice.plan("allreduce", 4096, "bf16") is None
    assert choice.reason("allreduce", 4096, "bf16").startswith(
        f"refused: {forged}: its plan failed on the reference executor"
    )


def test_the_torch_plan_choice_serves_a_proven_plan_and_proves_it_once_per_machine(tmp_path, monkeypatch):
    from executor.reference import proofs

    registry, id = committed_for_inference(tmp_path)
    monkeypatch.setenv("WEFT_PROOFS", str(tmp_path / "another-machine"))
    calls = []

    def trust(plan):
        return proofs.proven(plan, prove=lambda p, _: calls.append(p.name) or proofs.prove(p))

    for _ in range(2):  # two jobs on this machine, each asking at two sizes
        choice = plan_choice(registry, trust=trust)
        assert [choice.plan("allreduce", n, "bf16") is not None for n in (4096, 64 << 10)] == [True, True]
    assert calls == [Registry(registry).get(id).plan.name]


def test_a_plan_is_proven_once_per_machine_then_costs_nothing(tmp_path, capsys, monkeypatch):
    from weft import publish

    registry, id = committed(tmp_path, capsys)
    copy = tmp_path / "copy"  # the same entry file, as a shared folder hands it to another machine
    (copy / "entries").mkdir(parents=True)
    (copy / "entries" / f"{id}.json").write_bytes((registry / "entries" / f"{id}.json").read_bytes())
    monkeypatch.setenv("WEFT_PROOFS", str(tmp_path / "another-machine"))
    calls = []
    prove = getattr(publish.verify, "__wrapped__", publish.verify)  # the proof itself, not the run's cache of it
    monkeypatch.setattr(publish, "verify", lambda plan, *a, **k: calls.append(plan.name) or prove(plan, *a, **k))
    for _ in range(3):
        code, out, _ = run(
            ["registry", "select", "allreduce", "-t", H200X2, "--size", "4KB", "--registry", str(copy)], capsys
        )
        assert code == 0 and out.startswith(id)
    assert calls == ["allpairs_allreduce_2"]


@pytest.mark.parametrize("time_us", [1e-300, 0.0, -1.0, float("nan"), float("inf")])
def test_a_measured_time_outside_physical_sense_is_refused(tmp_path, capsys, time_us):
    registry, id = committed(tmp_path, capsys)
    with pytest.raises(
        RegistryError,
        match="timings.measured_us.1024: must be a size in bytes mapped to a positive, "
        "finite time in µs that a GPU can measure",
    ):
        Registry(registry).record_timing(id, 1024, time_us)
    path = registry / "entries" / f"{id}.json"
    doc = json.loads(path.read_text())
    doc["timings"]["measured_us"] = {"1024": time_us}
    path.write_text(json.dumps(doc))  # written by hand: the entry is skipped as unreadable, never served
    code, _, err = run(
        ["registry", "select", "allreduce", "-t", H200X2, "--size", "1KB", "--registry", str(registry)], capsys
    )
    assert code == 1 and "timings.measured_us.1024" in err


def test_a_measured_time_below_the_fabrics_latency_is_refused_at_select(tmp_path, capsys):
    registry, id = committed(tmp_path, capsys)
    Registry(registry).record_timing(id, 1024, 0.05)  # a GPU could time it, but 2×H200's crossing takes 0.3 µs
    code, out, err = run(
        ["registry", "select", "allreduce", "-t", H200X2, "--size", "1KB", "--registry", str(registry)], capsys
    )
    assert code == 1 and f"refused {id}: measured 0.05 µs, below the fabric's latency (0.3 µs)" in err


# ---- backends ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1/registry", "zip://x", "reference://", "data:,{}"])
def test_every_backend_error_is_one_line(tmp_path, capsys, monkeypatch, url):
    monkeypatch.chdir(tmp_path)  # zip:// opens its archive relative to here
    for argv in (["registry", "list"], ["registry", "commit", str(FIXTURE), "-t", H200X2]):
        code, _, err = run([*argv, "--registry", url], capsys)
        if url == "data:,{}" and argv[1] == "list":
            assert code == 0  # an empty, read-only registry lists nothing
            continue
        assert code == 2 and err.count("\n") == 1 and err.startswith(f"weft: error: registry {url}: cannot ")


def test_an_unwritable_location_fails_at_once(capsys):
    start = time.monotonic()
    code, _, err = run(["registry", "commit", str(FIXTURE), "-t", H200X2, "--registry", "/proc/self"], capsys)
    assert code == 2 and err.startswith("weft: error: registry /proc/self: cannot write")
    assert time.monotonic() - start < 30  # it waited 120 s for a lock it could never take (the proof runs first)


# ---- a commit killed at its rename -----------------------------------------------------------------------------
KILL_AT_RENAME = """
import os, sys
import registry.store as registry
renames = []
def killed(fs, src, dst):
    renames.append(dst)
    if len(renames) == int(sys.argv[2]):
        os._exit(9)  # as SIGKILL would: no cleanup runs
    os.replace(src, dst)
registry._rename = killed
from weft import publish
publish.commit_file(sys.argv[1], "hgx_h200:gpus=2", sys.argv[3])
"""


@pytest.mark.parametrize("killed_at, orphan", [(1, "entries"), (2, "")])
def test_a_commit_killed_at_its_rename_is_found_by_verify_and_repaired_by_rebuild_index(
    tmp_path, capsys, killed_at, orphan
):
    """The first rename puts the entry in place, the second the index: killed at the first, the entry's temporary
    file is left; at the second, the entry is in but its index row is not, and the index's temporary file is left."""
    registry = tmp_path / "registry"
    done = subprocess.run(
        [sys.executable, "-c", KILL_AT_RENAME, str(FIXTURE), str(killed_at), str(registry)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 9, done.stderr[-2000:]
    left = [p for p in registry.rglob("*.tmp-*")]
    assert [p.parent.name for p in left] == [orphan or registry.name]
    code, out, _ = run(["registry", "verify", "--json", "--registry", str(registry)], capsys)
    report = json.loads(out)
    assert code == 1 and report["orphans"] == [left[0].name]
    entries = list((registry / "entries").glob("*.json"))
    if killed_at == 2:
        assert report["index"] == [f"index.json: no row for entry {entries[0].stem}"] and report["ok"] == 1
    code, out, _ = run(["registry", "rebuild-index", "--registry", str(registry)], capsys)
    assert code == 0 and "1 orphaned temporary file removed" in out
    assert not list(registry.rglob("*.tmp-*"))
    code, out, _ = run(["registry", "verify", "--json", "--registry", str(registry)], capsys)
    assert code == 0 and json.loads(out)["orphans"] == [] and json.loads(out)["index"] == []
    assert len(Registry(registry).index()["entries"]) == len(entries)


@pytest.mark.parametrize("folder", ["/dev", "empty"])
def test_importing_a_folder_without_plans_says_so(tmp_path, capsys, folder):
    if folder == "empty":
        folder = str(tmp_path / "empty")
        os.mkdir(folder)
    code, _, err = run(["registry", "import", folder, "--registry", str(tmp_path / "r")], capsys)
    assert (
        code == 2
        and err
        == f"weft: error: registry import {folder}: no plan or exported entry files (*.json) "
        "in it; `weft registry export DIR` writes them\n"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("side", ["index.json", "baselines.json"])
def test_a_folder_in_place_of_a_side_file_refuses_a_write_whole(tmp_path, capsys, side):
    registry, id = committed(tmp_path, capsys)
    entry = (registry / "entries" / f"{id}.json").read_bytes()
    (registry / side).unlink(missing_ok=True)
    (registry / side).mkdir()
    plan_hash = Registry(registry).get(id).plan.content_hash
    rows = [{"size": 1024, "nccl_us": 9.0, "wrong": 0, "plans_us": {plan_hash: 3.0}}]
    (tmp_path / "results.json").write_text(json.dumps({"collective": "allreduce", "rows": rows}))
    code, _, err = run(["registry", "record", str(tmp_path / "results.json"), "--registry", str(registry)], capsys)
    assert (
        code == 2
        and err
        == f"weft: error: registry {registry}: {side}: not a regular file; move it away "
        "(`weft registry rebuild-index` then makes it afresh)\n"
    )
    assert (registry / "entries" / f"{id}.json").read_bytes() == entry  # nothing written
