"""One Communicator over pluggable engines, on one CPU rank over gloo (needs torch, so it lives with the GPU tests).

A fake staging engine stands in for the interpreter (its kernel needs a GPU): the facade stages eager calls, adds a
residual in the engine's launch where the engine fuses it, runs the fused norm as one launch where a plan is
pinned, and counts each call's path; ``from_process_group`` on a machine without CuPy still gives a Communicator,
one that runs NCCL's path (gloo's here) for every call.
"""

from __future__ import annotations

import pytest
from cpu_rank import run_script

ENGINE = r"""
import contextlib, tempfile
from types import SimpleNamespace
import torch, torch.distributed as dist
import torch.nn.functional as F
torch.cuda.is_current_stream_capturing = lambda: False  # a CPU build cannot ask; nothing captures here
dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
from executor import Communicator, RowNorm
from executor.inference.staging import Staging
from executor.inference.streams import StreamOrder
from registry.index import Mode

class StagingEngine:
    '''One rank: a plan's sum is its input, plus the residual and the norm as the kernel applies them.'''
    stages, fuses_norm, direct_path, hosts, rank, world_size = True, True, "zero_copy", ("h",), 0, 1
    def __init__(self):
        self.calls, self.kernels = [], []  # kernels: each call's compiled option, as it came (None: not given)
    def plan_refusal(self, plan): return ""
    def residual_refusal(self, plan): return ""
    def norm_refusal(self, plan): return ""
    def execute(self, plan, input, output=None, *, lines=None, residual=None, norm=None, compiled=None):
        self.calls.append((input.data_ptr(), lines, residual is not None, norm is not None))
        self.kernels.append(compiled)
        output.copy_(input + (0 if residual is None else residual))
        if norm is not None:
            rows = output.view(-1, norm.rows.row_elems)
            norm.normed.copy_(F.rms_norm(rows, (norm.rows.row_elems,), norm.weight, norm.rows.eps).view(-1))
        return output
    def capture(self): return contextlib.nullcontext(self)
    def register_graph_buffers(self): pass
    def synchronize(self): pass
    def close(self): pass

waited = []  # (stream, the stream it waited for), as the communicator ordered them

plans = {c: SimpleNamespace(name=c, collective=c, content_hash=c) for c in ("allreduce", "allgather", "alltoall")}
plan = plans["allreduce"]
choice = SimpleNamespace(plan=lambda c, n, d: plans.get(c), mode=lambda c, n, d: Mode(lines=c == "allreduce"),
                         reason=lambda c, n, d: "no plan in this test", entries=[])
engine = StagingEngine()
comm = Communicator(engine, lambda what, value: [value], "plans set by hand below", rank=0, world_size=1)
comm.enabled, comm.choice, comm.staging = True, choice, Staging(1 << 16, 0)
stream = ["default"]  # the caller's current stream
comm.streams = StreamOrder(lambda: stream[0], lambda s, earlier: waited.append((s, earlier)), lambda: False)
staging = comm.staging
staging.input, staging.output, staging.residual = (torch.empty(1 << 16, dtype=torch.uint8) for _ in range(3))
x, h, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
"""

