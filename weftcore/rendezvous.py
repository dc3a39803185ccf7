"""A TCP port for a job's rendezvous (MASTER_PORT) that nothing else on this host will take first.

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
