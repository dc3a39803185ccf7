"""What the Communicator asks of an engine, the runtime that runs its plans (vLLM's device communicators' shape).

Two engines implement it: ``executor.gpu.engine.InterpreterEngine`` (the interpreter kernel over CUDA IPC, one
host) and ``executor.port.engine.PortEngine`` (port channels through torch.distributed, across hosts); a plan
compiled to a kernel of its own would be a third. The Communicator owns everything else: plan choice, the NCCL
fallback, staging, ``capture()``, path accounting and the torch ops. An engine that cannot serve a call says why
in one line (the ``*_refusal`` methods, ``execute_captured``), and the Communicator falls back.

prepare / execute / capture / close: an engine prepares a plan and size on its first eager ``execute`` (for the
interpreter, collectively: contexts, scratch and peer mappings), which the Communicator issues from
``prepare``/``capture(sizes=...)``; ``capture()`` is the block in which ``execute_captured`` runs a prepared plan on
a graph's own tensors; ``close`` frees what the engine holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from schedules.plan.types import Plan


class Engine(Protocol):
    rank: int
    world_size: int
    hosts: tuple[str, ...]  # each rank's host identity (executor.hosts)
    # Whether eager calls go through the Communicator's staging buffers: the engine's contexts are made
    # collectively, per buffer, so a size runs inside a capture only once an eager call prepared it.
    stages: bool
    fuses_norm: bool  # runs the all-reduce + residual + RMSNorm epilogue in one launch (norm_refusal says where)
    direct_path: str  # the name ``Communicator.paths`` counts a call under when it ran on the caller's tensors

    def plan_refusal(self, plan: Plan) -> str:
        """Why this engine cannot run ``plan`` at all here, or ''; the Communicator chooses among the rest."""
        ...

    def residual_refusal(self, plan: Plan) -> str:
        """Why ``plan`` cannot add a residual in its own launch here, or ''."""
        ...

    def norm_refusal(self, plan: Plan) -> str:
        """Why ``plan`` cannot run the RMSNorm epilogue here at any size, or ''."""
        ...

    def execute(
        self,
        plan: Plan,
        input: Any,
        output: Any = None,
        *,
        lines: bool | None = None,
        residual: Any = None,
        norm: Any = None,
        compiled: bool | None = None,
    ) -> Any:
        """Run ``plan`` eagerly on the caller's current stream; the output. ``compiled``: as the plan's own kernel
        (an engine without compiled kernels refuses True)."""
        ...

    def capture(self) -> AbstractContextManager[Any]:
        """The block in which graphs are captured; leaving it readies them for replay (collective)."""
        ...

    def execute_captured(
        self,
        plan: Plan,
        input: Any,
        output: Any = None,
        *,
        lines: bool | None = None,
        residual: Any = None,
        norm: Any = None,
        compiled: bool | None = None,
    ) -> str:
        """Inside ``capture()``: run ``plan`` on these tensors with no copy; '' when it did, else why not."""
        ...

    def exchange(self, what: str, value: Any) -> list[Any]:
        """Every rank's ``value`` in rank order, as plain data (collective; ``what`` names it in errors)."""
        ...

    def register_graph_buffers(self) -> None: ...

    def precompile(
        self, calls: Sequence[tuple[Plan, int, str]], threads: int | None = None, lines: bool | None = None
    ) -> dict[str, str]:
        """Build the kernels of ``calls`` (plan, message bytes, dtype) that a compiled call would launch, before the
        first such call (this rank's only; no peer takes part), an LL plan's with LL128 lines too where ``lines``
        (default: the engine's own); {call: why} for those that run otherwise."""
        ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...
