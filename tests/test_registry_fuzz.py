"""Property: whatever one registry file, results file or plan holds, weft answers without a traceback, every
other entry lists and selects as before, a command that fails writes nothing (issue 27), and none runs past 30 s
(issue 39).

A small registry of three entries (disjoint size ranges, so each select size has exactly one plan) is mutated
one field or one whole file at a time; the CLI's entry function runs in-process, so a thousand cases stay quick.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
from bounded import no_hang
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.store import Registry
from schedules.plan.io import parse_plan
from weft.cli import main

# the registry fuzz (about 40 s of CPU) runs in the slow tier, after the fast one (issue 35)
pytestmark = pytest.mark.slow

TOPO = "topo-00000000000000aa"
HANG_S = 30  # the oracle's bound on one command (issue 39: 0 hangs over 30 s)
RANGES = {"a": (4, 4096, 1024), "b": (8192, 1 << 20, 65536), "c": (2 << 20, (1 << 64) - 1, 4 << 20)}
CASES = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def plan_doc(name: str, lo: int, hi: int) -> dict:
    """A real 1-rank allgather plan (copy input to output); the name makes each plan's hash distinct."""
    return {
        "name": name,
        "collective": "allgather",
        "protocol": "Simple",
        "inplace": False,
        "num_threads_per_block": 512,
        "buffer_alignment": 16,
        "min_message_size": lo,
        "max_message_size": hi,
        "gpus": [
            {
                "id": 0,
                "input_chunks": 1,
                "output_chunks": 1,
                "scratch_chunks": 0,
                "threadblocks": [
                    {
                        "id": 0,
                        "ops": [
                            {
                                "name": "copy",
                                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                                "dst_buff": [{"type": "o", "index": 0, "size": 1}],
                            }
                        ],
                    }
                ],
            }
        ],
        "weft": {"topology": TOPO, "predicted_us": {"4KB": 3.0, "1MB": 40.0}},
    }


def build(root: Path) -> dict[str, str]:
    """The registry (3 entries, index, baselines), a results file and a new plan under ``root``; {name: id}."""
    reg = Registry(root / "registry")
    ids = {}
    for name, (lo, hi, _) in RANGES.items():
        plan = parse_plan(plan_doc(name, lo, hi), name)
        provenance = {
            "solver": "direct",
            "weft_version": "test",
            "topology_name": "fuzz",
            "verification": {"ok": True, "plan_hash": plan.content_hash, "dtypes": ["fp32", "bf16"]},
        }
        ids[name] = reg.commit(plan, TOPO, provenance, {1024: 5.0, 1 << 20: 50.0, 1 << 30: 5e4}).id
    reg.record_timing(ids["a"], 1024, 4.0)
    reg.record_timing(ids["a"], 1024, 3.5, ll128=True)
    reg.record_nccl(TOPO, "allgather", {1024: 900.0, 1 << 20: 1000.0})
    hashes = {name: reg.get(i).plan.content_hash for name, i in ids.items()}
    rows = [
        {
            "size": size,
            "nccl_us": 800.0,
            "wrong": 0,
            "weft_us": 2.0,
            "plan_hash": hashes[name],
            "plans_us": {hashes[name]: 2.0},
            "plans_ll128_us": {hashes[name]: 1.5},
        }
        for name, (_, _, size) in RANGES.items()
    ]
    (root / "results.json").write_text(json.dumps({"collective": "allgather", "rows": rows}))
    (root / "plan.json").write_text(json.dumps(plan_doc("d", 4100, 8000)))
    return ids


@pytest.fixture(scope="module", autouse=True)
def one_parser():
    """main() builds the whole argument parser (every sub-command, gettext lookups) on each call: in a long-lived
    process that is most of a case's time, so the thousand cases share one (parse_args keeps no state)."""
    import weft.cli

    parser = weft.cli.build_parser()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weft.cli, "build_parser", lambda: parser)
        yield


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    ids = build(root)
    files = {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}
    return (
        files,
        ids,
        {name: select(root / "registry", size) for name, (_, _, size) in RANGES.items()},
        listing(root / "registry"),
    )


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with no_hang(HANG_S, "a command"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)  # an exception escaping here is the traceback a user would see
    assert code in (0, 1, 2), (argv, code)
    assert all(line.startswith("weft: ") for line in err.getvalue().splitlines()), err.getvalue()[:400]
    return code, out.getvalue(), err.getvalue()


