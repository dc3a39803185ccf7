"""The plan registry: commit, list, select by size, measured-over-predicted, concurrency and crash safety."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from registry import store as registry_module
from registry.index import Mode
from registry.store import NotVerified, Registry, dumps, entry_text
from schedules.plan.io import parse_plan

TOPO = "topo-00000000000000aa"


def make_plan(name: str, lo: int = 0, hi: int = (1 << 64) - 1, protocol: str = "Simple"):
    """A real 1-rank allgather plan (copy input to output); the name makes each plan's hash distinct."""
    return parse_plan(
        {
            "name": name,
            "collective": "allgather",
            "protocol": protocol,
            "inplace": False,
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
        },
        f"{name}.json",
    )


def provenance(plan, solver: str = "direct") -> dict:
    return {
        "solver": solver,
        "weft_version": "test",
        "schedule_hash": "s" * 16,
        "verification": {"ok": True, "plan_hash": plan.content_hash, "dtypes": ["fp32", "bf16"], "sizes": [64, 4096]},
    }


def commit(reg: Registry, name: str, lo: int = 0, hi: int = (1 << 64) - 1, predicted=None, protocol="Simple"):
    plan = make_plan(name, lo, hi, protocol)
    return reg.commit(plan, TOPO, provenance(plan), predicted or {1024: 5.0, 1 << 20: 50.0})


def test_commit_list_select_round_trip(tmp_path):
    reg = Registry(tmp_path)
    entry = commit(reg, "a")
    assert [e.id for e in reg.entries()] == [entry.id]
    assert reg.get(entry.id).plan == entry.plan
    sel = reg.select(TOPO, "allgather", 4096)
    assert sel.entry is not None and sel.entry.id == entry.id and sel.basis == "predicted"


def test_select_by_size_across_adjacent_ranges(tmp_path):
    reg = Registry(tmp_path)
    small = commit(reg, "small", 0, 64 << 10)
    medium = commit(reg, "medium", (64 << 10) + 4, 4 << 20)
    large = commit(reg, "large", (4 << 20) + 4, (1 << 64) - 1)
    assert reg.select(TOPO, "allgather", 1024).entry.id == small.id
    assert reg.select(TOPO, "allgather", 64 << 10).entry.id == small.id
    assert reg.select(TOPO, "allgather", 1 << 20).entry.id == medium.id
    assert reg.select(TOPO, "allgather", 1 << 30).entry.id == large.id


def test_select_prefers_measured_time_over_prediction(tmp_path):
    reg = Registry(tmp_path)
    a = commit(reg, "predicted-fast", predicted={1 << 20: 10.0})
    b = commit(reg, "predicted-faster", predicted={1 << 20: 8.0})
    assert reg.select(TOPO, "allgather", 1 << 20).entry.id == b.id
    reg.record_timing(b.id, 1 << 20, 30.0)  # measured: slower than predicted
    reg.record_timing(a.id, 1 << 20, 12.0)
    sel = reg.select(TOPO, "allgather", 1 << 20)
    assert sel.entry.id == a.id and sel.basis == "measured" and sel.time_us == pytest.approx(12.0)


def test_no_plan_for_another_topology_or_dtype(tmp_path):
    reg = Registry(tmp_path)
    commit(reg, "a")
    other = reg.select("topo-ffffffffffffffff", "allgather", 4096)
    assert other.entry is None and "no plan" in other.reason
    assert reg.select(TOPO, "allgather", 4096, dtype="fp16").entry is None
    assert reg.select(TOPO, "allreduce", 4096).entry is None


def test_unverified_plan_cannot_be_committed(tmp_path):
    reg = Registry(tmp_path)
    plan = make_plan("x")
    bad = provenance(plan)
    bad["verification"]["plan_hash"] = "0" * 16
    with pytest.raises(NotVerified):
        reg.commit(plan, TOPO, bad)
    assert reg.entries() == []


