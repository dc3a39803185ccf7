"""Reading a JSON file with one-line errors that name the file, for every weft format."""

from __future__ import annotations

import json
from pathlib import Path

from topologies.errors import WeftError


def read_json(path: str | Path, kind: str, error: type[WeftError]) -> object:
    """The decoded content of ``path``; unreadable or malformed files raise ``error("<kind> <path>: ...")``."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{kind} {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{kind} {path}: not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except (ValueError, RecursionError) as e:  # a number too long to read, or nesting too deep
        raise error(f"{kind} {path}: not valid JSON: {str(e).splitlines()[0]}") from None
