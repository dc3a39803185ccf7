"""`weft bench --top K`: the registry's contenders (registry.store.contenders_at), ranked as selection ranks them."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from registry.store import Registry, contenders_at, ranked_anywhere
from weft.cli import main

ROOT = Path(__file__).resolve().parents[1]
KB, MB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def entries():
    """The committed 2xH200 all-reduce registry: many variants, times measured interpreted, with LL128 lines and
    compiled."""
    return Registry(str(ROOT / "bench" / "registry_h200x2")).entries(collective="allreduce")


def contenders(entries, sizes: list[int], top: int, ll128: bool = False, compiled: bool = False) -> list:
    """The entries ``weft bench --top`` loads: those among ``top`` fastest at any of ``sizes``, in registry order."""
    return ranked_anywhere(entries, contenders_at(entries, sizes, top, ll128, compiled))


def _ranked(entries, nbytes: int, ll128: bool, compiled: bool) -> list[tuple[float, str]]:
    """Every entry that runs ``nbytes``, by its measured estimate (the committed registry measured them all)."""
    out = []
    for e in entries:
        if e.key.covers(nbytes) and e.plan.runs(nbytes):
            basis, us = e.estimate_us(nbytes, ll128, compiled)
            assert basis == "measured"
            out.append((us, e.id))
    return sorted(out)


@pytest.mark.parametrize("ll128, compiled", [(False, False), (True, False), (True, True)])
def test_the_top_k_at_one_size_are_the_k_fastest_by_the_registrys_times(entries, ll128, compiled):
    ranked = _ranked(entries, 64 * KB, ll128, compiled)
    assert len(ranked) > 10  # the registry holds many contenders at 64 KB
    kept = contenders(entries, [64 * KB], 3, ll128, compiled)
    assert sorted(e.id for e in kept) == sorted(i for _, i in ranked[:3])
    slowest_kept = max(e.estimate_us(64 * KB, ll128, compiled)[1] for e in kept)
    assert all(us >= slowest_kept for us, i in ranked[3:])


def test_the_modes_a_run_may_use_change_who_contends(entries):
    # compiled kernels were measured faster at 1 KB: counting them changes the winner's time
    plain = contenders(entries, [KB], 1)
    compiled = contenders(entries, [KB], 1, ll128=True, compiled=True)
    assert plain[0].estimate_us(KB)[1] > compiled[0].estimate_us(KB, True, True)[1]


def test_several_sizes_keep_the_union_of_each_sizes_top_in_registry_order(entries):
    small, huge = contenders(entries, [KB], 2), contenders(entries, [256 * MB], 2)
    both = contenders(entries, [KB, 256 * MB], 2)
    assert {e.id for e in both} == {e.id for e in small} | {e.id for e in huge}
    assert [e.id for e in both] == [e.id for e in entries if e.id in {x.id for x in both}]


def test_a_k_past_the_contenders_keeps_every_plan_that_runs_the_size(entries):
    ranked = _ranked(entries, MB, False, False)
    assert {e.id for e in contenders(entries, [MB], 10_000)} == {i for _, i in ranked}


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "allreduce", "--top", "0"],
        ["bench", "allreduce", "--top", "2", "--plans", "examples/plans/two_hosts_2gpu/ring-allreduce.plan.json"],
    ],
)
def test_bench_refuses_a_top_without_a_registry_or_below_one_in_one_line(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("weft: error:") and "--top" in lines[0]


def test_each_size_is_judged_by_every_rank_and_written_as_it_finishes():
    """The bench's on_row (weft.cli.gpu.row_verdicts): wrong counts summed over ranks per size; rank 0 writes the
    file after each size but the last with ``complete`` false (a job cut by its limit keeps what it finished)."""
    from weft.cli.gpu import row_verdicts

    ranks = {"bench-wrong": [[0, 1], [0, 0], [2, 0]], "bench-compiled-wrong": [[0, 0], [1, 0], [0, 0]]}
    calls: list[str] = []

    def exchange(what: str, value):
        calls.append(what)
        size = sum(1 for c in calls if c == what) - 1
        assert value == ranks[what][size][0]  # this rank's own count goes in; every rank's comes back
        return ranks[what][size]

    writes: list[tuple[list[int], bool]] = []
    on_row = row_verdicts(
        exchange, True, 3, lambda rows, complete: writes.append(([r["size"] for r in rows], complete))
    )
    rows = [
        {"size": n, "wrong": ranks["bench-wrong"][i][0], "compiled_wrong": ranks["bench-compiled-wrong"][i][0]}
        for i, n in enumerate((KB, MB, 64 * MB))
    ]
    for row in rows:
        on_row(row)
    assert [r["wrong"] for r in rows] == [1, 0, 2] and [r["compiled_wrong"] for r in rows] == [0, 1, 0]
    assert writes == [([KB], False), ([KB, MB], False)]  # the last size: the caller writes the whole file
    quiet = row_verdicts(lambda what, value: [value, value], False, 2, None)  # another rank: exchanges, no file
    row = {"size": KB, "wrong": 1}
    quiet(row)
    assert row == {"size": KB, "wrong": 2}


def test_each_size_times_only_its_own_contenders(entries):
    """`weft bench --top 2` over 1 KB and 256 MB loads the union of both sizes' two fastest plans, but times at each
    size only that size's two (a sweep of ten sizes then times about twenty plan variants a size, not every plan
    of the union that runs it)."""
    import argparse

    from executor.gpu.bench import BenchConfig, size_candidates
    from registry.store import contenders_at
    from weft.cli.gpu import _load_plans

    args = argparse.Namespace(
        plans=["registry"],
        registry=str(ROOT / "bench" / "registry_h200x2"),
        collective="allreduce",
        top=2,
        ll128=True,
        compiled=True,
    )
    sizes = [KB, 64 * KB, 256 * MB]
    plans, at = _load_plans(args, 2, sizes)
    ranked = contenders_at(entries, sizes, 2, True, True)
    assert dict(at) == {n: frozenset(e.plan.content_hash for e in ranked[n]) for n in sizes}
    assert all(len(hashes) == 2 for _, hashes in at)
    assert {p.content_hash for p in plans} == set().union(*(hashes for _, hashes in at))
    config = BenchConfig("allreduce", tuple(sizes), "bf16", ll128=True, compiled=True, contenders=at)
    for n in sizes:
        timed = size_candidates(config, plans, n)
        assert {p.content_hash for p in timed} == dict(at)[n]
        assert all(p.runs(n) for p in timed)
    # without the map every loaded plan that runs 1 KB would be timed there, the other sizes' contenders too
    every = size_candidates(BenchConfig("allreduce", tuple(sizes), "bf16"), plans, KB)
    assert len(every) > len(size_candidates(config, plans, KB))
