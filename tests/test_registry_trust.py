"""The registry is a trust boundary (issue 27): one test per defect, each on the committed registry or a copy.

A registry is input from someone else. Whatever an entry, index.json, baselines.json, a results file or a plan
holds, weft answers in one line, writes nothing when a command fails, never writes outside the folder it was
given, and never serves one collective's plan under another's key.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import threading
from pathlib import Path

import pytest

from registry.pack import unpack
from weft.cli import main

ROOT = Path(__file__).parent.parent
COMMITTED = ROOT / "bench" / "registry_h200x2"
COUNT = len(list((COMMITTED / "entries").glob("*.json")))  # the committed entries (other tests damage one of them)
RESULTS = ROOT / "bench" / "results" / "gpu_allreduce_bf16_graph_2xh200.json"
H200X2 = "topo-57fe5eed9a547d8b"


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"
    }


def kept(name: str) -> bool:
    """The committed registry's entries these tests keep: every allgather (the victims and their neighbours), and
    the smallest few all-reduce and reduce-scatter plans, among them ones the results file timed. Every command
    reads every entry, so the whole registry (84 entries, 7.8 MB) made this file a two-minute one."""
    collective = name.split("-", 1)[0]
    same = sorted((p.stat().st_size, p.name) for p in (COMMITTED / "entries").glob(f"{collective}-*.json"))
    return collective == "allgather" or name in {n for _, n in same[:4]}


@pytest.fixture(scope="module")
def committed_copy(tmp_path_factory, prove_once) -> Path:
    """One pristine copy of bench/registry_h200x2's entries that ``kept`` keeps, with their index and the whole
    baselines.json, per module; tests copy it again before changing it."""
    from registry.store import Registry

    path = tmp_path_factory.mktemp("pristine") / "registry"
    shutil.copytree(COMMITTED, path)
    for entry in (path / "entries").glob("*.json"):
        if not kept(entry.name):
            entry.unlink()
    Registry(path).rebuild_index()
    (path / ".lock").unlink(missing_ok=True)
    return path


def count(registry: Path) -> int:
    return len(list((registry / "entries").glob("*.json")))


@pytest.fixture
def registry(committed_copy, tmp_path) -> Path:
    path = tmp_path / "registry"
    shutil.copytree(committed_copy, path)
    return path


def listed(registry: Path) -> list[str]:
    code, out, _ = run(["registry", "list", "--json", "--registry", str(registry)])
    assert code == 0
    return [row["id"] for row in json.loads(out)]


def entry_file(registry: Path, collective: str) -> Path:
    return next(p for p in sorted((registry / "entries").glob(f"{collective}-*.json")))


def plan_of(entry: Path) -> dict:
    """The whole plan an entry file holds (a compact /2 entry packs its ops)."""
    return unpack(json.loads(entry.read_text()), str(entry))["plan"]


# ---- 1. record checks every write with the reader, and a failing record writes nothing ------------------------
def results_with(tmp_path: Path, change) -> Path:
    doc = json.loads(RESULTS.read_text())
    change(doc["rows"])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    return path


def set_plan_time(value):
    def change(rows):
        plan_hash = next(iter(rows[0]["plans_us"]))
        rows[0]["plans_us"][plan_hash] = value

    return change


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda rows: rows[0].update(size=0), "rows[0].size"),
        (lambda rows: rows[0].update(size=-4096), "rows[0].size"),
        (set_plan_time(-1.0), "rows[0].plans_us"),
        (set_plan_time(0), "rows[0].plans_us"),
        (set_plan_time(float("-inf")), "rows[0].plans_us"),
        (set_plan_time(float("nan")), "rows[0].plans_us"),
        (lambda rows: rows[3].update(nccl_us=-1), "rows[3].nccl_us"),
        (lambda rows: rows[3].update(nccl_us=0), "rows[3].nccl_us"),
        (lambda rows: rows[3].update(nccl_us=float("nan")), "rows[3].nccl_us"),
        (lambda rows: rows[3].update(plans_us={"55e5613838107e2c": {"us": 3}}), "rows[3].plans_us"),
        (lambda rows: rows[3].update(plans_ll128_us=True), "rows[3].plans_ll128_us"),
    ],
)
def test_a_bad_results_row_is_one_line_and_record_writes_nothing(registry, tmp_path, change, field):
    before = snapshot(registry)
    code, out, err = run(["registry", "record", str(results_with(tmp_path, change)), "--registry", str(registry)])
    assert code == 2 and out == ""
    assert err.startswith("weft: error: registry record ") and f"{field}" in err and err.count("\n") == 1
    assert snapshot(registry) == before


def test_a_good_record_keeps_every_entry_readable(tmp_path):
    """The issue's case on the whole committed registry: record once left 37 of its then 84 entries readable."""
    registry = tmp_path / "registry"
    shutil.copytree(COMMITTED, registry)
    code, out, err = run(["registry", "record", str(RESULTS), "--registry", str(registry)])
    assert code == 0 and err == "" and not out.startswith(f"{RESULTS}: 0 plan times")
    assert len(listed(registry)) == count(registry) == COUNT
    assert json.loads((registry / "baselines.json").read_text())["nccl_us"][H200X2]["allreduce"]


