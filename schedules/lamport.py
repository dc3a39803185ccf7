"""The Lamport protocol: data that is its own flag, in buffers that rotate and are reset off the critical path.

A Lamport plan moves data with the packet ops of LL plans (``ppkt``, ``upkt``, ``repkt``, ...), but a "packet"
is the data itself, 1× its bytes on the wire and in scratch: no flag word. Every scratch word starts as the
**sentinel**, the bit pattern of negative zero in the element type, which no sender ever writes: a sender maps
-0.0 to +0.0 before writing (``to_wire_bits``), and a receiver polls the data words until none holds the sentinel.

The mapping, exactly: the one bit pattern changed is the dtype's -0.0 (fp32 0x80000000, fp16 and bf16 0x8000),
which becomes +0.0 (all bits zero). -0.0 and +0.0 are equal under IEEE comparison, so every sum and copy stays
equal to its definition; only the sign of a zero that crossed a Lamport buffer can differ. Every other pattern
(+0.0, subnormals, infinities, and every NaN, with its sign and payload) is written bit for bit.

Scratch holds ``buffers`` copies that rotate by call: call c uses copy ``c % buffers``. A copy must be back at the
sentinel before it is written again, so call c resets copy ``(c + reset_ahead) % buffers``, concurrently with its
own work (off the critical path). With 3 copies and a reset 2 calls ahead (TensorRT-LLM's Lamport all-reduce),
call c clears the copy call c-1 used, which call c+2 uses next. ``reset_race`` says why another choice could race:

- a reset 1 call ahead clears call c+1's copy while call c still sends, and a peer that already holds call c's data
  may start call c+1 and write into that copy during the reset;
- a reset ``buffers`` calls ahead (or more) clears the copy that call c itself (or an earlier call still in its
  readers' hands) uses.

So 2 copies never suffice off the critical path. Whether a peer can run further ahead than one call depends on the
plan's data dependencies: codegen opens a launch with an entry handshake where they do not order it, and the CPU
reference executor proves each plan back to back over every copy's reuse (``executor.reference.lamport``).

>>> hex(int(to_wire_bits(np.array([0x8000, 0x7E01, 0xFE01], np.uint16), "bf16")[0]))
'0x0'
>>> reset_race(LamportBuffers(3, 1)).split(":")[0]
'lamport.reset_ahead 1'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PROTOCOL = "Lamport"  # the plan's "protocol" value; codegen and the CLI take it as "lamport"
SENTINEL_BITS = {"fp32": 0x8000_0000, "fp16": 0x8000, "bf16": 0x8000}  # -0.0 in each element type
BITS_TYPES = {"fp32": np.uint32, "fp16": np.uint16, "bf16": np.uint16}
BUFFERS = 3
RESET_AHEAD = 2


@dataclass(frozen=True)
class LamportBuffers:
    """How a Lamport plan's scratch rotates: call c uses copy c % buffers, resets copy (c + reset_ahead) % buffers."""

    buffers: int = BUFFERS
    reset_ahead: int = RESET_AHEAD

    def used_by(self, call: int) -> int:
        """The scratch copy call ``call`` reads and its peers write."""
        return call % self.buffers

    def reset_by(self, call: int) -> int:
        """The scratch copy call ``call`` resets to the sentinel (off its critical path)."""
        return (call + self.reset_ahead) % self.buffers

    @property
    def calls_to_prove(self) -> int:
        """Back-to-back calls that reuse every copy after its reset at least once: one more than the copies."""
        return self.buffers + 1

    def to_json(self) -> dict[str, Any]:
        return {"buffers": self.buffers, "reset_ahead": self.reset_ahead}


def reset_race(rotation: LamportBuffers) -> str:
    """Why a reset in this rotation could race a reader or a writer, in one line; '' when it cannot."""
    n, ahead = rotation.buffers, rotation.reset_ahead
    if ahead >= n or ahead == 0:
        return (
            f"lamport.reset_ahead {ahead}: with {n} buffers, call c would reset the buffer of call "
            f"{f'c-{ahead - n}' if ahead > n else 'c'}, "
            "which its readers may still read (reset_ahead must be below buffers)"
        )
    if ahead < 2:
        return (
            f"lamport.reset_ahead {ahead}: call c would reset the buffer of call c+{ahead} while a peer that holds "
            f"call c's data may already write call c+{ahead}'s into it (a reset off the critical path must be at "
            f"least 2 calls ahead{'; 2 buffers cannot rotate so, use 3' if n == 2 else ''})"
        )
    return ""


def to_wire_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """``bits`` (the element type's bit patterns) as a sender writes them: -0.0 becomes +0.0, nothing else changes."""
    out = np.array(bits, dtype=BITS_TYPES[dtype])
    out[out == SENTINEL_BITS[dtype]] = 0
    return out


def to_wire(values: np.ndarray) -> np.ndarray:
    """float32 values holding elements of any weft dtype (fp16 and bf16 exactly representable), mapped as
    ``to_wire_bits`` maps their own bit patterns: -0.0 is -0.0 in all three types and nothing else is."""
    values = np.asarray(values, dtype=np.float32)
    return np.where(is_sentinel(values), np.float32(0.0), values)


def is_sentinel(values: np.ndarray) -> np.ndarray:
    """Which float32 words hold the sentinel (negative zero), elementwise; NaNs never do."""
    words: np.ndarray = np.asarray(values, dtype=np.float32).view(np.uint32)
    return np.asarray(words == SENTINEL_BITS["fp32"])
