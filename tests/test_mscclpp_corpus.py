"""MSCCL++'s own DSL plans (tests/fixtures/mscclpp, from MSCCL++ 1f5f065d) read, run and check in weft.

Every plan parses or is refused in one line: for switch (NVLS) channels, or for a get that MSCCL++'s kernel runs
with its two offsets swapped. Every collective plan (``sendrecv`` included: each rank's input to the next rank) is
correct on the CPU reference executor, or fails its check for a named reason; MSCCL++'s unit-test plans (collective
"test": one op each, no result defined) run clean or fail for a named reason. The port engine's programs of the
multi-node plans compute their collectives. docs/formats.md's counts are this file's numbers, the GPU counts those of
the committed results."""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from _docs import docs_text

from executor.errors import ExecutorError
from executor.gpu.tables import build_tables, tbg_window
from executor.port.program import compile_programs, run_programs
from executor.reference.machine import WrongResult, chunk_elems, smallest_size
from executor.reference.prove import _compare, check_plan, expected_outputs, random_inputs, run_reference
from schedules.collectives import Collective, CollectiveError
from schedules.plan.io import parse_plan
from schedules.plan.types import PlanError
from weftcore.errors import CheckFailed

ROOT = Path(__file__).parent
CORPUS = ROOT / "fixtures" / "mscclpp"
RESULTS = ROOT.parent / "bench" / "results"

# the unit-test plans that fail the CPU check, each for its reason (MSCCL++ says they may not run on its executor)
UNIT_TEST_FAILURES = {
    "unit_tests-copy_packet_test": "overwrites the packets of launch 0",  # packets nothing reads
    "unit_tests-put_packet_test": "overwrites the packets of launch 0",
    "unit_tests-put-put_fuse_test": "before its write by rank 0",
    "unit_tests-put-put_with_signal_test": "while a put in flight",  # back to back: no flush before the kernel ends
    "unit_tests-tbg-tbg_reduce_send_test": "no happens-before edge",  # only block 0 of the group signals
    "unit_tests-read_put_packet_test": "waits for packets",  # reads packets nothing writes
    "unit_tests-reduce_copy_packet_test": "waits for packets",
    "unit_tests-reduce_copy_send_packet_test": "waits for packets",
    "unit_tests-reduce_packet-reduce_packets_fuse_test": "waits for packets",
    "unit_tests-reduce_packet-reduce_packets_test": "waits for packets",
    "unit_tests-reduce_send_packet_test": "waits for packets",
    "unit_tests-signal_wait-relaxed_signal_wait_fuse_test": "waits on channel 2",  # signals 0,1, waits 2,3
    "unit_tests-signal_wait-signal_wait_fuse_test": "waits on channel 2",
}
# collective plans that fail the CPU check, each for its reason
NO_FLUSH = "may still read it: no flush of that channel came before the kernel's end"
COLLECTIVE_FAILURES = {
    # back to back: a port put of launch k may still read the input the host overwrites for launch k+1: the plan
    # flushes nothing, and neither does MSCCL++'s kernel at its end nor its Executor::execute (which only
    # launches); one launch alone is correct
    "multi_node-reducescatter-gpuspernode-2": NO_FLUSH,
    "multi_node-reducescatter-gpuspernode-4": NO_FLUSH,
    "multi_node-send_recv-nnodes-1-gpuspernode-2-instances-2": NO_FLUSH,
    "multi_node-send_recv-nnodes-2-gpuspernode-2-instances-2": NO_FLUSH,
    "multi_node-send_recv-nnodes-2-gpuspernode-4-instances-2": NO_FLUSH,
    # MSCCL++'s allgather_tbg.py passes gpus_per_node and tbg_size to its function in swapped places, so
    # "--gpus_per_node 2 --tbg_size 4" builds ONE node of 4 GPUs (tbg size 2) whose ring "to the next node" joins
    # each rank to itself by two port channels: block 0 signals one and waits on the other, which nothing signals
    # (MSCCL++'s per-peer tags pair each self channel with itself, so its executor would wait forever too)
    "multi_node-allgather_tbg-numgpus-4-gpuspernode-2-tbgsize-4": "waits on port channel 0 from rank 0",
}
COUNTS = {
    "plans": 94,
    "refused: switch (NVLS) channels": 12,
    "refused: get with offsets MSCCL++ swaps": 2,
    "collective plans correct on the CPU reference": 41,
    "collective plans failing the CPU check": 6,
    "unit-test plans run clean": 20,
    "unit-test plans failing the CPU check": 13,
}