def test_a_plan_with_a_zero_prediction_commits_nothing(registry, tmp_path):
    doc = plan_of(entry_file(registry, "allgather"))
    doc["weft"]["predicted_us"] = {"1KB": 0}
    doc["name"] = "renamed"  # a plan not yet in the registry
    doc["weft"].pop("verification", None)
    doc["weft"].pop("hash", None)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(doc))
    before = snapshot(registry)
    code, _, err = run(["registry", "commit", str(plan), "--registry", str(registry)])
    assert code == 2 and "predicted_us" in err and err.count("\n") == 1
    assert snapshot(registry) == before


def test_nan_and_negative_nccl_times_are_refused_by_the_reader(registry, committed_copy):
    from registry.store import Registry, RegistryError

    reg = Registry(registry)
    for bad in (float("nan"), -1.0, 0.0, float("inf")):
        with pytest.raises(RegistryError, match="positive, finite time"):
            reg.record_nccl(H200X2, "allreduce", {1024: bad})
    assert snapshot(registry) == snapshot(committed_copy)


# ---- 2. export writes only inside its folder, under the entries' checked file names ---------------------------
@pytest.mark.parametrize("bad_id", ["../../ESCAPED", "/tmp/weft-escaped-absolute", "..", "a/b", "x" * 300])
def test_an_entry_id_cannot_steer_export_outside_its_folder(registry, tmp_path, bad_id):
    victim = entry_file(registry, "allgather")
    doc = json.loads(victim.read_text())
    doc["id"] = bad_id
    victim.write_text(json.dumps(doc))
    out = tmp_path / "deep" / "er" / "export"
    code, stdout, err = run(["registry", "export", str(out), "--registry", str(registry)])
    assert code == 1 and f"exported {count(registry) - 1} entries" in stdout and "1 unreadable skipped" in stdout
    assert f"{victim}: id:" in err  # the entry is named and left out
    assert sorted(p.name for p in tmp_path.rglob("*ESCAPED*")) == []
    assert not Path("/tmp/weft-escaped-absolute.json").exists()
    assert {p.parent for p in out.rglob("*.json")} == {out}


def test_an_id_that_disagrees_with_its_file_name_is_refused(registry):
    a, b = sorted((registry / "entries").glob("allgather-*.json"))[:2]
    doc = json.loads(a.read_text())
    doc["id"] = b.stem  # claims to be its neighbour
    a.write_text(json.dumps(doc))
    code, _, err = run(["registry", "show", a.stem, "--registry", str(registry)])
    assert code == 2 and "does not match the file's name" in err


# ---- 3. one bad entry file is one named line; the others stay usable --------------------------------------------
BAD_FILES = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "long int": '{"format": ' + "9" * 5000 + "}",
    "binary": "\udcff",
    "empty": "",
    "null": "null",
}


@pytest.mark.parametrize(
    "kind, command",
    [
        *[
            (kind, command)
            for kind in BAD_FILES
            for command in (["list"], ["select", "allgather", "-t", H200X2, "--size", "1MB"], ["export", "{out}"])
        ],
        ("deep", ["verify"]),
        ("long int", ["verify"]),
    ],
)
def test_a_damaged_entry_is_one_named_line_and_the_others_serve(registry, tmp_path, kind, command):
    victim = entry_file(registry, "allgather")
    victim.write_bytes(BAD_FILES[kind].encode("utf-8", "surrogateescape"))
    argv = ["registry", *[str(tmp_path / "out") if a == "{out}" else a for a in command], "--registry", str(registry)]
    if command[0] == "verify":
        argv.append("--json")
    code, out, err = run(argv)
    assert "Traceback" not in err
    if command[0] == "verify":
        report = json.loads(out)
        assert code == 1 and report["bad"] == 1 and report["ok"] == count(registry) - 1
        return
    assert code == (1 if command[0] == "export" else 0)  # export's copy is incomplete: it says so, as verify does
    assert [line for line in err.splitlines() if victim.name in line] == err.splitlines()
    assert len(err.splitlines()) == 1
    if command[0] == "list":
        assert out.rstrip().endswith(f"{count(registry) - 1} entries in {registry}")


