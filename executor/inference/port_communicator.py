"""weft's collectives for a job whose ranks span several hosts: the registry's plans through the port engine.

``Communicator.from_process_group()`` returns one of these when the process group's ranks sit on more than one
host (``executor.hosts.host_identity``: host name and boot id, or ``$WEFT_HOST``): CUDA IPC cannot reach a peer on
another host, so no staging buffer is shared and no plan with a memory channel across hosts is chosen. The API is
the Communicator's (all_reduce, all_reduce_, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
plan_for, capture, close, and what ``WeftBackend`` asks: is_prepared, norm_plan_for, is_norm_prepared); each call
takes the registry's plan for its collective, size and dtype on ``$WEFT_TOPOLOGY`` (a topology file that places the
ranks on their hosts) and runs it through ``PortEngine`` on the caller's stream, or falls back to torch.distributed
(NCCL) where no plan fits. The fused all-reduce + residual add + RMSNorm runs unfused here (no row-owning port plan).
CUDA graphs capture either path directly: the engine's context for a size is local (no exchange with peers), so a
size first seen inside a capture runs on weft too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.errors import ExecutorError
from executor.gpu.bootstrap import all_gather_plain
from executor.hosts import ipc_across_hosts
from executor.inference import ops as torch_ops
from executor.inference.norm import check_norm_call
from executor.inference.ops import DTYPES, CollectiveCalls
from executor.inference.plans import PlanChoice, disagreement
from executor.inference.topology import machine_topology
from executor.port.engine import PortEngine
from executor.port.program import compile_programs
from executor.reference.norm import RowNorm
from registry.store import Registry, RegistryError

log = logging.getLogger("weft.inference")


class PortCommunicator(CollectiveCalls):
    """torch.distributed's collective API over the port engine, for ranks on several hosts."""

    def __init__(
        self,
        group: Any = None,
        timeout_s: float = 30.0,
        *,
        registry: str | None = None,
        topology: str | None = None,
        deterministic: bool = False,
        **_: Any,
    ):
        self.group = group
        self.engine = PortEngine(group, timeout_s)
        self.rank, self.world_size, self.hosts = self.engine.rank, self.engine.world_size, self.engine.hosts
        self.paths = {"port": 0, "nccl": 0}
        self.handle = torch_ops.register(self)
        why = self._read_plans(registry, topology, deterministic)
        mine: object = why
        if not why:
            assert self.topology is not None  # _read_plans set it where ``why`` is ''
            mine = [self.topology.fingerprint, sorted(e.id for e in self.choice.entries)]
        why = disagreement(all_gather_plain(mine, group))  # plain data, never a pickle
        self.enabled = not why
        if why:
            log.warning("weft: using NCCL for every collective across hosts: %s", why)

    @classmethod
    def from_process_group(cls, group: Any = None, timeout_s: float = 30.0, **options: Any) -> PortCommunicator:
        return cls(group, timeout_s, **options)

    # ---------------------------------- torch.distributed's API (the calls: torch_ops.CollectiveCalls)

    def plan_for(self, collective: str, nbytes: int, dtype: torch.dtype):
        """The plan weft runs for this call, or None where NCCL does."""
        if not self.enabled or dtype not in DTYPES:
            return None
        return self.choice.plan(collective, nbytes, DTYPES[dtype])

    def is_prepared(self, plan, nbytes: int, dtype: torch.dtype, residual: bool = False) -> bool:
        """Always: the engine's context for a size is local, so a size first seen inside a capture runs on weft."""
        return True

    def norm_plan_for(self, nbytes: int, dtype: torch.dtype, rows: RowNorm):
        """None: across hosts the fused norm runs unfused (``all_reduce`` with ``rms_weight``)."""
        return None

    def is_norm_prepared(self, plan, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> bool:
        return False

    @contextmanager
    def capture(
        self,
        sizes=(),
        dtype: torch.dtype = torch.bfloat16,
        residual: bool = False,
        rms_norm: RowNorm | None = None,
        alltoall_sizes=(),
    ) -> Iterator[Any]:
        """Nothing to prepare or register: graphs captured anywhere run weft's calls."""
        yield self

    def synchronize(self) -> None:
        self.engine.synchronize()

    def close(self) -> None:
        self.engine.close()
        self.enabled = False

    # ------------------------------------------------------------------ the ops' bodies (torch_ops calls them)

    def all_reduce_eager(self, tensor: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        plan = self._plan("allreduce", tensor, tensor.numel())
        if plan is None:
            out.copy_(tensor)
            dist.all_reduce(out, group=self.group)
        else:
            self.engine.execute(plan, tensor.contiguous().view(-1), out.view(-1))
        if residual is not None:
            out.add_(residual)
        return out

    def all_reduce_eager_(self, tensor: torch.Tensor) -> None:
        tensor.copy_(self.all_reduce_eager(tensor))

    def all_reduce_norm_eager(
        self, tensor: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unfused across hosts (no row-owning port plan exists): the all-reduce with its residual, then torch's
        rms_norm; the arguments are checked as on one host (``check_norm_call``)."""
        rows = check_norm_call(tensor, residual, weight, eps)
        new_residual = self.all_reduce_eager(tensor, residual)
        return F.rms_norm(new_residual, (rows.row_elems,), weight, rows.eps), new_residual

    def all_gather_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        plan = self._plan("allgather", tensor, output.numel())
        if plan is None:
            dist.all_gather_into_tensor(output, tensor, group=self.group)
        else:
            self._run(plan, tensor, output)

    def reduce_scatter_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        plan = self._plan("reducescatter", tensor, output.numel())
        if plan is None:
            dist.reduce_scatter_tensor(output, tensor, group=self.group)
        else:
            self._run(plan, tensor, output)

    def all_to_all_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        plan = self._plan("alltoall", tensor, output.numel())
        if plan is None:
            dist.all_to_all_single(output, tensor, group=self.group)
        else:
            self._run(plan, tensor, output)

    # ------------------------------------------------------------------ internals

    def _run(self, plan, tensor: torch.Tensor, output: torch.Tensor) -> None:
        target = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
        self.engine.execute(plan, tensor.contiguous().view(-1), target.view(-1))
        if target is not output:
            output.copy_(target)

    def _plan(self, collective: str, tensor: torch.Tensor, out_numel: int):
        nbytes = max(tensor.numel(), out_numel) * tensor.element_size()
        plan = self.plan_for(collective, nbytes, tensor.dtype)
        self.paths["nccl" if plan is None else "port"] += 1
        return plan

    def _read_plans(self, registry: str | None, topology: str | None, deterministic: bool) -> str:
        try:
            self.topology = machine_topology(self.world_size, topology)
        except Exception as e:  # a bad WEFT_TOPOLOGY means NCCL, said once, not a crash
            return f"the topology cannot be read: {e}"
        if self.topology is None:
            return "the hosts' topology is unknown (set WEFT_TOPOLOGY to a topology file that places ranks on hosts)"
        if len(set(self.topology.hosts)) < 2:
            return f"topology {self.topology.name} places every rank on one host, but the ranks run on several"
        try:
            self.choice = PlanChoice(Registry(registry), self.topology.fingerprints, self.world_size, deterministic)
        except (RegistryError, ImportError) as e:
            return f"the plan registry cannot be read: {e}"
        # a memory channel is CUDA IPC: only plans whose memory channels stay inside a host run here, and only
        # out-of-place plans the port engine compiles (its ops, no pipelines), so that no call fails that NCCL
        # would have run
        self.choice.entries = [
            e for e in self.choice.entries if not ipc_across_hosts(e.plan, self.hosts) and _port_runs(e.plan)
        ]
        return ""


def _port_runs(plan) -> bool:
    """Whether the port engine runs ``plan`` as this communicator calls it: out of place (its calls pass an input
    and an output), and compiled (``compile_programs`` refuses it in one line otherwise)."""
    if plan.inplace:
        return False
    try:
        compile_programs(plan)
    except ExecutorError:
        return False
    return True
