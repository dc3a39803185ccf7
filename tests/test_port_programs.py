"""The port engine's side that needs no GPU: every shipped two-host plan is proven on the reference executor, its
per-rank programs (sums and groups of point-to-point transfers) compute the collective and never deadlock when
each group blocks until its peers' groups meet it; host identity refuses CUDA IPC across hosts and names the
channel and transport that cannot run."""

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from executor.hosts import HOST_ENV, host_identity, ipc_across_hosts, transport_refusal
from executor.port.program import (
    Compute,
    Exchange,
    call_lanes,
    compile_programs,
    lane_bounds,
    lanes_for,
    partner_groups,
    run_programs,
    split_peer,
)
from executor.reference.machine import chunk_elems, smallest_size
from executor.reference.prove import _compare, check_plan, expected_outputs, random_inputs
from schedules.plan.io import load_plan

PLANS = sorted((Path(__file__).resolve().parents[1] / "examples" / "plans").glob("two_hosts*/*.plan.json"))


def test_the_two_host_plans_cover_every_method_and_collective():
    names = {(p.parent.name, p.name) for p in PLANS}
    assert names == {
        (t, f"{m}-{c}.plan.json")
        for t in ("two_hosts", "two_hosts_2gpu")
        for m in ("ring", "trees", "milp")
        for c in ("allreduce", "allgather", "reducescatter")
    } | {
        ("two_hosts", "direct-allreduce.plan.json"),
        ("two_hosts_2gpu", "direct-allgather.plan.json"),
        ("two_hosts_2gpu", "twoshot-allreduce.plan.json"),  # direct reduce-scatter, then direct all-gather
    } | {  # one hop each
        ("two_hosts_2gpu", f"{m}-alltoall.plan.json") for m in ("2dh", "direct")
    } | {  # Tutel's 2DH and the flat one; then synthesized for the sockets fabric bench/port_x4.sh's final step uses
        ("two_hosts_2gpu_sockets", f"{m}-{c}.plan.json") for m in ("milp", "trees") for c in ("allgather", "allreduce")
    } | {  # the MILP at one chunk a rank there (`--chunks 1`: priced as the default 4 at 1 MB; lanes split its chunks)
        ("two_hosts_2gpu_sockets_c1", f"milp-{c}.plan.json") for c in ("allgather", "allreduce")
    }


def test_bench_port_x4_times_the_plans_synthesized_for_its_fabric_beside_the_others():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("port_x4", root / "bench" / "port_x4.py")
    port_x4 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(port_x4)
    sockets = root / "examples" / "plans" / "two_hosts_2gpu_sockets"
    plans, names, files = port_x4._plans("allreduce", 4, fabric_plans=(sockets,))
    assert sorted(names.values()) == [
        "milp-allreduce+lanes4",
        "milp-allreduce@sockets+lanes4",
        "ring-allreduce+lanes4",
        "trees-allreduce+lanes4",
        "trees-allreduce@sockets+lanes4",
        "twoshot-allreduce+lanes4",
    ]
    assert len({p.name for p in plans}) == len(plans)  # each timer its own name
    # the results file names each timer's own plan file and hash (the sockets plans are not the NVLink ones)
    milp = files["milp-allreduce@sockets+lanes4"]
    assert milp["file"] == "examples/plans/two_hosts_2gpu_sockets/milp-allreduce.plan.json"
    assert milp["hash"] == load_plan(sockets / "milp-allreduce.plan.json").content_hash
    assert len({f["hash"] for f in files.values()}) == len(files)
    assert {port_x4.method(n) for n in names.values() if "@" in n} <= set(port_x4.SYNTHESIZED)
    # the sockets plans were synthesized for a fabric of the same ranks and hosts, without NVLink
    topology = json.loads((root / "examples" / "topologies" / "two_hosts_2gpu_sockets.json").read_text())
    assert topology["hosts"] == [0, 0, 1, 1] and all("net" in (link["src"], link["dst"]) for link in topology["links"])


