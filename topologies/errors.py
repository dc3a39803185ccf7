"""Errors of topologies: malformed fabrics and ranks that cannot reach each other.

``WeftError`` and ``CheckFailed``, the base of every weft error, live in ``weftcore.errors``; they are re-exported
here because ``from topologies.errors import WeftError`` is the path users have written.
"""

from weftcore.errors import CheckFailed, WeftError

__all__ = ["CheckFailed", "TopologyError", "UnreachableError", "WeftError"]


class TopologyError(WeftError):
    """A topology file or catalog spec is malformed or inconsistent."""


class UnreachableError(TopologyError):
    """Some rank cannot reach another rank over the topology's links."""
