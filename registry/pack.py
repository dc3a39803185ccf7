"""The compact entry file (``weft.registry-entry/2``): an entry whose plan's ``gpus`` are stored compressed.

A /2 file is the /1 document (``Entry.to_json``) with the plan's ``gpus`` list moved out of the plan into
``plan_gpus``: the list as compact JSON with sorted keys, zlib-compressed, base64. Everything a reviewer reads
(key, provenance, timings, the plan's name, protocol, sizes and ``weft`` record) stays plain JSON; only the
ops, which never change under an entry's id (the id is the plan's hash), are packed. A 128-instance 4-rank
plan's entry goes from 1.3 MB to a few tens of KB.

>>> doc = {"format": "weft.registry-entry/1", "plan": {"name": "p", "gpus": [{"id": 0}]}}
>>> packed = pack(doc)
>>> packed["format"], "gpus" in packed["plan"]
('weft.registry-entry/2', False)
>>> unpack(packed, "doctest") == doc
True
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any

from weftcore.errors import WeftError
from weftcore.jsonfile import MAX_FILE_BYTES, decode_json

PLAIN_FORMAT = "weft.registry-entry/1"
PACKED_FORMAT = "weft.registry-entry/2"
PACKED_FIELD = "plan_gpus"
ZLIB_LEVEL = 9


class PackError(WeftError):
    """A compact entry's packed plan cannot be read back."""


def pack(doc: dict[str, Any]) -> dict[str, Any]:
    """The /2 form of a /1 entry document (a new dict; ``doc`` is not changed)."""
    plan = dict(doc["plan"])
    gpus = json.dumps(plan.pop("gpus"), sort_keys=True, separators=(",", ":")).encode()
    packed = base64.b64encode(zlib.compress(gpus, ZLIB_LEVEL)).decode("ascii")
    return doc | {"format": PACKED_FORMAT, "plan": plan, PACKED_FIELD: packed}


def unpack(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """The /1 document of a /2 entry (its plan whole again); a /1 document as it is. Raises PackError naming
    ``source`` and the field where the packed plan is malformed, or inflates past the file size limit."""
    if doc.get("format") != PACKED_FORMAT:
        return doc
    plan, text = doc.get("plan"), doc.get(PACKED_FIELD)
    if not isinstance(plan, dict) or "gpus" in plan:
        raise PackError(f"registry entry {source}: plan: must be an object without gpus (they are in {PACKED_FIELD})")
    if not isinstance(text, str):
        raise PackError(f"registry entry {source}: {PACKED_FIELD}: must be a string (base64 of zlib-compressed JSON)")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        inflate = zlib.decompressobj()
        data = inflate.decompress(raw, MAX_FILE_BYTES)
    except (UnicodeEncodeError, binascii.Error, zlib.error) as e:
        raise PackError(f"registry entry {source}: {PACKED_FIELD}: not base64 of zlib data: {e}") from None
    if inflate.unconsumed_tail:
        raise PackError(f"registry entry {source}: {PACKED_FIELD}: inflates past {MAX_FILE_BYTES >> 20} MiB")
    if not inflate.eof or inflate.unused_data:
        raise PackError(f"registry entry {source}: {PACKED_FIELD}: not one whole zlib stream")
    gpus = decode_json(data, "registry entry", f"{source}: {PACKED_FIELD}", PackError)
    rest = {k: v for k, v in doc.items() if k != PACKED_FIELD}
    return rest | {"format": PLAIN_FORMAT, "plan": plan | {"gpus": gpus}}
