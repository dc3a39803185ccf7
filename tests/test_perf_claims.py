"""Ranges the README states in prose, recomputed from the results files they link."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readmes_all_to_all_range_is_what_the_2_and_4_gpu_results_hold_up_to_1mb():
    ratios = [
        row["weft_us"] / row["nccl_us"]
        for n in (2, 4)
        for row in json.loads((ROOT / f"bench/results/gpu_alltoall_bf16_graph_{n}xh200.json").read_text())["rows"]
        if row["size"] <= 1 << 20
    ]
    claim = f"all-to-all ({min(ratios):.2f}–{max(ratios):.2f}× NCCL's time up to 1 MB on 2 and 4"
    assert claim in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())


def _port_rows(collective: str) -> list[dict]:
    path = ROOT / f"bench/results/gpu_{collective}_bf16_graph_4xh200_2hosts.json"
    doc = json.loads(path.read_text())
    assert doc["transport"]["env"]["NCCL_P2P_DISABLE"] == "1"  # NCCL on sockets too: the same transport
    assert all(row["wrong"] == 0 and row["lanes"] == 4 for row in doc["rows"])
    assert [row["size"] for row in doc["rows"]] == [s << 20 for s in (1, 2, 4, 16, 64, 256)]
    return doc["rows"]


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}×"


def test_the_docs_sockets_ranges_are_what_the_4xh200_two_host_results_hold():
    """docs/codegen-executor.md's claims for 4 GPUs as 2 hosts over sockets (the synthesized MILP's, the README's
    too): the MILP at one chunk a rank (`@sockets_c1`) and the best plan against NCCL at every size from 1 to 256 MB,
    and four lanes against one."""
    docs = " ".join((ROOT / "docs/codegen-executor.md").read_text(encoding="utf-8").split())
    synth: dict[str, list[float]] = {}
    best: dict[str, list[float]] = {}
    lanes: list[float] = []
    for collective in ("allgather", "allreduce"):
        rows = _port_rows(collective)
        synth[collective] = [row["nccl_us"] / row["plans_us"][f"milp-{collective}@sockets_c1+lanes4"] for row in rows]
        best[collective] = [row["nccl_us"] / row["weft_us"] for row in rows]
        for row in rows:
            times = row["plans_us"]
            one = min(us for name, us in times.items() if name.endswith("+lanes1"))
            lanes.append(one / min(us for name, us in times.items() if name.endswith("+lanes4")))
    assert min(min(ratios) for ratios in synth.values()) > 1.0  # the goal: ahead of NCCL at every size
    synth_claim = f"all-gather {_span(synth['allgather'])}, all-reduce {_span(synth['allreduce'])}"
    assert synth_claim in docs
    assert synth_claim in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    best_claim = f"all-gather {_span(best['allgather'])} and all-reduce {_span(best['allreduce'])}"
    assert f"{best_claim} from 1 MB to 256 MB" in docs
    assert f"every size over sockets ({_span(lanes)})" in docs


def test_the_docs_4xh200_compiled_figures_are_those_of_their_results_file():
    doc = json.loads(
        (ROOT / "bench/results/compiled_4xh200_s10/gpu_allreduce_bf16_graph_4xh200_compiled_huge.json").read_text()
    )
    rows = doc["rows"]
    assert [r["size"] for r in rows] == [16 << 20, 64 << 20, 256 << 20] and all(r["wrong"] == 0 for r in rows)
    weft = ", ".join(f"{r['weft_us']:.1f}" for r in rows[:2]) + f" and {rows[2]['weft_us']:.1f}"
    ratios = ", ".join(f"{r['weft_us'] / r['best_peer_us']:.2f}×" for r in rows[:2])
    ratios += f" and {rows[2]['weft_us'] / rows[2]['best_peer_us']:.2f}×"
    docs = " ".join((ROOT / "docs/performance.md").read_text(encoding="utf-8").split())
    assert f"{weft} µs at 16, 64 and 256 MB" in docs
    assert ratios in docs
    assert all(r["compiled"] and r["best_peer_us"] > r["weft_us"] for r in rows)


def _docs(name: str) -> str:
    return " ".join((ROOT / name).read_text(encoding="utf-8").split())


def test_the_docs_moe_layer_ranges_are_the_4xh100_runs_and_clear_the_goal():
    """docs/performance.md's MoE paragraph: weft's layer (the fused expert exchange) over NCCL's in each of the three
    lean-routing runs at EP=4, 1-64 tokens: every row bit-identical, and each run's least speedup at least 1.15."""
    folder = ROOT / "bench/results/moe_layer_4xh100_s11"
    spans = []
    for run in ("run1", "run2", "run3"):
        doc = json.loads((folder / f"{run}.json").read_text())
        assert doc["ep"] == 4 and doc["routing"] == "lean" and doc["layers"] == 8
        rows = [r for r in doc["rows"] if r["tokens"] <= 64]
        assert [r["tokens"] for r in rows] == [1, 2, 4, 8, 16, 32, 64]
        assert all(r["bitwise"] and r["paths"]["weft"] == "fused" for r in doc["rows"])
        assert min(r["speedup"] for r in rows) >= 1.15
        spans.append(f"{min(r['speedup'] for r in rows):.2f}–{max(r['speedup'] for r in rows):.2f}×")
    assert (ROOT / "bench/results/moe_layer_4xh100.json").read_bytes() == (folder / "run1.json").read_bytes()
    assert f"EP=4 on 4×H100: {spans[0]} NCCL's layer speed at 1–64 tokens" in _docs("README.md")
    assert f"ran {spans[0]}, {spans[1]} and {spans[2]} NCCL's speed at 1–64 tokens" in _docs("docs/performance.md")