def select(registry: Path, size: int) -> dict:
    code, out, _ = run(
        ["registry", "select", "allgather", "-t", TOPO, "--size", str(size), "--json", "--registry", str(registry)]
    )
    return json.loads(out)


def listing(registry: Path) -> dict[str, dict]:
    code, out, _ = run(["registry", "list", "--json", "--registry", str(registry)])
    assert code == 0
    return {row["id"]: row for row in json.loads(out)}


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"
    }


# ---- mutations ----------------------------------------------------------------------------------------------
LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, -1, 1, 3, 10**40, 1 << 64, (1 << 64) - 1, 1 << 63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "../../ESCAPED",
            "/tmp/weft-escaped-abs",
            "",
            "..",
            "allreduce",
            "LL",
            "1KB",
            "topo-00000000000000ab",
            TOPO,
            "weft.registry-entry/1",
            "weft.registry-entry/2",
            "weft.registry-index/1",
            "weft.registry-baselines/1",
        ]
    ),
)
VALUE = st.recursive(
    LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)
RAW = st.sampled_from(
    [
        b"",
        b"null",
        b"[]",
        b"{}",
        b"[" * 100_000,
        b'{"format": ' + b"9" * 5000 + b"}",
        b"\xff\xfe\x00",
        b'{"a": 1e999999}',
        b"NaN",
        b'"text"',
    ]
)


def paths(doc: object, here: tuple = ()) -> list[tuple]:
    found = [here]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += paths(v, here + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += paths(v, here + (i,))
    return found


@st.composite
def mutated(draw, text: bytes) -> bytes:
    """``text`` (a JSON file) with one change: a field set, deleted, or renamed; or the whole file replaced."""
    kind = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "truncate", "raw"]))
    if kind == "raw":
        return draw(RAW)
    if kind == "truncate":
        return text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    doc = json.loads(text)
    targets = paths(doc)
    path = draw(st.sampled_from(targets if kind == "set" else [p for p in targets if p] or [()]))
    if not path:
        return json.dumps(draw(VALUE)).encode()
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if kind == "set":
        parent[last] = draw(VALUE)
    elif kind == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = parent.pop(last)
    else:
        parent[last] = [parent[last]]
    return json.dumps(doc).encode()


class Case:
    """A fresh copy of the pristine tree, one file of it mutated."""

    def __init__(self, pristine, relative: str, data_strategy, draw):
        files, self.ids, self.selected, self.listed = pristine
        self.tmp = Path(tempfile.mkdtemp(prefix="weft-fuzz-"))
        for relative_path, data in files.items():  # written from memory: copytree's stat calls cost more
            (self.tmp / relative_path).parent.mkdir(parents=True, exist_ok=True)
            (self.tmp / relative_path).write_bytes(data)
        self.registry = self.tmp / "registry"
        target = self.tmp / relative
        target.write_bytes(draw(mutated(target.read_bytes())))
        self.target = target

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_checked(self, argv: list[str]) -> int:
        """Run; where the command failed (exit 2), nothing under the tree may have changed."""
        before = snapshot(self.tmp)
        code, _, err = run(argv)
        if code == 2:
            assert snapshot(self.tmp) == before, (argv, err)
            assert err.count("\n") == 1, err
        return code

    def others_serve_as_before(
        self, skip: str | None = None, new_ids: frozenset = frozenset(), nccl: bool = False
    ) -> None:
        """``nccl``: a recorded plan time may now be slower than NCCL's, which then runs instead."""
        listed = listing(self.registry)
        for name, size_sel in self.selected.items():
            if self.ids[name] == skip:
                continue
            assert listed[self.ids[name]] == self.listed[self.ids[name]] or skip is None
            now = select(self.registry, RANGES[name][2])
            assert now["entry"] == size_sel["entry"] or now["entry"] in new_ids or (nccl and now["basis"] == "nccl"), (
                name,
                now,
                size_sel,
            )
        assert not list(Path("/tmp").glob("weft-escaped-abs*")) and not list(self.tmp.parent.glob("ESCAPED*"))


