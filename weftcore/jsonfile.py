"""Reading and writing weft's files with one-line errors that name the file, for every weft format."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from weftcore.errors import WeftError

MAX_FILE_BYTES = 256 << 20  # no weft file comes near this (a 128-instance plan is a few MB); /dev/zero does


def read_bytes(path: str | Path, kind: str, error: type[WeftError], limit: int = MAX_FILE_BYTES) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``: a FIFO, a device or a directory is refused before it
    is opened (reading one would hang, or never end), and a larger file is refused rather than read whole."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{kind} {path}: cannot read: not a regular file")
        if info.st_size > limit:
            raise error(
                f"{kind} {path}: cannot read: {info.st_size} bytes, more than the {limit >> 20} MiB a weft "
                "file may hold"
            )
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # swapped for a FIFO after stat: no hang
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise error(f"{kind} {path}: cannot read: not a regular file")
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{kind} {path}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{kind} {path}: cannot read: more than the {limit >> 20} MiB a weft file may hold")
    return data


def decode_json(data: bytes | str, kind: str, source: str, error: type[WeftError]) -> object:
    """``data`` decoded as JSON; malformed, too deep or with numbers too long to read, one line naming ``source``."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise error(f"{kind} {source}: not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise error(f"{kind} {source}: cannot read: {e}") from None
    except (ValueError, RecursionError) as e:  # a number too long to read, or nesting too deep
        raise error(f"{kind} {source}: not valid JSON: {(str(e).splitlines() or ['nested too deep'])[0]}") from None


def read_json(path: str | Path, kind: str, error: type[WeftError]) -> object:
    """The decoded content of ``path``; unreadable or malformed files raise ``error("<kind> <path>: ...")``."""
    return decode_json(read_bytes(path, kind, error), kind, str(path), error)


def write_text(path: str | Path, text: str | bytes, kind: str, error: type[WeftError], parents: bool = False) -> None:
    """Write ``text`` (or bytes: an image) to ``path`` whole or not at all (beside it, then renamed), so a failed
    write leaves no half file; unwritable paths raise ``error("<kind> <path>: cannot write: ...")``. ``parents``:
    create missing folders."""
    path = Path(path)
    check_output(path, kind, error)
    if parents:
        make_directory(path.parent, kind, error)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise error(f"{kind} {path}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; weft's files are meant to be shared
        check_output(path, kind, error)  # again just before the rename: the path may have changed meanwhile
        os.replace(tmp, path)
    except BaseException as e:  # a signal or an error: no temp file stays behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise error(f"{kind} {path}: cannot write: {e.strerror or e}") from None
        raise


_SPECIAL = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_output(path: str | Path, kind: str, error: type[WeftError], folder: bool = False) -> None:
    """Refuse ``path`` as an output unless it is new or a regular file (``folder``: or a directory): weft's
    writes replace their target, and a device node, FIFO or socket must never be replaced by a file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise error(f"{kind} {path}: cannot write: {e.strerror or e}") from None
    if stat.S_ISREG(mode) or (folder and stat.S_ISDIR(mode)):
        return
    what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    allowed = "a folder, a regular file or a new path" if folder else "a regular file or a new path"
    raise error(f"{kind} {path}: will not write: it is {what} (weft writes only to {allowed})")


def make_directory(path: str | Path, kind: str, error: type[WeftError]) -> Path:
    """``path`` as a folder, created with its parents where missing; one line naming it where that fails."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"{kind} {path}: cannot create the folder: {e.strerror or e}") from None
    return path


class Fields:
    """Field checks for one decoded file: every error is '<kind> <source>: <field>: <what is wrong>', one line."""

    def __init__(self, kind: str, source: str, error: type[WeftError]) -> None:
        self.kind, self.source, self.error = kind, source, error

    def fail(self, where: str, message: str) -> WeftError:
        return self.error(f"{self.kind} {self.source}: {where}: {message}")

    def obj(self, value: object, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, got {short_repr(value, 40)}")
        return value

    def list(self, value: object, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list, got {short_repr(value, 40)}")
        return value


LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines breaks at


def one_line(text: str) -> str:
    """``text`` with every line break escaped: a field name or value read from a file cannot split an error."""
    return "".join(repr(c)[1:-1] if c in LINE_BREAKS else c for c in text)


def short_repr(x: object, limit: int = 60) -> str:
    """repr() cut to ``limit`` characters, for error messages that must stay one short line."""
    try:
        text = repr(x)
    except ValueError:  # an int too long to print
        return f"<{type(x).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
