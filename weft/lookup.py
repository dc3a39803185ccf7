"""``weft.select``: the registry's best plan for a call, asked in the CLI's terms (a catalog spec, "4MB")."""

from __future__ import annotations

from registry.store import Registry, Selection
from topologies import Topology
from weft.units import parse_bytes


def select(
    topology: Topology | str,
    collective: str,
    size: int | str,
    registry: Registry | str | None = None,
    dtype: str | None = None,
) -> Selection:
    """What ``weft registry select -t TOPOLOGY COLLECTIVE --size SIZE`` picks: ``topology`` a Topology, a catalog
    spec, a file or a fingerprint; ``size`` "4MB" or bytes; ``registry`` a Registry or a location (default:
    ``$WEFT_REGISTRY``, else the user data dir). ``Selection.entry`` is None where NCCL should run, with the reason."""
    from weft import publish

    nbytes = parse_bytes(size, "size") if isinstance(size, str) else size
    location = registry.location if isinstance(registry, Registry) else registry
    return publish.select(location, topology, collective, nbytes, dtype)  # proven, fitting plans only, as the CLI
