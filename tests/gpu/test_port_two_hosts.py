"""Across hosts on one machine: the two GPUs declared as two hosts (WEFT_HOST), NCCL forced onto its network path
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: "via NET/Socket"), every two-host plan through the port engine, checked
against NCCL over the same transport, eager and as CUDA-graph replays; then the bad cases. And 4 ranks as 2 hosts x
2 GPUs over gloo (CPU tensors; NCCL refuses two ranks on one GPU). The ranks run tests/gpu/port_job.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_rank import run_script

from weftcore.rendezvous import rendezvous_port

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
NCCL_NETWORK_PATH = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def _launch(mode: str, n: int, out: Path, extra, timeout_s: float) -> list[dict]:
    from conftest import job_env

    port = str(rendezvous_port())
    procs = []
    for rank in range(n):
        env = {**job_env(rank, n, port, local_rank=0), **extra(rank)}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "port_job.py"), mode, str(out)], env=env))
    try:
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errors = [f.read_text() for f in sorted(out.glob("rank*.error.txt"))]
    assert codes == [0] * n and not errors, f"exit codes {codes}; {errors[:1]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def _cuda_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> tuple[list[dict], Path]:
    if _cuda_gpus() < 2:
        pytest.skip("needs 2 CUDA GPUs with torch")
    out = Path(os.environ.get("WEFT_PORT_OUT") or tmp_path_factory.mktemp("port"))
    out.mkdir(parents=True, exist_ok=True)

    def env(rank: int) -> dict:
        return {
            **NCCL_NETWORK_PATH,
            "CUDA_VISIBLE_DEVICES": str(rank),
            "WEFT_HOST": f"host{rank}",
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "NCCL_DEBUG_FILE": str(out / "nccl.%p.log"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
        }

    return _launch("nccl", 2, out, env, 400), out


@pytest.mark.gpu
def test_every_two_host_plan_is_correct_against_nccl_eager_and_captured(two_hosts):
    docs, _ = two_hosts
    for doc in docs:
        records = doc["records"]
        assert len(records) == 10 * 3 * 2  # 10 plans (ring, trees, milp x 3 collectives; direct), 3 dtypes, 2 sizes
        bad = [r for r in records if not (r.get("eager") and r.get("graph"))]
        assert not bad, bad[:3]


@pytest.mark.gpu
def test_the_hops_went_through_nccls_network_transport(two_hosts):
    docs, out = two_hosts
    assert [d["hosts"] for d in docs] == [["host0", "host1"]] * 2
    logs = "".join(p.read_text(errors="replace") for p in out.glob("nccl.*.log"))
    assert "via NET/Socket" in logs
    assert "via P2P" not in logs and "via SHM" not in logs


@pytest.mark.gpu
def test_bad_cases_are_one_line_naming_the_problem(two_hosts):
    docs, _ = two_hosts
    bad = docs[0]["bad"]
    assert bad["ipc_across_hosts"].startswith(
        "plan direct-allreduce-hgx_h200:gpus=2-simple-x1: gpus[0] memory channel 0 "
        "joins rank 0 (host host0) and rank 1 (host host1)"
    )
    assert bad["transport"].endswith(
        "port channel 0 of rank 0 to rank 1 (host host1): transport nccl is "
        "unavailable: its point-to-point calls move cuda tensors, not cpu"
    )
    assert all("\n" not in line for line in bad.values())


@pytest.mark.gpu
def test_a_dead_peer_is_peer_lost_naming_its_rank_and_host(two_hosts):
    docs, _ = two_hosts
    lost = docs[0]["peer_lost"]
    assert lost is not None and lost["lost"] == [1], lost
    assert "peer rank 1 on host host1 lost" in lost["message"]
    assert lost["seconds"] < 10


@pytest.mark.gpu
def test_communicator_from_process_group_across_hosts_runs_the_registrys_port_plans(tmp_path):
    if _cuda_gpus() < 2:
        pytest.skip("needs 2 CUDA GPUs with torch")
    from weft import publish

    topology = ROOT / "examples" / "topologies" / "two_hosts.json"
    registry = tmp_path / "registry"
    for plan in sorted((ROOT / "examples" / "plans" / "two_hosts").glob("*.plan.json")):
        publish.commit_file(str(plan), str(topology), str(registry))

    def env(rank: int) -> dict:
        return {
            **NCCL_NETWORK_PATH,
            "CUDA_VISIBLE_DEVICES": str(rank),
            "WEFT_HOST": f"host{rank}",
            "WEFT_TOPOLOGY": str(topology),
            "WEFT_REGISTRY": str(registry),
        }

    out = Path(os.environ["WEFT_PORT_OUT"]) / "comm" if os.environ.get("WEFT_PORT_OUT") else tmp_path / "out"
    out.mkdir(parents=True)
    docs = _launch("comm", 2, out, env, 200)
    for doc in docs:
        assert (doc["type"], doc["enabled"]) == ("PortEngine", True)
        assert doc["checks"] and all(doc["checks"].values()), doc["checks"]
        assert doc["paths"]["port"] >= 12 and doc["paths"]["nccl"] == 0, doc["paths"]


def test_four_ranks_as_two_hosts_of_two_gpus_over_gloo(tmp_path):
    pytest.importorskip("torch")

    def env(rank: int) -> dict:
        return {"WEFT_HOST": f"host{rank // 2}", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "0"}

    docs = _launch("gloo", 4, tmp_path, env, 300)
    for doc in docs:
        assert doc["hosts"] == ["host0", "host0", "host1", "host1"]
        # 3 methods x 3 collectives, the direct all-gather, the two-shot all-reduce, 2DH's and the direct
        # all-to-all; 3 dtypes each
        assert len(doc["records"]) == 13 * 3
        bad = [r for r in doc["records"] if not r.get("eager")]
        assert not bad, bad[:3]


@pytest.mark.gpu  # no GPU used (gloo, CPU tensors): marked so that the GPU machines, where torch is, run it
def test_lanes_over_gloo_split_calls_past_the_floor_and_stay_correct(tmp_path):
    """4 ranks as 2 hosts x 2 over gloo, each all-gather and all-reduce plan at the smallest size past
    MIN_LANE_BYTES on 4 lanes (closed groups): every result as the collective's, every call split into lanes (as
    many as its chunks hold pieces of PIECE_BYTES: 2 for the trees plans' small chunks, 4 for the others)."""
    pytest.importorskip("torch")

    def env(rank: int) -> dict:
        return {"WEFT_HOST": f"host{rank // 2}", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""}

    docs = _launch("gloo_lanes", 4, tmp_path, env, 300)
    for doc in docs:
        assert doc["records"] and all(r.get("eager") for r in doc["records"]), doc["records"][:3]
        lanes = [r["lanes"] for r in doc["records"]]
        assert min(lanes) > 1 and max(lanes) == 4, doc["records"]


