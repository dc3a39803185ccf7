"""How long NVML says a GPU's clocks were held below their target, and why: the violation counters of its performance
policies (nanoseconds since the driver loaded), read before and after a timed phase, so that a benchmark can say
whether a power, thermal or board limit slowed what it timed. tp_decode's batch-1 gap (bench/NOTES.md, the
twentieth session) sits in a GEMM that runs 107 µs alone and 115–122 µs in the step; these counters say whether the
step runs into a limit that the GEMM alone does not.

    read = violation_reader(uuid)          # None where NVML (nvidia-ml-py) cannot answer
    before = read(); ...; grown(before, read())   # {"power": ns, "thermal": ns, ...} spent limited in between
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# NVML's nvmlPerfPolicyType_t: the reasons NVML counts time for (nvmlDeviceGetViolationStatus)
POLICIES = {
    "power": 0,
    "thermal": 1,
    "sync_boost": 2,
    "board_limit": 3,
    "low_utilization": 4,
    "reliability": 5,
    "app_clocks": 10,
    "base_clocks": 11,
}


def violations(nvml: Any, handle: Any) -> dict[str, int]:
    """Each policy's violation time (ns) on the GPU of ``handle``; a policy this GPU or driver does not count is
    left out."""
    out = {}
    for name, policy in POLICIES.items():
        try:
            out[name] = int(nvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime)
        except Exception:  # NVMLError_NotSupported and kin: that policy is not counted here
            continue
    return out


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The ns each policy counted between two readings (the policies both readings have)."""
    return {name: after[name] - before[name] for name in after if name in before}


def violation_reader(uuid: str, nvml: Any = None) -> Callable[[], dict[str, int]] | None:
    """A function that reads the violation counters of the GPU whose UUID is ``uuid`` (torch's
    ``get_device_properties(i).uuid``, with or without NVML's ``GPU-`` prefix), or None where NVML cannot be asked
    (nvidia-ml-py not installed, no driver, no such GPU). ``nvml``: a pynvml stand-in (tests)."""
    try:
        if nvml is None:
            import pynvml

            nvml = pynvml
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # ImportError, or NVML's own errors: the counters are optional
        return None
    return lambda: violations(nvml, handle)