def test_the_docs_2dh_figures_are_the_nvlink_fabric_results_and_clear_the_goal_from_1mb():
    """docs/performance.md's 2DH sentence: 2DH's busbw over NCCL's at every size from 1 MB (the same bytes, so the
    time ratio), NCCL on sockets between the hosts; the 2DH plan is the one whose hash is not the flat plan's."""
    doc = json.loads((ROOT / "bench/results/gpu_alltoall_bf16_graph_2dh_2x2h100_nvlink.json").read_text())
    assert doc["transport"]["hosts"] == ["host0", "host0", "host1", "host1"]
    flat = "4a63cd2b2683d09d"  # direct-alltoall-hgx_h200:nodes=2,gpus=2-simple-x1
    ratios = []
    for row in doc["rows"]:
        assert row["wrong"] == 0 and len(row["plans_us"]) == 2
        (twodh,) = [us for h, us in row["plans_us"].items() if h != flat]
        ratios.append(row["nccl_us"] / twodh)
    assert [row["size"] for row in doc["rows"]] == [s << 20 for s in (1, 2, 4, 16, 64)]
    assert min(ratios) >= 1.3
    said = ", ".join(f"{r:.2f}×" for r in ratios[:-1]) + f" and {ratios[-1]:.2f}×"
    assert f"2DH ran {said} NCCL's busbw at 1, 2, 4, 16 and 64 MB" in _docs("docs/performance.md")


def test_the_lamport_ranges_are_what_the_s12_results_hold():
    """docs/performance.md's prose under the twelfth session's 4×H200 Lamport table (where weft leads, trails and is
    level on 4 GPUs) and the README's range against FlashInfer on 2 GPUs, recomputed from the files."""
    folder = ROOT / "bench/results/lamport_mp_4xh200_s12"
    four = {
        row["size"]: row["weft_us"] / row["best_peer_us"]
        for name in ("small", "midsize")
        for row in json.loads((folder / f"gpu_allreduce_bf16_graph_4xh200_{name}_compiled.json").read_text())["rows"]
    }
    two = {
        row["size"]: row["weft_us"] / row["flashinfer_us"]
        for row in json.loads((folder / "gpu_allreduce_bf16_graph_2xh200_small_compiled.json").read_text())["rows"]
    }
    kb, mb = 1 << 10, 1 << 20
    lead = [four[4 * kb], four[mb], four[2 * mb]]
    trail = [four[16 * kb], four[64 * kb], four[256 * kb]]
    assert max(lead) < 1 and min(trail) > 1 and four[4 * mb] > 1 and abs(four[kb] - 1) < 0.005
    ahead = [two[s] for s in sorted(two) if s <= 256 * kb]
    docs = _docs("docs/performance.md")
    assert f"at 4 KB and at 1–2 MB ({_span(lead)} the best peer's time)" in docs
    assert f"at 16–256 KB ({_span(trail)}) and symmetric memory at 4 MB ({four[4 * mb]:.2f}×)" in docs
    assert two[mb] > 1  # the README's range stops at 256 KB: 1 MB was behind
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"ahead of FlashInfer from 1 KB to 256 KB ({_span(ahead)})" in readme


def test_the_readmes_two_gpu_lamport_two_shot_range_is_what_the_s13_file_holds():
    """The README's 2×H200 sentence on the Lamport two-shot job: weft ahead of the best peer at every size it timed,
    256 KB to 8 MB, in the range it states, every result checked."""
    doc = json.loads(
        (ROOT / "bench/results/lamport_s13_2xh200/gpu_allreduce_bf16_graph_2xh200_twoshot2.json").read_text()
    )
    rows = doc["rows"]
    assert [row["size"] for row in rows] == [s << 10 for s in (256, 512, 1024, 2048, 4096, 8192)]
    assert all(row["wrong"] == 0 and not any(row["peers_wrong"].values()) for row in rows)
    ratios = [row["weft_us"] / row["best_peer_us"] for row in rows]
    assert max(ratios) < 1
    assert any("twoshot" in row["plan"] and "lamport" in row["plan"] for row in rows)
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"ahead of the best peer at every size from 256 KB to 8 MB ({_span(ratios)} its time;" in readme


def test_the_readmes_4xh200_sweep_ranges_are_what_the_s22_file_holds():
    """The README's sentence on the twenty-second session's 4×H200 sweep (1 KB to 256 MB in one job): the sizes where
    weft leads and trails the best peer, and both ranges, recomputed from the file it links, every result checked."""
    doc = json.loads((ROOT / "bench/results/s22_h200/gpu_allreduce_bf16_graph_4xh200_sweep4.json").read_text())
    rows = doc["rows"]
    assert doc["complete"] and all(row["wrong"] == 0 and not any(row["peers_wrong"].values()) for row in rows)
    ratio = {row["size"]: row["weft_us"] / row["best_peer_us"] for row in rows}
    kb, mb = 1 << 10, 1 << 20
    lead = [kb, 4 * kb, 16 * kb, mb, 4 * mb, 64 * mb, 256 * mb]
    trail = [64 * kb, 256 * kb, 16 * mb]
    assert sorted(ratio) == sorted(lead + trail)
    assert all(ratio[s] < 1 for s in lead) and all(ratio[s] > 1 for s in trail)
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (
        f"at 1 KB–16 KB, 1 MB, 4 MB, 64 MB and 256 MB ({_span([ratio[s] for s in lead])} its time) and trails it "
        f"at 64 KB, 256 KB and 16 MB ({_span([ratio[s] for s in trail])})"
    ) in readme
