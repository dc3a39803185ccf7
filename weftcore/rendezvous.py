"""A job's rendezvous on one host: the TCP port its ranks meet on (MASTER_PORT), which nothing else on this host will
take first, and each rank's environment (``rank_env``).

Binding port 0 hands back a port of the kernel's ephemeral range, and closing it frees that port for every outgoing
connection too: between the choice and rank 0's listen, the other ranks' own sockets (NCCL's, gloo's, a previous
job's) can take it, and rank 0 then fails with EADDRINUSE (seen once in the GPU suite, 2026-11-28). A port below the
ephemeral range is never handed out that way, so only a listener could hold it, and ``rendezvous_port`` checks that none
does.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
FLOOR = 10000  # below: well-known and registered services
# NVLink multicast off for every rank weft starts (the GPU machines' rule; NCCL, torch symmetric memory, NVSHMEM)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def ephemeral_range(path: Path = EPHEMERAL) -> tuple[int, int]:
    """The kernel's ephemeral ports (Linux's default where the file is missing or unreadable)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def rendezvous_port(host: str = "127.0.0.1", path: Path = EPHEMERAL, tries: int = 200) -> int:
    """A port of ``host`` outside the ephemeral range that a listener could bind just now (random, so that jobs
    started together pick different ones); OSError when ``tries`` ports are all taken."""
    low, high = ephemeral_range(path)
    spans = [(a, b) for a, b in ((FLOOR, low - 1), (high + 1, 65535)) if b >= a]
    rng = random.Random()
    for _ in range(tries):
        a, b = rng.choice(spans) if spans else (FLOOR, 65535)
        port = rng.randint(a, b)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port outside the ephemeral range {low}-{high} after {tries} tries")


def rank_env(rank: int, world: int, port: int | str, local_rank: int | None = None) -> dict[str, str]:
    """The variables a rank of a one-host job reads (torch.distributed's env:// and weft's launchers): its rank, the
    world size, its GPU (``local_rank``, default the rank), the rendezvous at 127.0.0.1:``port``, and multicast off.

    >>> rank_env(1, 2, 29500)["LOCAL_RANK"], rank_env(1, 2, 29500, local_rank=0)["LOCAL_RANK"]
    ('1', '0')
    """
    return {
        **MULTICAST_OFF,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
