"""Errors that solvers raise."""

from weftcore.errors import CheckFailed, WeftError


class SynthesisError(WeftError):
    """Bad solver options (exit code 2)."""


class NotApplicable(SynthesisError):
    """The algorithm does not exist for this topology or collective; the message says why."""


class Unsat(CheckFailed):
    """The instance has no schedule (exit code 1); the message names the instance."""


class Unknown(CheckFailed):
    """The solver hit its time limit with no answer (exit code 1); the message names the instance."""


class Interrupted(KeyboardInterrupt):
    """The user stopped a solve (Ctrl-C); the message says what was found and that nothing was kept."""