def entry_path(pristine, name: str) -> str:
    return f"registry/entries/{pristine[1][name]}.json"


@CASES
@given(data=st.data(), name=st.sampled_from(sorted(RANGES)))
def test_a_mutated_entry_leaves_the_others_serving(pristine, data, name):
    case = Case(pristine, entry_path(pristine, name), None, data.draw)
    try:
        case.others_serve_as_before(skip=case.ids[name])
        reg = str(case.registry)
        case.run_checked(["registry", "show", case.ids[name], "--registry", reg])
        assert case.run_checked(["registry", "export", str(case.tmp / "out"), "--registry", reg]) in (0, 1)
        assert {p.parent for p in (case.tmp / "out").rglob("*")} <= {case.tmp / "out"}
        assert case.run_checked(["registry", "rebuild-index", "--registry", reg]) in (0, 1)
        case.others_serve_as_before(skip=case.ids[name])
    finally:
        case.close()


@CASES
@given(data=st.data())
def test_a_mutated_index_changes_no_selection_and_the_next_change_repairs_it(pristine, data):
    case = Case(pristine, "registry/index.json", None, data.draw)
    try:
        case.others_serve_as_before()
        assert (
            case.run_checked(["registry", "record", str(case.tmp / "results.json"), "--registry", str(case.registry)])
            == 0
        )
        index = json.loads((case.registry / "index.json").read_text())
        assert sorted(row["id"] for row in index["entries"]) == sorted(case.ids.values())
    finally:
        case.close()


@CASES
@given(data=st.data())
def test_a_mutated_baselines_file_never_costs_the_plans(pristine, data):
    case = Case(pristine, "registry/baselines.json", None, data.draw)
    try:
        listed = listing(case.registry)
        assert listed == case.listed
        for name, (_, _, size) in RANGES.items():
            now = select(case.registry, size)
            assert now["entry"] == case.selected[name]["entry"] or (now["entry"] is None and "NCCL" in now["reason"])
        case.run_checked(["registry", "record", str(case.tmp / "results.json"), "--registry", str(case.registry)])
        assert listing(case.registry).keys() == case.listed.keys()
    finally:
        case.close()


@CASES
@given(data=st.data())
def test_a_mutated_results_file_records_whole_or_not_at_all(pristine, data):
    case = Case(pristine, "results.json", None, data.draw)
    try:
        case.run_checked(["registry", "record", str(case.target), "--registry", str(case.registry)])
        case.others_serve_as_before(skip=None, nccl=True)
        for row in listing(case.registry).values():
            assert row["best_us"] is None or math.isfinite(row["best_us"]) and row["best_us"] > 0
    finally:
        case.close()


@CASES
@given(data=st.data())
def test_a_mutated_plan_commits_whole_or_not_at_all(pristine, data):
    case = Case(pristine, "plan.json", None, data.draw)
    try:
        before = set(listing(case.registry))
        case.run_checked(["registry", "commit", str(case.target), "--registry", str(case.registry)])
        new = frozenset(listing(case.registry)) - before
        assert len(new) <= 1
        case.others_serve_as_before(skip=None, new_ids=new)
        assert case.run_checked(["registry", "rebuild-index", "--registry", str(case.registry)]) == 0
    finally:
        case.close()


# ---- the registry's layout mutated (issue 39.2): side files, orphans, stray files --------------------------------
LAYOUT = st.sampled_from(
    [
        "orphan",
        "orphan_index",
        "drop_row",
        "extra_row",
        "dup_row",
        "stale_row",
        "stray_text",
        "stray_dir",
        "index_dir",
        "baselines_dir",
        "entry_copy",
        "no_index",
        "index_raw",
    ]
)