def test_a_one_shot_plan_is_one_group_of_transfers():
    plan = load_plan(PLANS[0].parent / "direct-allreduce.plan.json")
    for program in compile_programs(plan):
        assert [type(s).__name__ for s in program.steps] == ["Exchange", "Compute"]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_port_programs_compute_the_collective(path):
    plan = load_plan(path)
    assert all(g.port_peers for g in plan.gpus)
    assert check_plan(plan, [smallest_size(plan)], ("fp16",), back_to_back=2).ok
    programs = compile_programs(plan)
    for dtype in ("fp32", "bf16"):
        elems = chunk_elems(plan, 2 * smallest_size(plan), dtype)
        inputs = random_inputs(plan, elems, np.random.default_rng(7))
        outputs = run_programs(plan, programs, inputs, elems, dtype)
        _compare(plan, expected_outputs(plan.collective_spec(), inputs, elems, dtype), outputs, elems, dtype)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_closed_programs_compute_the_collective_and_each_group_meets_one_group_per_peer(path):
    plan = load_plan(path)
    programs = compile_programs(plan, closed=True)
    assert split_peer(programs) == ""
    elems = chunk_elems(plan, 2 * smallest_size(plan), "fp32")
    inputs = random_inputs(plan, elems, np.random.default_rng(5))
    outputs = run_programs(plan, programs, inputs, elems, "fp32")
    _compare(plan, expected_outputs(plan.collective_spec(), inputs, elems, "fp32"), outputs, elems, "fp32")