def test_files_are_deterministic_and_index_rebuilds(tmp_path):
    reg = Registry(tmp_path)
    e = commit(reg, "a")
    text = (tmp_path / "entries" / f"{e.id}.json").read_text()
    assert text == dumps(json.loads(text))
    commit(reg, "b")
    assert (reg.index(), []) == reg.rebuilt_index()
    (tmp_path / "index.json").unlink()
    assert reg.rebuild_index() == reg.rebuilt_index()


def test_entry_files_are_pretty_above_the_packed_ops(tmp_path):
    """Pretty for review (two-space indents, sorted keys) down to the plan's header; the ops, which never change
    under an entry's id, are one packed string (weft.registry-entry/2): a 128-instance entry took 1.3 MB as one op
    per line."""
    e = commit(Registry(tmp_path), "a")
    lines = (tmp_path / "entries" / f"{e.id}.json").read_text().splitlines()
    assert lines[0] == "{" and lines[1] == '  "format": "weft.registry-entry/2",'
    assert '    "name": "a",' in lines and sum('"plan_gpus": "' in line for line in lines) == 1
    assert Registry(tmp_path).get(e.id).plan == e.plan


def _commit_many(path: str, worker: int) -> None:
    reg = Registry(path)
    for i in range(25):
        commit(reg, f"w{worker}-p{i}")


def test_eight_concurrent_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_commit_many, args=(str(tmp_path), w)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    reg = Registry(tmp_path)
    entries, bad = reg.load()
    assert len(entries) == 200 and bad == []
    for f in (tmp_path / "entries").iterdir():
        json.loads(f.read_text())
    assert (reg.index(), []) == reg.rebuilt_index()


def test_commit_killed_between_write_and_rename_leaves_nothing(tmp_path, monkeypatch):
    reg = Registry(tmp_path)
    commit(reg, "kept")
    before = reg.index()

    def crash(*args):
        raise KeyboardInterrupt("killed mid-commit")

    monkeypatch.setattr(registry_module, "_rename", crash)
    with pytest.raises(KeyboardInterrupt):
        commit(reg, "lost")
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "entries").iterdir()] == [f"{reg.entries()[0].id}.json"]
    assert reg.index() == before
    assert not any(".tmp" in p.name for p in tmp_path.rglob("*"))


def test_corrupted_entry_is_skipped_by_select_with_a_warning(tmp_path):
    reg = Registry(tmp_path)
    good = commit(reg, "good")
    broken = commit(reg, "broken", predicted={1024: 1.0, 1 << 20: 1.0})
    path = tmp_path / "entries" / f"{broken.id}.json"
    path.write_text(path.read_text()[:200])
    sel = reg.select(TOPO, "allgather", 4096)
    assert sel.entry.id == good.id
    assert len(sel.skipped) == 1 and broken.id in sel.skipped[0]  # the CLI prints it as one warning line
    entries, bad = reg.load()
    assert [e.id for e in entries] == [good.id] and len(bad) == 1 and broken.id in bad[0]


def test_memory_filesystem_through_fsspec():
    reg = Registry(f"memory://weft-test-{os.getpid()}")
    e = commit(reg, "mem")
    assert reg.select(TOPO, "allgather", 4096).entry.id == e.id
    reg.remove(e.id)
    assert reg.entries() == [] and reg.index()["entries"] == []


def test_default_location_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("WEFT_REGISTRY", str(tmp_path / "r"))
    assert Registry().location == str(tmp_path / "r")
    monkeypatch.delenv("WEFT_REGISTRY")
    assert Registry().location.endswith("registry")


def test_a_measured_entry_beats_an_unmeasured_one_with_a_rosier_prediction(tmp_path):
    reg = Registry(tmp_path)
    measured = commit(reg, "measured", predicted={1 << 20: 10.0})
    commit(reg, "only-predicted", predicted={1 << 20: 1.0})  # the cost model's optimism must not win
    reg.record_timing(measured.id, 1 << 20, 20.0)
    sel = reg.select(TOPO, "allgather", 1 << 20)
    assert sel.entry.id == measured.id and sel.basis == "measured"