def mutate_layout(registry: Path, ids: dict[str, str], op: str, draw) -> None:
    """One change to the registry's folder that a killed writer, a bad merge or a careless hand could make; none
    of them touches a good entry's own file."""
    index = registry / "index.json"
    victim = ids[draw(st.sampled_from(sorted(ids)))]
    try:
        rows = json.loads(index.read_text())["entries"]
        assert all(r["id"] for r in rows)
    except Exception:  # noqa: BLE001 (an earlier change damaged it: these changes need a readable one)
        rows = []
    if op == "orphan":
        (registry / "entries" / f"{victim}.json.tmp-4242-deadbeef").write_bytes(draw(RAW))
    elif op == "orphan_index":
        (registry / "index.json.tmp-4242-deadbeef").write_bytes(draw(RAW))
    elif op in ("drop_row", "extra_row", "dup_row", "stale_row") and any(r["id"] == victim for r in rows):
        row = next(r for r in rows if r["id"] == victim)
        if op == "drop_row":
            rows.remove(row)
        elif op == "extra_row":
            rows.append({**row, "id": "allgather-1r-000000000000"})
        elif op == "dup_row":
            rows.append(dict(row))
        else:
            row["min_bytes"] = 1 << 62
        index.write_text(json.dumps({"format": "weft.registry-index/1", "entries": rows}))
    elif op == "stray_text":
        (registry / "entries" / "NOTES.txt").write_text("not an entry")
    elif op == "stray_dir":
        (registry / "entries" / "folder.json").mkdir(exist_ok=True)
    elif op in ("index_dir", "baselines_dir"):
        path = registry / ("index.json" if op == "index_dir" else "baselines.json")
        if not path.is_dir():
            path.unlink(missing_ok=True)
            path.mkdir()
    elif op == "entry_copy":
        (registry / "entries" / "copied.json").write_bytes((registry / "entries" / f"{victim}.json").read_bytes())
    elif op == "no_index" and not index.is_dir():
        index.unlink(missing_ok=True)
    elif op == "index_raw" and not index.is_dir():
        index.write_bytes(draw(RAW))


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), ops=st.lists(LAYOUT, min_size=1, max_size=3))
def test_a_mutated_registry_loses_no_good_entry(pristine, data, ops):
    """Oracle: 0 good entries lost (list, select, show by plan name, export) and 0 tracebacks, whatever the side
    files hold; the orphans verify reports are found, and rebuild-index repairs the index and the orphans."""
    files, ids, selected, listed = pristine
    tmp = Path(tempfile.mkdtemp(prefix="weft-fuzz-"))
    try:
        for relative, content in files.items():
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp / relative).write_bytes(content)
        registry = tmp / "registry"
        for op in ops:
            mutate_layout(registry, ids, op, data.draw)
        reg = ["--registry", str(registry)]
        now = listing(registry)
        assert {i: now[i] for i in ids.values()} == {i: listed[i] for i in ids.values()}
        for name, (_, _, size) in RANGES.items():
            sel = select(registry, size)
            assert sel["entry"] == selected[name]["entry"], (name, sel)
            code, out, _ = run(["registry", "show", name, *reg])
            assert code == 0 and out.startswith(f"{ids[name]}:")
        code, out, _ = run(["registry", "export", str(tmp / "out"), *reg])
        assert code in (0, 1) and {p.stem for p in (tmp / "out").glob("*-1r-*.json")} == set(ids.values())
        before = snapshot(tmp)
        code, _, err = run(["registry", "commit", str(tmp / "plan.json"), *reg])
        assert code == 0 or (code == 2 and snapshot(tmp) == before and err.count("\n") == 1), (code, err)
        assert set(ids.values()) <= set(listing(registry))
        found = Registry(registry)
        assert bool(found.orphans()) == bool({"orphan", "orphan_index"} & set(ops))  # what verify reports
        code = run(["registry", "rebuild-index", *reg])[0]
        assert code in (0, 1) or "index_dir" in ops
        if "index_dir" not in ops:
            assert found.orphans() == [] and found.index_problems() == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
