"""Protocol selection and message-size range.

LL packets pair every 4-byte word with a 4-byte flag: a receiver polls the flags instead of waiting for a
signal, which saves a round trip per hop but doubles the bytes on the wire and in scratch. That wins for
small messages on latency-bound schedules (one-shot and two-shot: at most ``LL_MAX_STEPS`` steps) and loses
for large ones, so LL plans stop at ``LL_MAX_BYTES``; Simple plans take any size.
"""

from __future__ import annotations

from schedules.lamport import PROTOCOL as LAMPORT
from schedules.plan.types import MAX_MESSAGE_SIZE
from schedules.schedule import Schedule
from weftcore.errors import WeftError

LL_MAX_BYTES = 1 << 20
# Lamport plans (``schedules.lamport``) move the data alone, as their own flag, so they reach further than LL16
# packets: TensorRT-LLM's one-shot leads up to 4 MB on two H200s (issue 33); the registry's timings decide.
LAMPORT_MAX_BYTES = 4 << 20
LL_MAX_STEPS = 2
PROTOCOLS = {"simple": "Simple", "ll": "LL", "lamport": LAMPORT}


class CodegenError(WeftError):
    """A schedule or option codegen cannot turn into a plan."""


def choose_protocol(schedule: Schedule, protocol: str = "auto") -> str:
    """'Simple', 'LL' or 'Lamport' for ``protocol`` in simple|ll|lamport|auto (auto: LL for schedules of few steps;
    Lamport only where asked, until the registry's GPU timings can choose it)."""
    key = protocol.lower()
    if key == "auto":
        return "LL" if schedule.nsteps <= LL_MAX_STEPS else "Simple"
    if key not in PROTOCOLS:
        raise CodegenError(f"--protocol: must be simple, ll, lamport or auto, got {protocol!r}")
    return PROTOCOLS[key]


def size_range(
    protocol: str, ll_max_bytes: int = LL_MAX_BYTES, lamport_max_bytes: int = LAMPORT_MAX_BYTES
) -> tuple[int, int]:
    """(min_message_size, max_message_size) in bytes for a plan of ``protocol``; an executor that moves LL packets
    as LL128 lines (1.07× the data on the wire, not 2×) makes LL worth a higher ``ll_max_bytes``, and a Lamport
    two-shot, whose 1× wire bytes the traffic model puts ahead to 16 MB on 4 GPUs, a higher ``lamport_max_bytes``."""
    if protocol == LAMPORT:
        return 0, lamport_max_bytes
    return (0, ll_max_bytes) if protocol == "LL" else (0, MAX_MESSAGE_SIZE)