def test_bench_record_stores_every_plans_time_and_skips_wrong_sizes(tmp_path):
    from argparse import Namespace

    from weft.cli.gpu import _record

    reg = Registry(tmp_path)
    a, b = commit(reg, "a", protocol="LL"), commit(reg, "b", protocol="LL")
    rows = [
        {
            "size": 1024,
            "wrong": 0,
            "plan_hash": a.plan.content_hash,
            "weft_us": 5.0,
            "nccl_us": 11.0,
            "plans_us": {a.plan.content_hash: 5.0, b.plan.content_hash: 7.0, "not-in-registry": 1.0},
        },
        {
            "size": 4096,
            "wrong": 1,
            "plan_hash": b.plan.content_hash,
            "weft_us": 6.0,
            "nccl_us": 12.0,
            "plans_us": {a.plan.content_hash: 9.0, b.plan.content_hash: 6.0},
        },
    ]
    _record(Namespace(registry=str(tmp_path), collective="allgather"), rows)
    assert reg.get(a.id).measured_us == {1024: 5.0} and reg.get(b.id).measured_us == {1024: 7.0}
    assert reg.nccl_times(TOPO, "allgather") == {1024: 11.0}  # NCCL's time too, from the sizes recorded
    assert reg.select(TOPO, "allgather", 1024).entry.id == a.id
    # a bench that also timed LL128 lines records those apart: plain selections do not see them
    rows[0]["plans_ll128_us"] = {a.plan.content_hash: 9.0, b.plan.content_hash: 3.0}
    _record(Namespace(registry=str(tmp_path), collective="allgather"), rows)
    assert reg.get(b.id).measured_us == {1024: 7.0} and reg.get(b.id).measured_ll128_us == {1024: 3.0}
    assert reg.get(a.id).measured_us == {1024: 5.0} and reg.get(a.id).measured_ll128_us == {1024: 9.0}
    plain, lined = reg.select(TOPO, "allgather", 1024), reg.select(TOPO, "allgather", 1024, ll128=True)
    assert (plain.entry.id, plain.lines, plain.time_us) == (a.id, False, 5.0)
    assert (lined.entry.id, lined.lines, lined.time_us) == (b.id, True, 3.0)
    # and its compiled kernels (`weft bench --compiled`: plan hash, +ll128 with lines), apart again; a size whose
    # fastest compiled kernel gave a wrong result records no compiled time
    rows[0]["plans_compiled_us"] = {a.plan.content_hash: 2.5, b.plan.content_hash + "+ll128": 2.0}
    rows[1]["plans_compiled_us"] = {a.plan.content_hash: 1.0}
    rows[1]["wrong"], rows[0]["compiled_wrong"] = 0, 0
    rows.append({**rows[0], "size": 16384, "compiled_wrong": 3, "plans_compiled_us": {a.plan.content_hash: 0.5}})
    _record(Namespace(registry=str(tmp_path), collective="allgather"), rows)
    assert reg.get(a.id).measured_compiled_us == {1024: 2.5, 4096: 1.0}
    assert reg.get(b.id).measured_ll128_compiled_us == {1024: 2.0} and not reg.get(b.id).measured_compiled_us
    assert reg.get(a.id).to_json()["timings"]["measured_compiled_us"] == {"1024": 2.5, "4096": 1.0}
    interpreted = reg.select(TOPO, "allgather", 1024, ll128=True)
    kernel = reg.select(TOPO, "allgather", 1024, ll128=True, compiled=True)
    assert (interpreted.entry.id, interpreted.compiled, interpreted.time_us) == (b.id, False, 3.0)
    assert (kernel.entry.id, kernel.lines, kernel.compiled, kernel.time_us) == (b.id, True, True, 2.0)
    # a commit of the same plan again keeps every table (the index row carries them to selection too)
    again = commit(reg, "a", protocol="LL")
    assert reg.get(again.id).measured_compiled_us == {1024: 2.5, 4096: 1.0}
    assert reg.select(TOPO, "allgather", 4096, compiled=True).time_us == 1.0