SCRIPT = (
    ENGINE
    + r"""

assert torch.equal(comm.all_reduce(x), x) and engine.calls[-1] == (comm.staging.input.data_ptr(), True, False, False)
assert torch.allclose(comm.all_reduce(x, residual=h), x + h) and engine.calls[-1][2]  # added in the launch
y = x.clone(); comm.all_reduce_(y)
assert torch.equal(y, x)
out = torch.empty(4, 64); comm.all_gather_into_tensor(out, x)
assert torch.equal(out, x) and engine.calls[-1][1] is False
out = torch.empty(4, 64); comm.reduce_scatter_tensor(out, x)  # no plan: NCCL's path
assert torch.equal(out, x)
assert comm.paths == {"zero_copy": 0, "staging": 4, "nccl": 1}, comm.paths
assert comm.is_prepared(plan, x.numel() * 4, torch.float32, residual=True)
assert not comm.is_prepared(plan, 8 * 4, torch.float32)
rows = RowNorm(64, 1e-5)
comm._norm_choices[(x.numel() * 4, torch.float32, rows)] = (plan, "")  # as pin_norm_plan, past its proof
normed, new_h = comm.all_reduce(x, residual=h, rms_weight=w, eps=1e-5)
assert torch.allclose(new_h, x + h) and torch.allclose(normed, F.rms_norm(x + h, (64,), w, 1e-5))
assert engine.calls[-1][3] and comm.is_norm_prepared(plan, x.numel() * 4, torch.float32, rows)

engine.fuses_norm = False  # an engine without the epilogue: the same call, unfused, with no plan asked for
comm._norm_choices.clear()
normed2, new_h2 = comm.all_reduce(x, residual=h, rms_weight=w, eps=1e-5)
assert torch.allclose(normed2, normed) and not engine.calls[-1][3]
assert "runs no norm epilogue" in comm.norm_reason(x.numel() * 4, torch.float32, rows)

import executor.inference.communicator as communicator_module
asked = []
class Refusing:  # records the interpreter's options, then does not start (as without a GPU)
    def __init__(self, *args, **options):
        asked.append(options)
        raise RuntimeError("no GPU in this test")
real, communicator_module.InterpreterEngine = communicator_module.InterpreterEngine, Refusing
current, torch.cuda.current_device = torch.cuda.current_device, lambda: 0  # a CPU torch has no current device
assert Communicator.from_process_group(programmatic=False, compiled=True, late_trigger=True).engine is None
communicator_module.InterpreterEngine, torch.cuda.current_device = real, current
assert asked[-1]["programmatic"] is False and asked[-1]["compiled"] is True and asked[-1]["late_trigger"], asked

alone = Communicator.from_process_group()  # no GPU here: the interpreter does not start, NCCL serves every call
assert type(alone) is Communicator and alone.engine is None and not alone.enabled
assert torch.equal(alone.all_reduce(x), x) and alone.paths == {"zero_copy": 0, "staging": 0, "nccl": 1}
with alone.capture(sizes=[1024]):
    pass

# the bench's agreements over the communicator (bench/norm_peers.py), NCCL-only ones too: each exchange its own key
from executor.gpu.bench import _refused_anywhere
keys = []
said = Communicator(None, lambda what, value: keys.append(what) or [value, "rank 1: refused"], "NCCL", rank=0,
                    world_size=2)
assert said.exchange("medians", 1) == [1, "rank 1: refused"] and _refused_anywhere(said, "")
assert len(set(keys)) == 2 and all(k.endswith(w) for k, w in zip(keys, ("medians", "bench-refused"))), keys
print("all ok")
"""
)

# Selection's mode decides how each call runs: the engine is asked for the plan's compiled kernel exactly where the
# registry measured it faster compiled at that size (PlanChoice.mode), and never told anything otherwise (an engine
# without compiled kernels, the port engine, refuses compiled=True).
COMPILED = (
    ENGINE
    + r"""
def mode(c, n, d):
    return Mode(lines=c == "allreduce", compiled=c == "allgather" or (c == "allreduce" and n >= 8192))
comm.choice = SimpleNamespace(plan=lambda c, n, d: plans.get(c), mode=mode, reason=lambda c, n, d: "", entries=[])
out = torch.empty(4, 64)
comm.all_gather_into_tensor(out, x)
assert torch.equal(out, x) and engine.kernels[-1] is True and engine.calls[-1][1] is False, engine.kernels
assert comm.mode_for("allgather", x.numel() * 4, torch.float32) == Mode(compiled=True)
assert torch.equal(comm.all_reduce(x), x) and engine.kernels[-1] is None  # 1 KB: interpreted, with lines
assert engine.calls[-1][1] is True
big = torch.randn(32, 64)  # 8 KB: the registry measured the compiled kernel faster
assert torch.equal(comm.all_reduce(big), big) and engine.kernels[-1] is True and engine.calls[-1][1] is True
assert comm.mode_for("allreduce", big.numel() * 4, torch.float32) == Mode(lines=True, compiled=True)
assert comm.mode_for("reducescatter", big.numel() * 4, torch.float32) == Mode()  # no plan: NCCL, no mode
print("all ok")
"""
)


