"""Which fabric an inference job runs on, and whether its GPUs really reach each other (for the torch API).

The topology keys the registry: ``$WEFT_TOPOLOGY`` (a catalog spec or a file) wins, then NVML detection, then
a guess from torch alone (GPU name, count and peer access -> the catalog board). A job on part of a machine
(TP=2 on an 8-GPU board) gets the board's slice of its own size, as ``weft topo detect`` would on a VM of it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from topologies import Topology, resolve
from topologies.errors import TopologyError

log = logging.getLogger("weft.inference")
BOARDS = {"H200": "hgx_h200", "H100": "hgx_h100", "A100": "dgx_a100"}
P2P_MAGIC = 0x5EF7


def board_spec(gpu_name: str, nranks: int) -> str | None:
    """The catalog spec of an NVSwitch board slice with ``nranks`` GPUs named ``gpu_name``, if weft knows it."""
    family = next((f for f in BOARDS if f in gpu_name.upper()), None)
    if family is None or not 1 <= nranks <= 8:
        return None
    return f"{BOARDS[family]}:gpus={nranks}"


def machine_topology(nranks: int, spec: str | None = None, nvml: Any = None) -> Topology | None:
    """This job's topology, or None when weft cannot tell (the caller then uses NCCL throughout).

    ``spec``: a catalog spec or file; default ``$WEFT_TOPOLOGY``. ``nvml``: a pynvml stand-in (tests).
    """
    spec = spec or os.environ.get("WEFT_TOPOLOGY")
    if spec:
        topology = resolve(spec)
        if topology.nranks != nranks:
            raise TopologyError(f"WEFT_TOPOLOGY {spec}: nranks: {topology.nranks} ranks, but the job has {nranks}")
        return topology
    try:
        from topologies.detect import detect

        detected = detect(nvml)
        if detected.nranks == nranks:
            return detected
        log.info("weft: NVML sees %d GPUs but the job has %d ranks; using the board slice", detected.nranks, nranks)
    except Exception as e:  # NVML's own errors, or a pynvml without a function: detection is optional here
        log.info("weft: NVML detection unavailable (%s); guessing the board from torch", e)
    return torch_topology(nranks)


def torch_topology(nranks: int) -> Topology | None:
    """The catalog board for this job's GPUs from torch alone: their name, and peer access between all of them."""
    import torch

    count = torch.cuda.device_count()
    if count < nranks:
        return None  # ranks on several hosts or hidden GPUs: no single-board guess is safe
    names = {torch.cuda.get_device_name(d) for d in range(nranks)}
    peers = all(torch.cuda.can_device_access_peer(a, b) for a in range(nranks) for b in range(nranks) if a != b)
    spec = board_spec(names.pop(), nranks) if len(names) == 1 and peers else None
    return resolve(spec) if spec else None


def p2p_works(comm: Any) -> str:
    """Whether every peer's kernels can write this rank's memory: a real write through IPC, read back here.

    ``comm`` is a started executor Communicator (its store, rank, world size and peer mappings). Collective:
    every rank must call it. Returns '' when P2P works for this rank, else why not.
    """
    import cupy

    from executor.gpu import ipc

    world = comm.world_size
    why = ""
    with cupy.cuda.Device(comm.device):
        mailbox = cupy.zeros(world, cupy.int32)
        cupy.cuda.runtime.deviceSynchronize()
        try:
            mine = ipc.export(mailbox.data.ptr)
        except Exception as e:  # CUDA raises its own error types; any of them means no working P2P
            mine, why = None, f"rank {comm.rank}: cannot export memory by IPC: {e}"
        handles = comm._all_gather("p2p-handles", mine)
        try:
            for peer, shared in enumerate(handles):
                if peer == comm.rank or shared is None:
                    continue
                remote = cupy.cuda.MemoryPointer(
                    cupy.cuda.UnownedMemory(comm._peers.open(shared), 4 * world, None, comm.device), 0
                )
                # a fill kernel on this GPU storing into the peer's memory, as the executor's kernels do
                cupy.ndarray((world,), cupy.int32, remote)[comm.rank : comm.rank + 1].fill(P2P_MAGIC + comm.rank)
            cupy.cuda.runtime.deviceSynchronize()
        except Exception as e:
            why = why or f"rank {comm.rank}: writing to peer memory failed: {e}"
        comm._all_gather("p2p-written", None)
        got = [int(v) for v in mailbox.get()]
    expected = [P2P_MAGIC + r if r != comm.rank else 0 for r in range(world)]
    if not why and got != expected:
        why = f"rank {comm.rank}: peer writes did not arrive (read {got}, expected {expected})"
    return why