def test_show_of_a_damaged_entry_is_one_line(registry):
    victim = entry_file(registry, "allgather")
    victim.write_text("[" * 100_000)
    code, _, err = run(["registry", "show", victim.stem, "--registry", str(registry)])
    assert code == 2 and err.count("\n") == 1 and victim.name in err


def test_rebuild_index_names_unreadable_entries_and_exits_1(registry):
    victim = entry_file(registry, "allgather")
    victim.write_text("[" * 100_000)
    code, out, err = run(["registry", "rebuild-index", "--registry", str(registry)])
    assert code == 1 and f"{count(registry) - 1} entries, 1 unreadable left out" in out
    assert victim.name in err
    index = json.loads((registry / "index.json").read_text())
    assert len(index["entries"]) == count(registry) - 1


@pytest.mark.parametrize(
    "damage",
    [
        "[" * 100_000,
        '{"format": ' + "1" * 5000 + "}",
        "{}",
        '{"format": 3}',
        json.dumps({"format": "weft.registry-index/1", "entries": [{"id": 7}]}),
    ],
)
def test_a_damaged_index_is_rebuilt_by_the_next_change_never_a_crash(registry, damage):
    (registry / "index.json").write_text(damage)
    victim = entry_file(registry, "allgather")
    code, _, err = run(["registry", "remove", victim.stem, "--registry", str(registry)])
    assert code == 0 and err == ""
    index = json.loads((registry / "index.json").read_text())
    assert len(index["entries"]) == count(registry) and victim.stem not in {row["id"] for row in index["entries"]}


@pytest.mark.parametrize("damage", ["[" * 100_000, '{"format": ' + "1" * 5000 + "}", "{not json"])
def test_a_damaged_index_never_crashes_commit_after_it_wrote_the_entry(registry, tmp_path, damage):
    """commit writes the entry and a fresh index, or nothing: the index is never left stale beside a new entry."""
    victim = entry_file(registry, "allgather")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_of(victim)))
    victim.unlink()
    (registry / "index.json").write_text(damage)
    code, out, err = run(["registry", "commit", str(plan), "--registry", str(registry)])
    assert code == 0 and err == "" and f"committed {victim.stem}" in out
    index = json.loads((registry / "index.json").read_text())
    assert sorted(row["id"] for row in index["entries"]) == sorted(listed(registry)) and len(index["entries"]) == count(
        registry
    )


# ---- 4. an entry never serves one collective's plan under another's key -------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("collective", "allreduce"),
        ("nranks", 4),
        ("min_bytes", 1),
        ("max_bytes", 1 << 40),
        ("topology", "topo-0000000000000000"),
    ],
)
def test_a_key_that_disagrees_with_its_plan_is_refused_by_select_and_verify(registry, field, value):
    victim = entry_file(registry, "allgather")
    doc = json.loads(victim.read_text())
    doc["key"][field] = value
    victim.write_text(json.dumps(doc))
    for collective in ("allreduce", "allgather"):
        code, out, err = run(
            ["registry", "select", collective, "-t", H200X2, "--size", "64KB", "--json", "--registry", str(registry)]
        )
        assert json.loads(out)["entry"] != victim.stem
        assert f"{victim}: key.{field}" in err
    if field != "collective":
        return
    code, out, _ = run(["registry", "verify", "--json", "--registry", str(registry)])
    row = next(r for r in json.loads(out)["entries"] if r["id"] == victim.stem)
    assert code == 1 and not row["ok"] and f"key.{field}" in row["error"]


def test_the_executor_asks_the_plan_too_not_only_the_key(committed_copy):
    """Entry.serves (what select and the executor's PlanChoice ask) checks the plan's own collective and ranks."""
    from dataclasses import replace

    from registry.store import Registry

    entry = next(e for e in Registry(committed_copy).entries() if e.key.collective == "allgather")
    size = 4096
    assert entry.serves(H200X2, "allgather", 2, size)
    forged = replace(entry, key=replace(entry.key, collective="allreduce"))
    assert not forged.serves(H200X2, "allreduce", 2, size)