@cache
def _outcomes() -> dict[str, tuple[str, str]]:
    """plan name -> (outcome, the one line that says why)."""
    out = {}
    for path in sorted((CORPUS / "plans").glob("*.json")):
        try:
            plan = parse_plan(json.loads(path.read_text()), str(path))
        except PlanError as e:
            kind = "switch" if "'switch'" in str(e) else "get" if "handleGet" in str(e) else "other"
            out[path.stem] = (f"refused: {kind}", str(e))
            continue
        try:
            check_plan(plan, [smallest_size(plan)], ["fp32"])
            out[path.stem] = ("verified" if plan.checkable else "clean", "")
        except CheckFailed as e:
            out[path.stem] = ("failed", str(e))
    return out


def test_the_manifest_names_the_mscclpp_commit_and_every_plan():
    manifest = json.loads((CORPUS / "MANIFEST.json").read_text())
    assert manifest["mscclpp_commit"].startswith("1f5f065d")
    assert sorted(Path(p["file"]).stem for p in manifest["plans"]) == sorted(_outcomes())
    assert {len(json.loads((CORPUS / p["file"]).read_text())["gpus"]) for p in manifest["plans"]} >= {2, 4, 8}


def test_every_plan_parses_or_is_refused_in_one_line_for_switch_channels_or_a_swapped_get():
    for name, (outcome, why) in _outcomes().items():
        if outcome == "refused: switch":
            assert re.search(
                r"\.json: gpus\[\d+\]\.channels\[\d+\]\.channel_type: unsupported channel type "
                "'switch'",
                why,
            ), why
        elif outcome == "refused: get":
            assert name.startswith("unit_tests-get") and re.search(r"ops\[\d+\]\.dst_buff\[\d\]\.index: 0 differs", why)
        else:
            assert not outcome.startswith("refused"), why
        assert "\n" not in why


def test_every_collective_plan_is_correct_on_the_cpu_reference():
    verified = {n for n, (o, _) in _outcomes().items() if o == "verified"}
    failed = {n: why for n, (o, why) in _outcomes().items() if o == "failed" and not n.startswith("unit_tests")}
    assert set(failed) == set(COLLECTIVE_FAILURES)
    for name, why in failed.items():
        assert COLLECTIVE_FAILURES[name] in why
    assert {n.split("-numgpus")[0] for n in verified} >= {
        "single_node-allreduce",
        "single_node-allreduce_pkt",
        "single_node-allgather_tbg",
        "single_node-alltoall-alltoall_pipeline",
        "single_node-allgather_pkt_rppkt",
    }


def test_unit_test_plans_run_clean_or_fail_for_their_named_reason():
    failed = {n: why for n, (o, why) in _outcomes().items() if o == "failed" and n.startswith("unit_tests")}
    assert set(failed) == set(UNIT_TEST_FAILURES)
    for name, why in failed.items():
        assert UNIT_TEST_FAILURES[name] in why and "\n" not in why


