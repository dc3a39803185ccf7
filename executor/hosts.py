"""Host identity at run time, and the checks that follow from it: a memory channel (CUDA IPC) never crosses hosts,
and a port channel needs a transport that can move this job's tensors.

A rank's host is its host name plus the kernel's boot id (two machines, or two boots of one, never share it).
``WEFT_HOST`` overrides it, so that the ranks of one machine can stand for several hosts (the two GPUs of one
machine as two hosts, with the engine's network path forced): then they are treated exactly as ranks on
different machines are.

>>> hosts = ("a", "b")
>>> channel, transport = transport_refusal(2, 0, hosts, (1,), backend=None, device_type="cuda").split(": transport ")
>>> print(channel)
port channel 0 of rank 0 to rank 1 (host b)
>>> print(transport)
torch.distributed is unavailable: no process group is initialized (launch with torchrun and call init_process_group)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Hashable, Sequence
from pathlib import Path

from schedules.plan.types import Plan

HOST_ENV = "WEFT_HOST"
# backend -> the device type its point-to-point calls move
TRANSPORTS = {"nccl": "cuda", "gloo": "cpu"}


def host_identity() -> str:
    """This process's host: ``$WEFT_HOST`` if set, else host name and boot id."""
    declared = os.environ.get(HOST_ENV, "").strip()
    if declared:
        return declared
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


def ipc_across_hosts(plan: Plan, hosts: Sequence[Hashable]) -> str:
    """'' when every memory channel of ``plan`` joins two ranks of one host, else why not. ``hosts[rank]``: a host
    name, or a topology's host index."""
    for r, gpu in enumerate(plan.gpus):
        for cid, peer in enumerate(gpu.memory_peers):
            if hosts[r] != hosts[peer]:
                return (
                    f"plan {plan.name}: gpus[{r}] memory channel {cid} joins rank {r} (host {hosts[r]}) and rank "
                    f"{peer} (host {hosts[peer]}): a memory channel is CUDA IPC, which cannot cross hosts; "
                    "compile the plan for a topology with these hosts (its hops between them become port "
                    "channels)"
                )
    return ""


def transport_refusal(
    nranks: int, rank: int, hosts: Sequence[str], port_peers: Sequence[int], backend: str | None, device_type: str
) -> str:
    """'' when this rank's port channels (``port_peers``: the peer of each) can run over ``backend`` for tensors on
    ``device_type``; else one line naming the first channel and the transport."""
    if not port_peers:
        return ""
    if backend is None:
        why, transport = (
            "no process group is initialized (launch with torchrun and call init_process_group)",
            "torch.distributed",
        )
    elif backend not in TRANSPORTS:
        why, transport = f"the port engine drives {' or '.join(TRANSPORTS)} point-to-point calls", backend
    elif TRANSPORTS[backend] != device_type:
        why, transport = f"its point-to-point calls move {TRANSPORTS[backend]} tensors, not {device_type}", backend
    elif len(hosts) != nranks:
        why, transport = f"the process group has {len(hosts)} ranks, the plan {nranks}", backend
    else:
        return ""
    peer = port_peers[0]
    host = hosts[peer] if peer < len(hosts) else "?"
    return f"port channel 0 of rank {rank} to rank {peer} (host {host}): transport {transport} is unavailable: {why}"
