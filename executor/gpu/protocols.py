"""Which plan protocols the engines run: the interpreter engine runs Simple, LL (its packets as LL16, or as LL128
lines) and Lamport (``executor.gpu.lamport``); the port engine, which moves plain data between hosts, runs Simple and
LL plans only. A plan of any other protocol is refused in one line, before it runs.

Lamport plans are proven by the CPU reference executor (``executor.reference.lamport``) and ran on GPUs through the
engine and the Communicator's paths (tests/gpu/test_lamport_gpu.py: eager calls on the staging buffers, padded
sizes, zero-copy graph capture, the fused norm), so selection (``executor.inference.plans.PlanChoice``, ``weft
registry select``) weighs them by their measured times like any other.

>>> from schedules.plan import Plan
>>> protocol_refusal(Plan("x", "allreduce", "Lamport", False, ()))
''
>>> protocol_refusal(Plan("x", "allreduce", "Lamport", False, ()), PORT_PROTOCOLS, "the port engine").split(":")[1]
' protocol Lamport'
"""

from __future__ import annotations

from schedules.plan.types import Plan

GPU_PROTOCOLS = ("Simple", "LL", "Lamport")
PORT_PROTOCOLS = ("Simple", "LL")


def protocol_refusal(plan: Plan, protocols: tuple[str, ...] = GPU_PROTOCOLS, engine: str = "the GPU executor") -> str:
    """Why ``engine``, which runs plans of ``protocols``, does not run ``plan``'s protocol, in one line; '' where it
    does."""
    if plan.protocol in protocols:
        return ""
    return (
        f"plan {plan.name}: protocol {plan.protocol}: {engine} runs {', '.join(protocols[:-1])} and {protocols[-1]} "
        "plans only (the CPU reference executor proves any)"
    )