def test_counts_are_the_readmes():
    tally = Counter(o for o, _ in _outcomes().values())
    unit = sum(o == "failed" for n, (o, _) in _outcomes().items() if n.startswith("unit_tests"))
    counts = {
        "plans": len(_outcomes()),
        "refused: switch (NVLS) channels": tally["refused: switch"],
        "refused: get with offsets MSCCL++ swaps": tally["refused: get"],
        "collective plans correct on the CPU reference": tally["verified"],
        "collective plans failing the CPU check": tally["failed"] - unit,
        "unit-test plans run clean": tally["clean"],
        "unit-test plans failing the CPU check": unit,
    }
    assert counts == COUNTS
    text = docs_text()
    for what, n in counts.items():
        assert f"| {what} | {n} |" in text


def _gpus(name: str) -> int:
    return len(json.loads((CORPUS / "plans" / f"{name}.json").read_text())["gpus"])


def test_gpu_counts_are_the_committed_results():
    doc = json.loads((RESULTS / "gpu_mscclpp_corpus_2xh200.json").read_text())
    plans = {r["plan"] for r in doc["rows"]}
    assert len(plans) == 12 and all(r["ok"] for r in doc["rows"]) and "H200" in doc["machine"]
    verified = {n for n, (o, _) in _outcomes().items() if o == "verified"}
    assert {p[:-5] for p in plans} <= verified
    # the one-GPU path ran every 4- and 8-rank single-node plan that the CPU reference verifies, each correct
    one = doc["one_device"]
    for n in ("4", "8"):
        assert one[n]["failed"] == [] and set(one[n]["exit_codes"]) == {0} and one[n]["cases"] >= len(one[n]["plans"])
        assert set(one[n]["plans"]) == {p for p in verified if p.startswith("single_node") and _gpus(p) == int(n)}
    text = docs_text()
    assert f"| 2-rank plans correct against NCCL on 2×H200 | {len(plans)} |" in text
    assert (
        f"| 4- and 8-rank plans correct on the one-GPU path | {len(one['4']['plans']) + len(one['8']['plans'])} |"
        in text
    )


def test_multi_node_gpu_counts_are_the_committed_results():
    """Every 4-rank multi-node plan that runs at all (not the self-connected tbg one) ran on 4 GPUs as 2 hosts,
    correct against NCCL at both sizes; the 2-rank sendrecv on 2 GPUs."""
    doc = json.loads((RESULTS / "gpu_mscclpp_multinode_4xh200.json").read_text())
    assert "H200" in doc["machine"] and doc["gpus"] == 4 and "via NET/Socket" in doc["nccl"]
    rows, two = doc["rows"], doc["sendrecv_2gpu"]["rows"]
    assert all(r["ok"] and r["engine"] == "port" for r in rows + two) and {r["size"] for r in rows} == {65536, 4 << 20}
    ran = {r["plan"][:-5] for r in rows}
    runnable = {
        n
        for n, (o, _) in _outcomes().items()
        if n.startswith("multi_node")
        and _gpus(n) == 4
        and o in ("verified", "failed")
        and n not in {"multi_node-allgather_tbg-numgpus-4-gpuspernode-2-tbgsize-4"}
    }
    assert ran == runnable and len(ran) == 6
    assert {r["plan"][:-5] for r in two} == {
        n for n in _outcomes() if n.startswith("multi_node-send_recv") and _gpus(n) == 2
    }
    run = doc["weft_run_check"]["lines"]  # `weft run --check`: the CLI's path, NCCL's sendrecv by send and receive
    assert len(run) == 2 and all(line.endswith("check against NCCL: ok") for line in run)
    text = docs_text()
    assert f"| 4-rank multi-node plans correct against NCCL on 4×H200 as 2 hosts × 2 GPUs | {len(ran)} |" in text
    assert "| 2-rank sendrecv plan correct against NCCL on 2×H200 | 1 |" in text


