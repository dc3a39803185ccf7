"""Error types shared by every weft package.

Library code raises these; only the CLI turns them into one line on stderr and ``exit_code``.
Bad input is exit code 2; a check that ran and failed (unsat, verification failed, wrong result) is 1.
"""


class WeftError(Exception):
    """A user-facing error with a one-line message naming the file and field."""

    exit_code = 2


class CheckFailed(WeftError):
    """A check ran to completion and said no: unsat, verification failed, wrong result."""

    exit_code = 1
