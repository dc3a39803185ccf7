"""Which plan protocols the GPU engines run: Simple and LL (its packets as LL16, or as LL128 lines).

A Lamport plan (``schedules.lamport``) is proven by the CPU reference executor (``executor.reference.lamport``),
but no kernel runs it yet: the interpreter and the port engine refuse it in one line, the torch-facing plan choice
(``executor.inference.plans.PlanChoice``) never considers it, and ``weft registry select`` (``weft.publish.select``)
passes over it, naming why; so a registry that holds Lamport variants still serves every call with a plan these
engines run, or with NCCL. Once the kernel exists, adding the protocol to ``GPU_PROTOCOLS`` lifts all three.

>>> from schedules.plan import Plan
>>> protocol_refusal(Plan("x", "allreduce", "Lamport", False, ())).split(":")[1]
' protocol Lamport'
"""

from __future__ import annotations

from schedules.plan.types import Plan

GPU_PROTOCOLS = ("Simple", "LL")


def protocol_refusal(plan: Plan) -> str:
    """Why no GPU engine runs ``plan``'s protocol, in one line; '' where one does."""
    if plan.protocol in GPU_PROTOCOLS:
        return ""
    return (
        f"plan {plan.name}: protocol {plan.protocol}: the GPU executor runs {' and '.join(GPU_PROTOCOLS)} plans "
        "only (no kernel for it yet; the CPU reference executor proves it)"
    )
