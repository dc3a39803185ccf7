"""The A/B tools: bench/ab_compare.py (two trees' bench and tp_decode results), bench/ptx_ab.py (two trees'
interpreter PTX, entry by entry), and bench/kernel_trace.py's LL against Lamport pairs."""

from __future__ import annotations

import json
from pathlib import Path

from _bench import bench_script

ROOT = Path(__file__).resolve().parents[1]


def _bench(path: Path, plans: dict[str, float], nccl_us: float, symm_us: float) -> None:
    row = {
        "size": 1024,
        "weft_us": min(plans.values()),
        "nccl_us": nccl_us,
        "plan": "p",
        "wrong": 0,
        "plans_us": plans,
        "median_us": {"nccl": nccl_us, "symm:two_shot": symm_us, "weft:p": min(plans.values())},
    }
    path.write_text(json.dumps({"rows": [row]}))


def test_the_bench_ratio_is_every_plans_median_over_the_peers_drift(tmp_path):
    ab = bench_script("ab_compare")
    _bench(tmp_path / "ab_allreduce_1_base.json", {"a": 4.0, "b": 5.0, "c": 6.0}, 10.0, 8.0)
    # the machine drifted 10% (both peers), and plan c also took 50% longer: one plan's outlier moves the median not
    new = {"a": 4.4, "b": 5.5, "c": 9.0}
    _bench(tmp_path / "ab_allreduce_2_new.json", new, 11.0, 8.8)
    (row,) = ab.bench_ratios(ab._runs(tmp_path, "allreduce", "base"), ab._runs(tmp_path, "allreduce", "new"))
    assert row["plans"] == 3 and row["peers"] == ["nccl", "symm:two_shot"]
    assert round(row["ratio"], 6) == 1.1 and round(row["drift"], 6) == 1.1 and round(row["normalized"], 6) == 1.0
    assert (row["base_us"], row["new_us"]) == (4.0, 4.4)


def test_the_drift_is_the_median_peer_so_one_erratic_peer_moves_no_ratio(tmp_path):
    ab = bench_script("ab_compare")
    base, new = {"a": 4.0, "b": 5.0}, {"a": 4.0, "b": 5.0}  # the same code, the same times
    for name, plans, nccl in (("ab_allreduce_1_base.json", base, 20.0), ("ab_allreduce_2_new.json", new, 16.0)):
        row = {"size": 1024, "weft_us": 4.0, "nccl_us": nccl, "plan": "a", "wrong": 0, "plans_us": plans}
        row["median_us"] = {"nccl": nccl, "symm:one_shot": 6.0, "symm:two_shot": 7.0}
        (tmp_path / name).write_text(json.dumps({"rows": [row]}))
    (row,) = ab.bench_ratios(ab._runs(tmp_path, "allreduce", "base"), ab._runs(tmp_path, "allreduce", "new"))
    # NCCL read 20% faster on one side; the symmetric-memory peers held: no drift, and the plans' ratio stands
    assert row["drift"] == 1.0 and row["normalized"] == 1.0


def _runs_of(plan_us: list[float], nccl_us: list[float]) -> list[dict]:
    rows = [
        {"size": 1024, "weft_us": p, "nccl_us": n, "plan": "a", "wrong": 0, "plans_us": {"a": p, "b": 2 * p}}
        for p, n in zip(plan_us, nccl_us, strict=True)
    ]
    for row in rows:
        row["median_us"] = {"nccl": row["nccl_us"]}
    return [{"rows": [row]} for row in rows]


def test_the_verdict_reads_the_estimator_whose_a_a_is_tighter():
    ab = bench_script("ab_compare")
    # the plans hold within 0.5% from run to run while NCCL swings 20%: the raw ratio is the call's tighter reading
    base, new = _runs_of([4.0, 4.02, 4.0, 4.01], [10, 12, 9.5, 11.8]), _runs_of([4.01, 4.0, 4.02, 4.0], [12, 10, 11, 9])
    rows = ab.bench_ratios(base, new)
    assert ab.with_verdict(rows, base, new) == "ratio"
    assert rows[0]["verdict"] == rows[0]["ratio"] and abs(rows[0]["verdict"] - 1) < 0.01
    assert abs(rows[0]["aa_base_normalized"] - 1) > 0.1  # what the normalized estimator would have read
    # the machine drifts 10% between alternate runs, plans and NCCL alike: the normalized ratio is the tighter one
    base, new = _runs_of([4.0, 4.4, 4.0, 4.4], [10, 11, 10, 11]), _runs_of([4.4, 4.0, 4.4, 4.0], [11, 10, 11, 10])
    rows = ab.bench_ratios(base, new)
    assert ab.with_verdict(rows, base, new) == "normalized" and rows[0]["verdict"] == rows[0]["normalized"]
    # one run a side: no A/A, the normalized ratio
    base, new = _runs_of([4.0], [10]), _runs_of([4.4], [11])
    rows = ab.bench_ratios(base, new)
    assert ab.with_verdict(rows, base, new) == "normalized" and round(rows[0]["verdict"], 6) == 1.0