def test_a_modes_times_count_only_inside_the_sizes_they_were_measured_at(tmp_path):
    reg = Registry(tmp_path)
    entry = commit(reg, "modes", protocol="LL")
    for nbytes, us in ((64 << 10, 4.0), (1 << 20, 11.0)):
        reg.record_timing(entry.id, nbytes, us)
    reg.record_timing(entry.id, 64 << 10, 2.0, compiled=True)  # a kernel timed at 64 KB only
    got = reg.get(entry.id)
    assert got.estimate(64 << 10, compiled=True) == ("measured", 2.0, Mode(compiled=True))
    assert got.estimate(1 << 20, compiled=True) == ("measured", 11.0, Mode())  # not 2 µs at 1 MB
    reg.record_timing(entry.id, 1 << 20, 9.0, compiled=True)  # now measured at both ends: between them, interpolated
    assert reg.get(entry.id).estimate(256 << 10, compiled=True)[2] == Mode(compiled=True)
    alone = commit(reg, "only-compiled")
    reg.record_timing(alone.id, 64 << 10, 3.0, compiled=True)  # nothing else measured: its one table extrapolates
    assert reg.get(alone.id).estimate(1 << 20, compiled=True)[0::2] == ("measured", Mode(compiled=True))
    assert reg.get(alone.id).summary()["measured"]  # `registry list` says so too


def test_ll128_times_are_kept_apart_and_survive_a_commit(tmp_path):
    reg = Registry(tmp_path)
    entry = commit(reg, "lines", protocol="LL")
    plain_json = reg.get(entry.id).to_json()
    assert "measured_ll128_us" not in plain_json["timings"]  # entries without them keep their format
    reg.record_timing(entry.id, 1 << 20, 9.0, ll128=True)
    reg.record_timing(entry.id, 1 << 20, 14.0)
    again = commit(reg, "lines", protocol="LL")
    got = reg.get(again.id)
    assert got.measured_us == {1 << 20: 14.0} and got.measured_ll128_us == {1 << 20: 9.0}
    assert got.estimate_us(1 << 20) == ("measured", 14.0) and got.estimate_us(1 << 20, ll128=True) == ("measured", 9.0)
    # per size, the faster format wins: packets at 1 KB, lines at 1 MB
    reg.record_timing(entry.id, 1024, 4.0)
    reg.record_timing(entry.id, 1024, 6.0, ll128=True)
    got = reg.get(entry.id)
    assert got.estimate(1024, ll128=True) == ("measured", 4.0, Mode())
    assert got.estimate(1 << 20, ll128=True) == ("measured", 9.0, Mode(lines=True))
    assert got.estimate(1 << 20) == ("measured", 14.0, Mode())
    only_lines = commit(reg, "only-lines", protocol="LL")
    reg.record_timing(only_lines.id, 1 << 20, 8.0, ll128=True)
    assert not reg.get(only_lines.id).measured() and reg.get(only_lines.id).measured(ll128=True)
    # a Simple plan has no packets to move as lines: times filed under lines do not count for it
    simple = commit(reg, "simple")
    reg.record_timing(simple.id, 1 << 20, 1.0, ll128=True)
    assert not reg.get(simple.id).measured(ll128=True) and reg.get(simple.id).estimate(1 << 20, True)[2] == Mode()


def test_committing_a_plan_again_keeps_its_measured_times(tmp_path):
    reg = Registry(tmp_path)
    entry = commit(reg, "again")
    reg.record_timing(entry.id, 1 << 20, 12.5)
    again = commit(reg, "again", predicted={1 << 20: 99.0})
    assert again.id == entry.id and reg.get(entry.id).measured_us == {1 << 20: 12.5}
    assert reg.get(entry.id).predicted_us == {1 << 20: 99.0}


def test_the_committed_registries_stay_compact():
    """bench/registry_h200x2 and _x4 travel with every GPU job beside FlashInfer's wheel: their entries are written
    compact (weft.registry-entry/2), and the two registries together stay under 8 MB (26 MB as /1)."""
    root = Path(__file__).resolve().parent.parent / "bench"
    files = [f for d in root.glob("registry_h200x*") for f in d.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) < 8e6
    biggest = max((f for f in files if f.parent.name == "entries"), key=lambda f: f.stat().st_size)
    assert biggest.read_text() == entry_text(Registry(biggest.parent.parent).read_entry_file(str(biggest)))
