"""The fused call's own measured times (registry norm.json, registry/norms.py): stored and read back per fabric, row
length, size and plan; a damaged file ignored with a warning; and selection for the fused call ranking the plans
timed at a size first, by those times, and the others after them by the all-reduce's
(``executor.reference.norm.fused_tiers``)."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

import registry.norms as norms
from executor.inference.plans import PlanChoice
from executor.reference.norm import (
    RowNorm,
    best_fused_plan,
    best_norm_plan,
    fused_tiers,
    fused_time,
    norm_candidates,
)
from registry.index import Mode
from registry.store import Registry, RegistryError
from topologies.catalog import build

ROOT = Path(__file__).parent.parent
P = "direct-allreduce-hgx_h200:gpus=2-"
ROWS = RowNorm(8192, 1e-5)


@pytest.fixture(scope="module")
def committed():
    fp = build("hgx_h200:gpus=2").fingerprints
    return fp, [e for e in Registry(str(ROOT / "bench" / "registry_h200x2")).entries(topology=fp) if e.key.nranks == 2]


def _entry(entries, name):
    return next(e for e in entries if e.plan.name == P + name)


def test_the_doctests_hold():
    assert doctest.testmod(norms).failed == 0


def test_times_are_stored_per_fabric_row_length_size_and_plan_and_read_back(tmp_path):
    reg = Registry(str(tmp_path / "r"))
    assert reg.norm_times("topo-a", 8192) == {}
    key, other = "0123456789abcdef+compiled", "fedcba9876543210"
    reg.record_norm_timings({"topo-a": {8192: {16384: {key: 5.5}, 65536: {key: 7.0, other: 6.0}}}})
    reg.record_norm_timings({"topo-a": {8192: {16384: {key: 5.25}}, 4096: {16384: {other: 4.0}}}})
    assert reg.norm_times("topo-a", 8192) == {key: {16384: 5.25, 65536: 7.0}, other: {65536: 6.0}}
    assert reg.norm_times("topo-a", 4096) == {other: {16384: 4.0}}
    assert reg.norm_times(("topo-b", "topo-a"), 8192)[key] == {16384: 5.25, 65536: 7.0}  # a legacy fingerprint's
    assert reg.norm_times("topo-b", 8192) == {}


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"format": "weft.registry-norm/0", "norm_us": {}}, "format"),
        ({"format": norms.NORM_FORMAT, "norm_us": {"t": {"8192": {"1024": {"not-a-hash": 5.0}}}}}, "not a plan hash"),
        ({"format": norms.NORM_FORMAT, "norm_us": {"t": {"8192": {"1024": {"0123456789abcdef": -1}}}}}, "µs"),
        ({"format": norms.NORM_FORMAT, "norm_us": {"t": {"rows": {}}}}, "row length"),
        ({"format": norms.NORM_FORMAT, "norm_us": {"t": {"8192": {"01": {}}}}}, "size in bytes"),
    ],
)
def test_a_damaged_norm_json_is_named_in_one_line_and_ignored_by_selection(tmp_path, doc, field):
    reg = Registry(str(tmp_path / "r"))
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "norm.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match=field) as raised:
        reg.norms()
    assert "norm.json" in str(raised.value) and "\n" not in str(raised.value)
    doc, warning = reg.norms_or_none()
    assert doc == norms.empty() and "the fused call's times ignored" in warning
    choice = PlanChoice(reg, "t", 2)
    assert choice.norm_us == {} and choice.norm_warning == warning  # the Communicator logs it once
    reg.record_norm_timings({"t": {8192: {1024: {"0123456789abcdef": 5.0}}}})  # replaced whole, as baselines.json
    assert reg.norm_times("t", 8192) == {"0123456789abcdef": {1024: 5.0}}


def test_measured_fused_times_rank_the_plans_that_have_them_in_their_fastest_allowed_mode(committed):
    """At 4 tokens the all-reduce's times pick the LL one-shot (LL128 lines, compiled); fused-call times that put a
    Lamport plan ahead make it the choice, and each timed plan runs in the mode it was timed fastest among those the
    engine runs; sizes past the times fall back."""
    fp, entries = committed
    nbytes = 4 * 8192 * 2
    serving = [e for e in entries if e.serves(fp, "allreduce", 2, nbytes)]
    by_allreduce, _ = best_norm_plan(norm_candidates(serving, nbytes, True, True), nbytes, "bf16", ROWS)
    ll = _entry(entries, "ll-x32-t512-max8MB").plan
    assert by_allreduce == ll  # since the eighteenth session's sweep (the Lamport x128-t256 before it)
    lamport = _entry(entries, "lamport-x128-t256").plan
    fused = {
        norms.norm_key(ll.content_hash, Mode(compiled=True)): {16384: 5.0, 262144: 6.0},
        norms.norm_key(ll.content_hash, Mode(lines=True, compiled=True)): {16384: 5.5, 262144: 6.5},
        norms.norm_key(lamport.content_hash, Mode(compiled=True)): {16384: 4.4, 262144: 5.4},
    }
    timed, rest = fused_tiers(serving, fused, nbytes, True, True)
    modes = {p.name: m for p, _, m in timed}
    assert modes == {ll.name: Mode(compiled=True), lamport.name: Mode(compiled=True)}
    assert len(rest) == len(serving) - 2
    assert [t for _, t, _ in rest] == [t for _, t in by_all(serving, rest)]  # the all-reduce's estimates
    plan, why = best_fused_plan((timed, rest), nbytes, "bf16", ROWS)
    assert why == "" and plan.name == lamport.name
    # where no timed plan can run the call (a refusal: its proof, say), the all-reduce's times pick among the rest
    plan, why = best_fused_plan((timed, rest), nbytes, "bf16", ROWS, lambda p: "no" if p in (ll, lamport) else "")
    assert why == "" and plan is not None and plan not in (ll, lamport)
    # an engine without LL128 lines runs the LL plan compiled, its fastest mode here anyway (5.0 .. 6.0)
    assert fused_time(ll, fused, nbytes, False, True) == (pytest.approx(5.0 * (6.0 / 5.0) ** 0.5), Mode(compiled=True))
    assert fused_time(ll, fused, nbytes, False, False) is None  # only compiled times recorded
    # past the recorded sizes no plan's fused times cover the call: all-reduce times rank every plan again
    beyond = 64 * 8192 * 2
    assert fused_time(ll, fused, beyond, True, True) is None
    wide = [e for e in entries if e.serves(fp, "allreduce", 2, beyond)]
    timed, rest = fused_tiers(wide, fused, beyond, True, True)
    assert timed == [] and len(rest) == len(wide)


def by_all(serving, rest, nbytes=4 * 8192 * 2):
    """The all-reduce's estimates of ``rest``'s plans, as norm_candidates gives them over every serving entry."""
    times = {p.content_hash: t for p, t in norm_candidates(serving, nbytes, True, True)}
    return [(p, times[p.content_hash]) for p, _, _ in rest]


def test_plan_choice_reads_the_fabrics_fused_times_and_its_basis_moves_with_them(committed, tmp_path):
    """Every rank's choice digest covers the fused call's times, so ranks that read different ones refuse together."""
    fp, entries = committed
    reg = Registry(str(tmp_path / "r"))
    entry = entries[0]
    before = PlanChoice(reg, fp, 2)
    assert before.norm_us == {}
    reg.record_norm_timings({fp[0]: {8192: {16384: {entry.plan.content_hash: 5.0}}}, "other": {8192: {1: {}}}})
    after = PlanChoice(reg, fp, 2)
    assert after.norm_us == {8192: {entry.plan.content_hash: {16384: 5.0}}}
    assert after.basis() != before.basis()


# ------------------------------------------------------------------------------- weft registry record (norm.json)


def _norm_results(tmp_path, rows, hidden=8192):
    path = tmp_path / "norm.json"
    doc = {"benchmark": "allreduce_norm", "collective": "allreduce", "hidden": hidden, "rows": rows}
    path.write_text(json.dumps(doc))
    return str(path)


def _registry_copy(tmp_path):
    import shutil

    shutil.copytree(ROOT / "bench" / "registry_h200x2", tmp_path / "reg")
    (tmp_path / "reg" / "norm.json").unlink(missing_ok=True)  # no fused-call times yet: what a record writes is all
    return str(tmp_path / "reg")


def test_record_stores_the_fused_calls_times_but_not_a_wrong_ones_nor_an_unknown_plans(
    committed, tmp_path, capsys, monkeypatch
):
    from weft import publish
    from weft.cli import main

    fp, entries = committed
    ll, lamport = _entry(entries, "ll-x32-t512-max8MB").plan, _entry(entries, "lamport-x64-t512").plan
    good = norms.norm_key(ll.content_hash, Mode(compiled=True))
    bad = norms.norm_key(lamport.content_hash, Mode(compiled=True))
    stranger = norms.norm_key("0123456789abcdef", Mode())
    rows = [
        {"size": 16384, "plans_us": {good: 4.7, bad: 4.1, stranger: 3.0}, "plans_wrong": {good: 0, bad: 2}},
        {"size": 65536, "plans_us": {good: 5.9}},
    ]
    reg = _registry_copy(tmp_path)
    reads = []
    read_json = publish.read_json
    monkeypatch.setattr(publish, "read_json", lambda *a, **k: reads.append(a[0]) or read_json(*a, **k))
    assert main(["registry", "record", _norm_results(tmp_path, rows), "--registry", reg]) == 0
    assert reads == [tmp_path / "norm.json"]  # the file read once: what is recorded is what was told apart
    out = capsys.readouterr().out
    assert "2 fused-call times at 2 sizes" in out and "skipped 1 plan not in the registry: 0123456789abcdef" in out
    topology = _entry(entries, "ll-x32-t512-max8MB").key.topology
    assert Registry(reg).norm_times(topology, 8192) == {good: {16384: 4.7, 65536: 5.9}}
    # the choice at 4 tokens now comes from the fused call's times: the LL plan, compiled, the one timed there
    choice = PlanChoice(Registry(reg), fp, 2, ll128=True, compiled=True)
    nbytes = 4 * 8192 * 2
    serving = [e for e in choice.entries if e.serves(fp, "allreduce", 2, nbytes)]
    timed, _ = fused_tiers(serving, choice.norm_us[8192], nbytes, True, True)
    assert [(p.name, m) for p, _, m in timed] == [(ll.name, Mode(compiled=True))]


@pytest.mark.parametrize(
    "row,field",
    [
        ({"size": 16384}, "rows[0].plans_us: missing or malformed"),
        ({"size": 0, "plans_us": {}}, "rows[0].size"),
        ({"size": 16384, "plans_us": {"xyz": 4.0}}, "not a plan hash"),
        ({"size": 16384, "plans_us": {"0123456789abcdef": 0}}, "plans_us.0123456789abcdef: must be a measured time"),
    ],
)
def test_a_malformed_norm_file_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, row, field):
    from weft.cli import main

    reg = _registry_copy(tmp_path)
    code = main(["registry", "record", _norm_results(tmp_path, [row]), "--registry", reg])
    err = capsys.readouterr().err
    assert code == 2 and field in err and err.count("\n") == 1
    assert not (tmp_path / "reg" / "norm.json").exists()


def test_a_norm_file_from_before_plans_us_is_named_as_such(tmp_path, capsys):
    """bench/norm_peers.py's files before 2026-11-28 (no tag, no plans_us) are told apart from `weft bench`'s."""
    from weft.cli import main

    old = ROOT / "bench" / "results" / "lamport_mp_4xh200_s12" / "gpu_allreduce_norm_bf16_graph_4xh200_lamport.json"
    code = main(["registry", "record", str(old), "--registry", _registry_copy(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "before 2026-11-28 hold no plans_us" in err and err.count("\n") == 1