def test_a_plan_only_one_side_ran_is_left_out_of_the_ratio(tmp_path):
    ab = bench_script("ab_compare")
    _bench(tmp_path / "ab_allreduce_1_base.json", {"a": 4.0, "gone": 1.0}, 10.0, 8.0)
    _bench(tmp_path / "ab_allreduce_2_new.json", {"a": 4.2, "added": 9.0}, 10.0, 8.0)
    (row,) = ab.bench_ratios(ab._runs(tmp_path, "allreduce", "base"), ab._runs(tmp_path, "allreduce", "new"))
    assert row["plans"] == 1 and round(row["normalized"], 6) == 1.05


def test_decode_rows_pair_each_batch_and_time_and_skip_raw_lists():
    ab = bench_script("ab_compare")
    base = [{"rows": [{"batch": 1, "weft_ms": 2.0, "weft_raw_step_ms": [2.0], "weft_plan": "p"}]}]
    new = [{"rows": [{"batch": 1, "weft_ms": 2.1, "weft_raw_step_ms": [2.1], "weft_plan": "p"}]}]
    (row,) = ab.decode_ratios(base, new)
    assert row["time"] == "weft_ms" and round(row["ratio"], 6) == 1.05 and row["drift"] == 1.0


def test_decode_times_are_each_sides_median_over_its_runs_over_nccls_drift():
    ab = bench_script("ab_compare")

    def run(weft: float, nccl: float) -> dict:
        return {"rows": [{"batch": 4, "weft-fused_ms": weft, "nccl_ms": nccl, "weft-fused_isolated_us_per_call": 4.0}]}

    base = [run(2.0, 3.0), run(2.2, 3.3), run(9.0, 3.0)]  # one slow outlier run: the median leaves it out
    new = [run(2.2, 3.3), run(2.2, 3.3)]  # 10% slower, and so is NCCL: the machine drifted
    rows = {r["time"]: r for r in ab.decode_ratios(base, new)}
    fused = rows["weft-fused_ms"]
    assert (fused["base"], fused["new"], fused["runs"]) == (2.2, 2.2, [3, 2])
    assert round(rows["nccl_ms"]["ratio"], 6) == 1.1 and rows["nccl_ms"]["drift"] == 1.0
    assert round(fused["drift"], 6) == 1.1 and round(fused["normalized"], 6) == round(1 / 1.1, 6)
    assert rows["weft-fused_isolated_us_per_call"]["drift"] == 1.0  # no NCCL time of that kind in these runs


def test_ptx_entries_compare_after_renaming_what_compilation_numbers():
    ptx = bench_script("ptx_ab")
    body = ".visible .entry k(\n{{\n\t.local .align 8 .b8 \t__local_depot{d}[24];\n\t@%p1 bra \t$L__BB{d}_4;\n}}\n"
    base, same, changed = body.format(d=1), body.format(d=7), body.format(d=1).replace("bra", "brx")

    assert ptx.compare(ptx.renamed_entries(base), ptx.renamed_entries(same))["identical"] == 1
    result = ptx.compare(ptx.renamed_entries(base), ptx.renamed_entries(changed))
    assert result["identical"] == 0 and result["entries"][0]["changed_lines"] == 2


def test_kernel_trace_pairs_each_lamport_plan_with_the_ll_plan_of_its_schedule():
    trace = bench_script("kernel_trace")
    pairs = trace.lamport_pairs(2)
    assert len(pairs) == 2 * len(trace.LAMPORT_CASES)
    for (ll, size, _), (lamport, same_size, _) in zip(pairs[::2], pairs[1::2], strict=True):
        assert (ll.protocol, lamport.protocol, size) == ("LL", "Lamport", same_size)
        assert ll.name.replace("-ll-", "-lamport-") == lamport.name  # same algorithm, instances and threads