@pytest.mark.parametrize("name", sorted(p.stem for p in (CORPUS / "plans").glob("multi_node-*.json")))
def test_port_programs_of_the_multi_node_plans_compute_their_collectives(name):
    """What the 4-GPU run ran, on numpy: in-place and LL plans too (packets as their data)."""
    plan = parse_plan(json.loads((CORPUS / "plans" / f"{name}.json").read_text()), f"{name}.json")
    if name in COLLECTIVE_FAILURES and "port channel 0 from rank 0" in COLLECTIVE_FAILURES[name]:
        with pytest.raises(ExecutorError, match="no run of the plan gets past rank 0 threadblock 0 op 1"):
            compile_programs(plan)
        return
    programs = compile_programs(plan)
    elems = chunk_elems(plan, smallest_size(plan), "bf16")
    inputs = random_inputs(plan, elems, np.random.default_rng(3))
    outputs = run_programs(plan, programs, inputs, elems, "bf16")
    _compare(plan, expected_outputs(plan.collective_spec(), inputs, elems, "bf16"), outputs, elems, "bf16")


def test_sendrecv_is_a_shift_with_one_slice_per_buffer():
    c = Collective("sendrecv", 4, 2)
    assert [c.output_map(r) for r in range(4)] == [c.input_map((r - 1) % 4) for r in range(4)]
    assert all(c.postcondition(r) == set(c.output_map(r)) == c.precondition((r - 1) % 4) for r in range(4))
    assert (c.size_chunks, c.message_parts, c.bus_factor) == (2, 1, 1.0)
    with pytest.raises(CollectiveError, match="weft does not synthesize it"):
        _ = c.dual
    with pytest.raises(CollectiveError, match="choose from allgather, .*, alltoall, sendrecv"):
        Collective("sendreceive", 4)