@pytest.mark.parametrize("path", PLANS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_closed_programs_run_no_more_groups_than_open_ones(path):
    # a closed group spans every round it can: cut at each round of the global order, the MILP all-reduce ran 15
    # groups on rank 0 where the open programs run at most 7, each a launch and, between hosts, a round trip
    plan = load_plan(path)
    most = [max(map(_exchanges, compile_programs(plan, closed))) for closed in (False, True)]
    assert most[1] <= most[0]


def test_a_closed_group_spans_rounds_until_the_data_cuts_it():
    # the direct all-to-all's sends and receives are rounds apart in the global order and go as one group; the
    # two-shot all-reduce's sum cuts its reduce-scatter from its all-gather
    alltoall = load_plan(PLANS[0].parent.parent / "two_hosts_2gpu" / "direct-alltoall.plan.json")
    assert [_exchanges(p) for p in compile_programs(alltoall, closed=True)] == [1, 1, 1, 1]
    twoshot = load_plan(PLANS[0].parent.parent / "two_hosts_2gpu" / "twoshot-allreduce.plan.json")
    for program in compile_programs(twoshot, closed=True):
        assert [type(s).__name__ for s in program.steps] == ["Exchange", "Compute", "Exchange"]


def _exchanges(program) -> int:
    return sum(isinstance(s, Exchange) for s in program.steps)


def test_open_groups_wait_on_a_peers_later_group_where_closed_ones_do_not():
    plan = load_plan(PLANS[0].parent.parent / "two_hosts_2gpu" / "milp-allgather.plan.json")

    def spans(programs) -> int:
        return sum(len({p for p, _ in s}) < len(s) for s in partner_groups(programs).values())

    assert spans(compile_programs(plan)) > 0 and spans(compile_programs(plan, closed=True)) == 0


def test_hops_between_hosts_are_transfers_and_local_work_is_sums():
    plan = load_plan(PLANS[0].parent / "ring-allreduce.plan.json")
    steps = compile_programs(plan)[0].steps
    kinds = [type(s).__name__ for s in steps]
    assert kinds == ["Exchange", "Compute", "Exchange"]
    assert {t.channel_type for s in steps if isinstance(s, Exchange) for t in s.transfers} == {"port"}
    assert all(len(s.srcs) == 2 for s in steps if isinstance(s, Compute))


def test_a_memory_channel_across_hosts_is_refused():
    plan = load_plan(PLANS[0])
    memory = load_plan(Path(__file__).resolve().parent / "gpu" / "plans" / "allreduce-direct-simple-x1.json")
    assert ipc_across_hosts(plan, ("a", "b")) == ""
    hosts = tuple("host-a" if r == 0 else "host-b" for r in range(memory.nranks))
    why = ipc_across_hosts(memory, hosts)
    assert why.startswith(f"plan {memory.name}: gpus[0] memory channel 0 joins rank 0 (host host-a) and rank")
    assert "CUDA IPC, which cannot cross hosts" in why
    assert ipc_across_hosts(memory, ("same",) * memory.nranks) == ""


def test_a_port_channel_names_its_missing_transport():
    hosts = ("h0", "h1")
    assert transport_refusal(2, 0, hosts, (1,), "nccl", "cuda") == ""
    assert transport_refusal(2, 1, hosts, (0,), "gloo", "cpu") == ""
    assert transport_refusal(2, 0, hosts, (), None, "cuda") == ""
    assert transport_refusal(2, 0, hosts, (1,), "gloo", "cuda") == (
        "port channel 0 of rank 0 to rank 1 (host h1): transport gloo is unavailable: its point-to-point calls move "
        "cpu tensors, not cuda"
    )
    assert "transport mpi is unavailable" in transport_refusal(2, 0, hosts, (1,), "mpi", "cuda")


def test_host_identity_is_the_declared_host_or_name_and_boot(monkeypatch):
    monkeypatch.setenv(HOST_ENV, "node-7")
    assert host_identity() == "node-7"
    monkeypatch.delenv(HOST_ENV)
    name, _, boot = host_identity().partition("/")
    assert name and boot


def test_the_cuda_ipc_interpreter_refuses_port_channels():
    from executor.errors import ExecutorError
    from executor.gpu.tables import build_tables

    plan = load_plan(PLANS[0].parent / "ring-allreduce.plan.json")
    with pytest.raises(
        ExecutorError,
        match=r"gpus\[0\] has port channels \(to ranks \[1\]\): the GPU interpreter runs "
        "memory channels only",
    ):
        build_tables(plan, 0, 2 * smallest_size(plan))


@pytest.mark.parametrize("name", ["unit_tests-pipeline_test", "single_node-alltoall-alltoall_pipeline-numgpus-2"])
def test_a_pipeline_is_refused_not_skipped(name):
    # the engine runs a plan in one pass; a pipeline's ops repeat per unit of the message (they were dropped: the
    # all-to-all gave a wrong result)
    from executor.errors import ExecutorError

    plan = load_plan(Path(__file__).parent / "fixtures" / "mscclpp" / "plans" / f"{name}.json")
    with pytest.raises(ExecutorError, match=r"ops\[\d+\]: op 'pipeline': the port engine does not run pipelines$"):
        compile_programs(plan)


@pytest.mark.parametrize("elems,lanes,unit", [(4096, 4, 8), (4100, 4, 8), (24, 8, 8), (7, 3, 1), (8, 1, 8)])
def test_lanes_cover_every_element_of_a_chunk_once_on_aligned_cuts(elems, lanes, unit):
    bounds = lane_bounds(elems, lanes, unit)
    assert 1 <= len(bounds) <= lanes and len(bounds) <= max(elems // unit, 1)
    assert bounds[0][0] == 0 and bounds[-1][1] == elems
    assert all(hi == lo for (_, hi), (lo, _) in pairwise(bounds))  # contiguous, no overlap
    assert all(lo % unit == 0 and hi > lo for lo, hi in bounds)


def test_small_chunks_run_as_one_lane_and_large_ones_split_up_to_the_most():
    assert lanes_for(32 << 10, 4, 64 << 10) == 1
    assert lanes_for(128 << 10, 4, 64 << 10) == 2
    assert lanes_for(64 << 20, 4, 64 << 10) == 4


def test_a_call_under_the_floor_runs_as_one_lane_whatever_its_chunks():
    # 4 GPUs as 2 hosts x 2: one lane ran as fast or faster at 1 MB, four faster from 4 MB (bench/NOTES.md)
    assert call_lanes(1 << 20, 256 << 10, 4, 64 << 10, 2 << 20) == 1
    assert call_lanes(4 << 20, 1 << 20, 4, 64 << 10, 2 << 20) == 4
    assert call_lanes(4 << 20, 64 << 10, 4, 64 << 10, 2 << 20) == 1  # over the floor, but chunks too small to split


def test_lanes_each_running_the_program_on_their_columns_compute_the_collective():
    plan = load_plan(PLANS[0].parent.parent / "two_hosts_2gpu" / "milp-allreduce.plan.json")
    programs = compile_programs(plan)
    elems = chunk_elems(plan, 8 * smallest_size(plan), "fp32")
    inputs = random_inputs(plan, elems, np.random.default_rng(3))
    chunks = [x.reshape(plan.gpus[r].input_chunks, elems) for r, x in enumerate(inputs)]
    parts = [
        run_programs(plan, programs, [c[:, lo:hi].reshape(-1) for c in chunks], hi - lo, "fp32")
        for lo, hi in lane_bounds(elems, 3, 4)
    ]
    outputs = [
        np.concatenate([p[r].reshape(plan.gpus[r].output_chunks, -1) for p in parts], axis=1).reshape(-1)
        for r in range(plan.nranks)
    ]
    _compare(plan, expected_outputs(plan.collective_spec(), inputs, elems, "fp32"), outputs, elems, "fp32")


@pytest.mark.parametrize(
    "backend,env,lanes",
    [
        ("nccl", {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, 8),  # bench/port_x4.sh's setting: all-to-all's 8 lanes
        ("nccl", {"CUDA_DEVICE_MAX_CONNECTIONS": "16"}, 4),  # queues for 4 lanes only
        ("nccl", {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, 1),  # CUDA's default: lanes' kernels would share queues
        ("nccl", {}, 1),
        ("nccl", {"CUDA_DEVICE_MAX_CONNECTIONS": "many"}, 1),
        ("gloo", {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, 1),
    ],
)
def test_lanes_are_on_by_default_only_where_each_lane_gets_hardware_queues(backend, env, lanes):
    from executor.port.engine import default_lanes

    assert default_lanes(backend, env) == lanes


def test_only_all_to_all_takes_more_than_four_lanes_unless_the_user_asks():
    from executor.port.engine import LANES, call_limit
    from schedules.collectives import facts_of

    names = ("alltoall", "allreduce", "allgather", "reducescatter")
    assert [call_limit(facts_of(c).personalized, 8, False) for c in names] == [8, LANES, LANES, LANES]
    assert call_limit(False, 8, True) == 8 and call_limit(True, 2, False) == 2


def test_the_floor_holds_for_the_default_lanes_only():
    from executor.port.engine import MIN_LANE_BYTES, lane_floor

    assert lane_floor(None, {}) == MIN_LANE_BYTES == 1 << 20  # the default: a call under 1 MB runs as one lane
    assert lane_floor(4, {}) == 0 and lane_floor(None, {"WEFT_PORT_LANES": "2"}) == 0  # asked for: every size


def test_a_group_that_meets_one_peer_in_two_groups_is_named():
    # the two-shot all-reduce's all-gather as ordered before the fix: rank 1's receive from rank 0 in one group and
    # its send to it in the next, where rank 0 holds its send and receive in one
    plan = load_plan(PLANS[0].parent.parent / "two_hosts_2gpu" / "twoshot-allreduce.plan.json")
    programs = list(compile_programs(plan, closed=True))
    steps = list(programs[1].steps)
    at = next(i for i, st in enumerate(steps) if i > 0 and isinstance(st, Exchange))
    grouped = steps[at]
    assert isinstance(grouped, Exchange) and {(0, True), (0, False)} <= {(t.peer, t.send) for t in grouped.transfers}
    steps[at : at + 1] = [
        replace(grouped, transfers=tuple(t for t in grouped.transfers if (t.peer, t.send) == (0, False))),
        replace(grouped, transfers=tuple(t for t in grouped.transfers if (t.peer, t.send) != (0, False))),
    ]
    programs[1] = replace(programs[1], steps=tuple(steps))
    assert split_peer(programs).startswith("rank 0 step ")