def test_the_executor_asks_the_plan_itself_before_it_runs_a_call(committed_copy, monkeypatch):
    """Even were selection to trust a key alone, the executor's last check before a call asks the plan."""
    from dataclasses import replace

    from executor.inference.plans import PlanChoice
    from registry.store import Entry, Registry

    choice = PlanChoice(Registry(committed_copy), H200X2, 2)
    entry = next(e for e in choice.entries if e.key.collective == "allgather")
    choice.entries = [replace(entry, key=replace(entry.key, collective="allreduce"))]
    choice.nccl_us = {}  # NCCL measured faster at some sizes: here only the plans compete
    monkeypatch.setattr(
        Entry,
        "serves",
        lambda self, topology, collective, nranks, nbytes: (
            self.key.collective == collective and self.key.covers(nbytes)
        ),
    )
    assert choice.plan("allreduce", 4096, "bf16") is None
    assert "is a allgather, not a allreduce" in choice.reason("allreduce", 4096, "bf16")
    assert choice.plan("allgather", 4096, "bf16") is None  # the key says allreduce: selection never offers it


# ---- 7. plan files hold only what compile makes and the executors run ---------------------------------------------
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_threads_per_block", 10**9, "from 32 to 1024"),
        ("num_threads_per_block", 33, "multiple of 32"),
        ("num_threads_per_block", 16, "from 32 to 1024"),
        ("buffer_alignment", 3, "power of two"),
        ("buffer_alignment", 0, "from 1 to 256"),
        ("buffer_alignment", 1 << 20, "from 1 to 256"),
        ("max_message_size", 10**40, "from 0 to 18446744073709551615"),
        ("min_message_size", 10**4000, "from 0 to 1152921504606846976"),
        ("max_message_size", 1.5, "integer"),
    ],
    ids=[
        "threads-1e9",
        "threads-33",
        "threads-16",
        "alignment-3",
        "alignment-0",
        "alignment-1M",
        "max-1e40",
        "min-1e4000",
        "max-float",
    ],
)
@pytest.mark.parametrize("command", [["verify"], ["registry", "commit"]])
def test_a_plan_field_compile_never_makes_is_refused_in_one_line(registry, tmp_path, field, value, message, command):
    doc = plan_of(entry_file(registry, "allgather"))
    doc[field] = value
    doc["name"] = "edited"
    doc["weft"].pop("hash", None)  # an editor who knows to drop the stated hash
    doc["weft"].pop("verification", None)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(doc))
    before = snapshot(registry)
    argv = [*command, str(plan), *(["--registry", str(registry)] if command[0] == "registry" else [])]
    code, out, err = run(argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"weft: error: plan {plan}: {field}: must be") and message in err
    assert snapshot(registry) == before


# ---- 7. NaN nccl_us and other impossible times are refused (record: above; here the reader) ---------------------
@pytest.mark.parametrize("value", ["NaN", "-1", "0", "Infinity", "true", "[1]"])
def test_a_baselines_file_with_an_impossible_time_costs_nccl_not_the_plans(registry, value):
    doc = (registry / "baselines.json").read_text()
    times = json.loads(doc)["nccl_us"]
    measured = next(t["allgather"]["1024"] for t in times.values() if "allgather" in t)  # NCCL's 1 KB all-gather
    assert doc.count(repr(measured)) == 1
    (registry / "baselines.json").write_text(doc.replace(repr(measured), value, 1))
    code, out, err = run(
        ["registry", "select", "allgather", "-t", H200X2, "--size", "1KB", "--json", "--registry", str(registry)]
    )
    assert code == 0 and json.loads(out)["entry"] is not None
    assert "baselines.json: nccl_us." in err and err.count("\n") == 1


# ---- 8. special files: bounded reads, regular files only --------------------------------------------------------
@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "directory"])
@pytest.mark.parametrize(
    "argv", [["topo", "validate"], ["verify"], ["registry", "record"], ["registry", "commit"], ["plot", "bench"]]
)
def test_special_files_are_refused_in_one_line_without_hanging(tmp_path, special, argv):
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif special == "directory":
        path = tmp_path
    else:
        path = Path(special)
    result = []
    worker = threading.Thread(
        target=lambda: result.append(
            run([*argv, str(path), *(["--registry", str(tmp_path / "r")] if argv[0] == "registry" else [])])
        ),
        daemon=True,
    )
    worker.start()
    worker.join(20)
    assert result, f"weft {' '.join(argv)} {path} hung"
    code, _, err = result[0]
    assert code == 2 and err.count("\n") == 1 and str(path) in err
    assert not (tmp_path / "r").exists()


def test_a_file_over_the_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from weftcore import jsonfile

    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 4096}))
    monkeypatch.setattr(jsonfile, "MAX_FILE_BYTES", 1024)
    with pytest.raises(Exception, match="more than"):
        jsonfile.read_bytes(path, "topology", jsonfile.WeftError, 1024)
    assert math.isfinite(jsonfile.MAX_FILE_BYTES)