# examples/moe_layer.py's all-to-all graph (issue 36): capture(alltoall_sizes=...) prepares the size on the current
# stream, then the warm-up runs on a side stream at once. Unordered, the two executions of one staging context run
# together on the GPU, and an LL peer waits for packets the later one overwrote, until the 30 s timeout.
STREAMS = (
    ENGINE
    + r"""
x, out = torch.randn(8, 64), torch.empty(8, 64)
comm.prepare("alltoall", x.numel() * 4, torch.float32)  # on the default stream
stream[0] = "side"
for _ in range(3):
    comm.all_to_all_single(out, x)  # the warm-up
assert waited == [("side", "default")], waited  # once: its first call waited for the prepared execution
stream[0] = "default"
comm.all_to_all_single(out, x)
assert waited[1:] == [("default", "side")] and comm.streams.waits == 2 and comm.paths["staging"] == 5, comm.paths
print("all ok")
"""
)


# Inside a capture each rank's decisions depend on its own state (which sizes it prepared) and tensors (contiguous,
# aligned): a rank that decided alone would run NCCL or the staging context while its peers ran the plan, and they
# would wait for each other until a timeout. So every rank says, and the first refusal decides for all. Here the one
# CPU rank's peer (rank 1, through the fake exchange) refuses; this rank, which could run the plan, follows it.
CAPTURE = (
    ENGINE
    + r"""
from executor.gpu.engine import BIND_VERDICT
said, refusals = [], ["rank 1: first seen inside graph capture; warm up"]  # the peer's say, once
def exchange(what, value):
    said.append((what, value))
    return [value, refusals.pop() if refusals else ""]
engine.exchange = exchange
out = torch.empty(8, 64)
comm.all_reduce(x)  # eager: this rank's contexts for the sizes exist
comm.all_to_all_single(out, torch.randn(8, 64))
assert comm.is_prepared(plan, x.numel() * 4, torch.float32)
torch.cuda.is_current_stream_capturing = lambda: True
nccl = comm.paths["nccl"]
assert torch.equal(comm.all_reduce(x), x) and comm.paths["nccl"] == nccl + 1  # the peer's refusal sent it to NCCL
assert said == [("graph-prepared", "")], said
comm._capturing = True  # inside capture(): a call binds the captured tensors, or every rank stages it
staged = comm.paths["staging"]
comm.all_to_all_single(out, torch.randn(64, 8).t())  # not contiguous on this rank
assert said[-1] == (BIND_VERDICT, "rank 0: the tensor is not contiguous"), said
assert comm.paths["staging"] == staged + 1 and comm.paths["zero_copy"] == 0
rows = RowNorm(64, 1e-5)
comm._norm_choices[(x.numel() * 4, torch.float32, rows)] = (plan, "")  # as pin_norm_plan, past its proof
comm.all_reduce(torch.randn(64, 4).t(), residual=h, rms_weight=w, eps=1e-5)  # not contiguous: unfused, on every rank
assert ("graph-prepared", "rank 0: a tensor (input, residual or weight) is not contiguous") in said, said
print("all ok")
"""
)

# The fused call's runners-up (bench/norm_peers.py --candidates): the committed 2-GPU registry's plans for a 4-token
# call, in selection's order, the first norm_plan_for's choice, each with the mode the registry measured fastest.
NORM_PLANS = (
    ENGINE
    + r"""
from pathlib import Path
from executor.inference.plans import PlanChoice
from registry.store import Registry
from topologies.catalog import build
two = Communicator(engine, lambda what, value: [value, value], "plans from the committed registry", rank=0,
                   world_size=2)
two.enabled = True
two.choice = PlanChoice(Registry(str(Path("bench/registry_h200x2").resolve())), build("hgx_h200:gpus=2").fingerprints,
                        2, ll128=True, compiled=True)
rows, nbytes = RowNorm(8192, 1e-5), 4 * 8192 * 2
ranked = two.norm_plans(nbytes, torch.bfloat16, rows, 3)
assert len(ranked) == 3 and len({p.name for p, _ in ranked}) == 3, [p.name for p, _ in ranked]
assert ranked[0][0].name == two.norm_plan_for(nbytes, torch.bfloat16, rows).name, ranked[0][0].name
assert ranked[0][1] == two.norm_mode_for(nbytes, torch.bfloat16, rows) == Mode(compiled=True)
assert two.norm_plans(nbytes, torch.float64, rows, 3) == []  # a dtype the fused call does not run
print("all ok")
"""
)