def test_sendrecv_moves_each_rank_s_input_to_the_next_rank():
    plan = parse_plan(
        json.loads((CORPUS / "plans" / "multi_node-send_recv-nnodes-2-gpuspernode-2-instances-2.json").read_text()),
        "sendrecv.json",
    )
    size = smallest_size(plan)
    inputs = [np.full(size // 4, r + 1, np.float32) for r in range(4)]
    outputs = run_reference(plan, inputs, size, "fp32")
    assert [int(o[0]) for o in outputs] == [4, 1, 2, 3] and all((o == o[0]).all() for o in outputs)
    assert check_plan(plan, [size], ["fp32"], back_to_back=1).ok


def _hand_plan(ops: list[dict]) -> dict:
    """A 2-rank LL all-reduce: each rank sends its input to the peer as packets, then ``ops``."""

    def gpu(r):
        return {
            "id": r,
            "input_chunks": 2,
            "output_chunks": 2,
            "scratch_chunks": 6,
            "channels": [{"channel_type": "memory", "connected_to": [1 - r]}],
            "remote_buffers": [{"rank": 1 - r, "type": "s", "access_channel_types": ["memory"]}],
            "threadblocks": [
                {
                    "id": 0,
                    "channels": [{"channel_type": "memory", "channel_ids": [0]}],
                    "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}],
                    "ops": [{"name": "ppkt", "src_buff": [_l("i", 0)], "dst_buff": [_r(0)], "channel_type": "memory"}]
                    + ops,
                }
            ],
        }

    return {
        "name": "hand",
        "collective": "allreduce",
        "protocol": "LL",
        "inplace": False,
        "use_double_scratch_buffer": True,
        "gpus": [gpu(0), gpu(1)],
    }


def _l(t, i):
    return {"type": t, "index": i, "size": 2}


def _r(i):
    return {"buffer_id": 0, "index": i, "size": 2}


def test_recpkt_sums_into_plain_data_and_local_packets():
    # the packet copy (dst_buff[1]) is what reaches the output: a wrong packet copy would be a wrong result
    plan = parse_plan(
        _hand_plan(
            [
                {"name": "recpkt", "src_buff": [_l("i", 0), _l("s", 0)], "dst_buff": [_l("s", 4), _l("s", 2)]},
                {"name": "upkt", "src_buff": [_l("s", 2)], "dst_buff": [_l("o", 0)]},
            ]
        ),
        "recpkt.json",
    )
    assert check_plan(plan, [64], ["fp32", "bf16"]).ok


def test_recspkt_also_sends_the_sum_as_packets_to_the_peer():
    plan = parse_plan(
        _hand_plan(
            [
                {
                    "name": "recspkt",
                    "src_buff": [_l("i", 0), _l("s", 0)],
                    "dst_buff": [_l("o", 0), _l("s", 2), _r(4)],
                    "channel_type": "memory",
                },
                {"name": "upkt", "src_buff": [_l("s", 2)], "dst_buff": [_l("o", 0)]},
                {"name": "upkt", "src_buff": [_l("s", 4)], "dst_buff": [_l("o", 0)]},
            ]
        ),
        "recspkt.json",
    )
    assert check_plan(plan, [64], ["fp32"]).ok


def test_tbg_members_each_move_their_slice():
    doc = json.loads((CORPUS / "plans" / "single_node-allgather_tbg.json").read_text())
    plan = parse_plan(doc, "tbg.json")
    size = smallest_size(plan)
    tables = build_tables(plan, 0, size)
    put = plan.gpus[0].threadblocks[1].ops[1]
    assert put.tbg == (1, 4) and tbg_window(put, tables.chunk_bytes) == (
        tables.chunk_bytes // 4,
        tables.chunk_bytes // 4,
    )
    # drop one member's put: its quarter of the peer's output is never written
    del doc["gpus"][0]["threadblocks"][3]["ops"][1]
    with pytest.raises(WrongResult, match="rank 1 output chunk 0"):
        check_plan(parse_plan(doc, "tbg.json"), [size], ["fp32"])


def test_pipeline_runs_its_ops_once_per_unit():
    plan = parse_plan(json.loads((CORPUS / "plans" / "unit_tests-pipeline_test.json").read_text()), "p.json")
    (pipeline,) = plan.gpus[0].threadblocks[0].ops
    assert pipeline.unit_size == 1 << 20 and pipeline.num_chunks == 1
    assert len(build_tables(plan, 0, 1 << 20).ops) == 1
    assert len(build_tables(plan, 0, (1 << 22) + 1024).ops) == 5  # ceil(4 MiB + 1 KiB / 1 MiB) iterations
    size = smallest_size(plan) * 2  # two slots per chunk: the reference runs two iterations
    out = run_reference(plan, [np.arange(size // 4, dtype=np.float32)], size, "fp32")
    assert np.array_equal(out[0], np.arange(size // 4))


def test_ops_name_the_threadblocks_channels():
    # MSCCL++'s kernel indexes the block's own channel list: index 1 of [2, 0] is GPU channel 0
    plan = parse_plan(
        json.loads((CORPUS / "plans" / "single_node-alltoall-alltoall_pipeline-numgpus-2.json").read_text()), "a.json"
    )
    tb = plan.gpus[0].threadblocks[0]
    assert tb.channels[0].channel_ids == (2, 0)
    signal = next(op for op in tb.ops[5].ops if op.name == "signal")
    assert signal.channel_ids == (0,)


@pytest.mark.parametrize(
    "edit,field,says",
    [
        (lambda op: op.update(name="frobnicate"), "ops[5].name", "unsupported op 'frobnicate' (weft runs "),
        (lambda op: op.update(speed=3), "ops[5].speed", "field not supported by weft on op 'put' (weft reads "),
        (
            lambda op: op["dst_buff"][0].update(stride=2),
            "ops[5].dst_buff[0].stride",
            "field not supported by weft on a buffer entry (weft reads buffer_id, index, offset, size, type)",
        ),
        (lambda op: op.update(tbg_info={"tb_id": 4, "tbg_size": 4}), "ops[5].tbg_info.tb_id", "not below tbg_size 4"),
    ],
)
def test_unknown_ops_and_fields_are_refused_in_one_line(edit, field, says):
    doc = json.loads((CORPUS / "plans" / "single_node-allgather_tbg.json").read_text())
    edit(doc["gpus"][0]["threadblocks"][0]["ops"][5])
    with pytest.raises(PlanError) as e:
        parse_plan(doc, "edited.json")
    assert f"edited.json: gpus[0].threadblocks[0].{field}: " in str(e.value) and says in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "where,key", [((), "priority"), (("gpus", 0), "clock"), (("gpus", 0, "threadblocks", 1), "sm")]
)
def test_unknown_plan_gpu_and_threadblock_fields_are_refused(where, key):
    doc = json.loads((CORPUS / "plans" / "single_node-allgather_tbg.json").read_text())
    node = doc
    for step in where:
        node = node[step]
    node[key] = 1
    with pytest.raises(
        PlanError,
        match=r"edited\.json: (gpus\[0\]\.(threadblocks\[1\]\.)?)?"
        + key
        + r": field not supported by weft on a .* \(weft reads ",
    ):
        parse_plan(doc, "edited.json")


def test_a_foreign_op_the_kernel_would_run_otherwise_is_refused_but_weft_s_own_runs():
    doc = json.loads((CORPUS / "plans" / "unit_tests-copy_test.json").read_text())
    op = doc["gpus"][0]["threadblocks"][0]["ops"][0]
    op["src_buff"], op["dst_buff"] = op["src_buff"] * 2, op["dst_buff"] * 2  # MSCCL++'s handleCopy reads entry 0 only
    with pytest.raises(
        PlanError,
        match=r"ops\[0\]\.src_buff: 2 entries; MSCCL\+\+'s kernel runs op 'copy' on the "
        r"first 1 only \(weft would run every entry as listed",
    ):
        parse_plan(doc, "copy2.json")
    doc["weft"] = {"channel_ids": "threadblock"}  # weft's own plan: weft's meaning (mscclpp_verdict names it)
    assert parse_plan(doc, "copy2.json").gpus[0].threadblocks[0].ops[0].name == "copy"


@pytest.mark.parametrize(
    "argv",
    [
        ["synth", "sendrecv", "-t", "hgx_h200:gpus=4", "--method", "ring"],
        ["synth", "sendrecv", "-t", "hgx_h200:gpus=4", "--method", "smt"],
        ["topo", "bound", "hgx_h200:gpus=4", "sendrecv"],
    ],
)
def test_sendrecv_is_checked_and_run_but_never_synthesized(argv, capsys, tmp_path, monkeypatch):
    from weft.cli import main

    monkeypatch.setenv("WEFT_REGISTRY", str(tmp_path / "registry"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "collective sendrecv: weft checks and runs plans for it (MSCCL++'s) but does not synthesize it" in err
    )
    assert not (tmp_path / "registry").exists()


def test_a_sendrecv_plan_that_sends_past_the_next_rank_is_refused():
    # MSCCL++'s SendRecv with a split mask sends to r + group_size under the same collective name
    doc = json.loads((CORPUS / "plans" / "multi_node-send_recv-nnodes-2-gpuspernode-2-instances-2.json").read_text())
    assert parse_plan(doc, "ok.json").collective == "sendrecv"
    n = len(doc["gpus"])
    for gpu in doc["gpus"]:  # every channel and put now reaches two ranks on (4 ranks: r+2 and back pair up)
        for buffer in gpu["remote_buffers"]:
            buffer["rank"] = (buffer["rank"] + 1) % n
        for channel in gpu["channels"]:
            channel["connected_to"] = [(peer + 1) % n for peer in channel["connected_to"]]
    with pytest.raises(
        PlanError,
        match=r"shifted\.json: gpus\[0\]\.threadblocks\[\d+\]\.ops\[\d+\]\.dst_buff\[0\]: "
        r"names rank 2, but a sendrecv moves rank r's input to rank r\+1 only",
    ):
        parse_plan(doc, "shifted.json")