@pytest.mark.gpu  # no GPU used (gloo, CPU tensors): marked so that the GPU machines, where torch is, run it
def test_a_plan_whose_closed_groups_split_a_peer_runs_as_one_lane_and_says_why(tmp_path):
    pytest.importorskip("torch")

    def env(rank: int) -> dict:
        return {"WEFT_HOST": f"host{rank // 2}", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""}

    for doc in _launch("gloo_split", 4, tmp_path, env, 300):
        ((record),) = doc["records"]
        assert record["eager"] and record["lanes"] == 1, record
        (why,) = doc["lanes_refused"].values()
        assert why.endswith("one lane: forced for the test"), why


# the Communicator's calls over the port engine on one CPU rank over gloo, with no plan (NCCL's path is gloo's here):
# torch.distributed's API through the ops, the fused norm unfused, torch.compile, WeftBackend
API_SCRIPT = r"""
import tempfile
import torch, torch.distributed as dist
import torch.nn.functional as F
dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
from executor import Communicator, PortEngine
pc = Communicator(PortEngine(), lambda what, value: [value], "no plan in this test", rank=0, world_size=1)
assert not pc.enabled and pc.paths == {"port": 0, "nccl": 0}
x = torch.randn(4, 64); h = torch.randn(4, 64); w = torch.randn(64)
exchanged = torch.empty_like(x)
pc.all_to_all_single(exchanged, x)
assert torch.equal(exchanged, x) and pc.paths["nccl"] == 1
normed, new_h = pc.all_reduce(x, residual=h, rms_weight=w, eps=1e-5)
assert torch.allclose(new_h, x + h) and torch.allclose(normed, F.rms_norm(x + h, (64,), w, 1e-5))
y, r = x.clone(), h.clone()
pc.all_reduce_(y, residual=r, rms_weight=w, eps=1e-5)
assert torch.equal(y, normed) and torch.equal(r, new_h)
assert torch.equal(pc.all_reduce(x), x)
bad_calls = (lambda: pc.all_reduce(x, rms_weight=w), lambda: pc.all_reduce_(x, rms_weight=w),
             lambda: pc.all_reduce_(x, residual=h), lambda: pc.all_reduce(x, residual=h, rms_weight=torch.randn(63)))
for bad in bad_calls:  # each a one-line ValueError
    try:
        bad()
    except ValueError as e:
        assert "\n" not in str(e)
    else:
        raise SystemExit("no error")
# an MoE layer's expert exchange runs around all_to_all_single here (the fused kernels are one host's): claims of
# 3 tokens on 4 experts of 2 places, token 1's second dropped (row 8, the trash row)
ex = pc.expert_exchange(tokens=3, experts=4, capacity=2, hidden=64, dtype=torch.float32)
assert ex.path == "all_to_all"
x3, rows, gates = torch.randn(3, 64), torch.tensor([[0, 2], [4, 8], [1, 5]]), torch.rand(3, 2)
received = ex.dispatch(x3, rows)
assert received.shape == (4, 2, 64) and torch.equal(received[2, 0], x3[1]) and torch.equal(received[0, 1], x3[2])
kept = gates * (rows < 8)
assert torch.allclose(ex.combine(received * 2, rows, gates), 2 * x3 * kept.sum(1, keepdim=True))
compiled = torch.compile(lambda a, b, c: pc.all_reduce(a, residual=b, rms_weight=c, eps=1e-5))
assert torch.allclose(compiled(x, h, w)[0], normed)
from executor.inference.backend import WeftBackend
b = WeftBackend(pc)
assert torch.allclose(b.fused_add_rms_norm(x, h, w, 1e-5)[0], normed)
# the engine compiles no kernels: asked for one, it refuses in one line before it runs anything, and precompile names
# every call it will not build
from executor.errors import ExecutorError
import pathlib, schedules
from schedules.plan.io import load_plan
plans = pathlib.Path(schedules.__file__).parents[1] / "examples" / "plans" / "two_hosts_2gpu"
plan = load_plan(plans / "direct-allgather.plan.json")
try:
    pc.engine.execute(plan, torch.randn(1024), compiled=True)
except ExecutorError as e:
    assert "no compiled kernel" in str(e) and "\n" not in str(e), e
else:
    raise SystemExit("compiled=True ran")
(why,) = pc.engine.precompile([(plan, 4096, "bf16")]).values()
assert why == "port engine: runs no compiled kernels", why
print("all ok")
"""


def test_the_port_engines_communicator_calls_go_through_the_ops_on_one_cpu_rank():
    pytest.importorskip("torch")
    done = run_script(API_SCRIPT)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]