# The fused call's own times (registry norm.json) decide its plan and mode where they cover the size: a copy of the
# committed 2-GPU registry whose norm.json times the LL x32 one-shot, compiled, faster than the Lamport one-shot that
# the all-reduce's times put first at 4 tokens.
NORM_TIMES = (
    ENGINE
    + r"""
import shutil
from pathlib import Path
from executor.inference.plans import PlanChoice
from registry.norms import norm_key
from registry.store import Registry
from topologies.catalog import build
copy = Path(tempfile.mkdtemp()) / "reg"
shutil.copytree(Path("bench/registry_h200x2").resolve(), copy)
fp = build("hgx_h200:gpus=2").fingerprints
rows, nbytes = RowNorm(8192, 1e-5), 4 * 8192 * 2
def communicator(path=copy):
    two = Communicator(engine, lambda what, value: [value, value], "plans from a registry", rank=0, world_size=2)
    two.enabled = True
    two.choice = PlanChoice(Registry(str(path)), fp, 2, ll128=True, compiled=True)
    return two
committed = communicator(Path("bench/registry_h200x2").resolve())  # no norm.json: the all-reduce's times rank
before = communicator().norm_plan_for(nbytes, torch.bfloat16, rows)
assert "-lamport-x" in before.name, before.name  # x128-t256 since the seventeenth session
names = {e.plan.name: e for e in Registry(str(copy)).entries(topology=fp)}
ll = names["direct-allreduce-hgx_h200:gpus=2-ll-x32-t512-max8MB"]
times = {norm_key(ll.plan.content_hash, Mode(compiled=True)): {16384: 4.0, 262144: 6.0},
         norm_key(before.content_hash, Mode(compiled=True)): {16384: 4.5, 262144: 6.5}}
Registry(str(copy)).record_norm_timings({ll.key.topology: {8192: {s: {k: t[s] for k, t in times.items()}
                                                                   for s in (16384, 262144)}}})
two = communicator()
chosen = two.norm_plan_for(nbytes, torch.bfloat16, rows)
assert chosen.name == ll.plan.name, chosen.name
assert two.norm_mode_for(nbytes, torch.bfloat16, rows) == Mode(compiled=True)
ranked = two.norm_plans(nbytes, torch.bfloat16, rows, 5)  # the timed plans first, then by the all-reduce's times
assert [(p.name, m) for p, m in ranked[:2]] == [(ll.plan.name, Mode(compiled=True)), (before.name, Mode(compiled=True))]
assert len(ranked) == 5 and not {p.name for p, _ in ranked[2:]} & {ll.plan.name, before.name}
past = 64 * 8192 * 2  # past the recorded sizes: the all-reduce's times again, as without norm.json
assert two.norm_plan_for(past, torch.bfloat16, rows).name == committed.norm_plan_for(past, torch.bfloat16, rows).name
assert committed.norm_plan_for(nbytes, torch.bfloat16, rows).name == before.name
print("all ok")
"""
)


def test_the_communicator_runs_its_engine_and_falls_back_to_nccl_on_one_cpu_rank():
    pytest.importorskip("torch")
    done = run_script(SCRIPT)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]


def test_eager_calls_on_another_stream_wait_for_the_calls_before_them():
    pytest.importorskip("torch")
    done = run_script(STREAMS)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]


def test_a_peers_refusal_inside_a_capture_decides_for_every_rank():
    pytest.importorskip("torch")
    done = run_script(CAPTURE)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]


def test_the_communicator_asks_its_engine_for_compiled_kernels_where_selection_says():
    pytest.importorskip("torch")
    done = run_script(COMPILED)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]


def test_the_fused_calls_runners_up_come_in_selections_order_with_their_modes():
    pytest.importorskip("torch")
    done = run_script(NORM_PLANS)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]


def test_the_fused_calls_own_times_choose_its_plan_and_mode_where_they_cover_the_size():
    pytest.importorskip("torch")
    done = run_script(NORM_TIMES)
    assert done.returncode == 0 and done.stdout.strip().endswith("all ok"), done.stderr[-2000:]
