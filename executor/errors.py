"""Errors of the GPU executor: bad launches (exit code 2) and failures on the GPU (exit code 1)."""

from __future__ import annotations

from weftcore.errors import CheckFailed, WeftError


class ExecutorError(WeftError):
    """A launch the executor refuses: world size, size, dtype, buffers, or no GPU runtime."""


class ExecutorTimeout(CheckFailed):
    """A wait on the GPU ran past its bound; the kernel stopped instead of hanging.

    ``rank``, ``threadblock``, ``op`` (index in the plan thread block's op list) and ``peer`` say where.
    """

    def __init__(self, message: str, rank: int = -1, threadblock: int = -1, op: int = -1, peer: int | None = None):
        super().__init__(message)
        self.rank, self.threadblock, self.op, self.peer = rank, threadblock, op, peer


class PeerLost(ExecutorTimeout):
    """A peer rank's process exited (or, where it cannot be checked, stopped answering) while this rank waited on it.

    A subclass of ExecutorTimeout, so handlers of timeouts see it too; unlike a plain timeout the communicator
    cannot recover (its peer is gone), so the job must restart. ``lost`` holds the ranks; the other fields say
    where this rank waited (threadblock and op are -1 for a bootstrap exchange through the Store).
    """

    def __init__(
        self,
        message: str,
        rank: int = -1,
        threadblock: int = -1,
        op: int = -1,
        peer: int | None = None,
        lost: tuple[int, ...] = (),
    ):
        super().__init__(message, rank, threadblock, op, peer)
        self.lost = lost


class WrongResult(CheckFailed):
    """A plan ran to completion but computed something other than its collective: in the reference executor
    (against numpy's definition) or on GPUs (against NCCL's result)."""
