"""Which plan protocols the GPU engines run: Simple and LL (its packets as LL16, or as LL128 lines).

A Lamport plan (``schedules.lamport``) is proven by the CPU reference executor (``executor.reference.lamport``). The
interpreter has an experimental kernel for it (``executor.gpu.lamport``), run on GPUs at the engine's level only
(tests/gpu/test_lamport_gpu.py passed whole at 2 and 4 ranks on 4xH200, 2026-11-27; the Communicator's staging, zero-
copy capture and fused paths have not run it, nor has the bench): it takes Lamport plans only where the caller passes
``experimental`` (``executor.gpu.tables`` does when the environment sets ``WEFT_GPU_LAMPORT=1``). Everywhere else they
are refused in one line: the port engine refuses them, the torch-facing plan choice
(``executor.inference.plans.PlanChoice``) never considers them, and ``weft registry select`` (``weft.publish.select``)
passes over them, naming why; so a registry that holds Lamport variants still serves every call with a plan these
engines run, or with NCCL. Once the Communicator's paths and the bench have run the kernel, adding the protocol to
``GPU_PROTOCOLS`` (and keeping the port engine's refusal) lifts the rest.

>>> from schedules.plan import Plan
>>> protocol_refusal(Plan("x", "allreduce", "Lamport", False, ())).split(":")[1]
' protocol Lamport'
>>> protocol_refusal(Plan("x", "allreduce", "Lamport", False, ()), experimental=True)
''
"""

from __future__ import annotations

from executor.gpu.lamport import ENV, EXPERIMENTAL_PROTOCOLS
from schedules.plan.types import Plan

GPU_PROTOCOLS = ("Simple", "LL")


def protocol_refusal(plan: Plan, experimental: bool = False) -> str:
    """Why no GPU engine runs ``plan``'s protocol, in one line; '' where one does (``experimental``: the
    interpreter's experimental kernels count too)."""
    if plan.protocol in GPU_PROTOCOLS or (experimental and plan.protocol in EXPERIMENTAL_PROTOCOLS):
        return ""
    hint = (
        f"its kernel is experimental until the Communicator and the bench have run it: set {ENV}=1 to try it"
        if plan.protocol in EXPERIMENTAL_PROTOCOLS
        else "no kernel for it"
    )
    return (
        f"plan {plan.name}: protocol {plan.protocol}: the GPU executor runs {' and '.join(GPU_PROTOCOLS)} plans "
        f"only ({hint}; the CPU reference executor proves it)"
    )
