"""weftcore: the base every weft layer may import, and which imports none of them.

``weftcore.errors``: ``WeftError`` (a user-facing error with a one-line message and an exit code) and
``CheckFailed`` (a check that ran and said no). ``weftcore.jsonfile``: reading and writing weft's files with
one-line errors that name the file and field. ``weftcore.rendezvous``: the TCP port a job's ranks meet on
(MASTER_PORT), outside the kernel's ephemeral range.
"""
