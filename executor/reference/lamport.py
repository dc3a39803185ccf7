"""The CPU reference executor's model of the Lamport protocol: the sentinel, the rotation and the reset.

A Lamport plan (``schedules.lamport``) moves its packets as the data alone. This machine runs it as the GPU would:

- **The sentinel.** Every scratch word starts as -0.0 (the bit pattern of negative zero, in every dtype). A packet
  write maps -0.0 to +0.0 (``schedules.lamport.to_wire``) and writes the data; a packet read waits until no word of
  its slots holds the sentinel. Waiting is the scheduler's: a thread whose words still hold it does not run (an
  input whose -0.0 a sender forgot to map would leave its reader waiting: a deadlock, reported). A slot that holds
  another launch's data counts as arrived, as it would on the GPU, and reading it is reported as the race it is.
- **The rotation.** Launch k reads and its peers write scratch copy ``k % buffers``.
- **The reset.** Each rank's launch k has one more thread, beside its thread blocks: it writes the sentinel over
  every slot of copy ``(k + reset_ahead) % buffers``, at any time while the launch runs (off the critical path),
  and the launch ends after it. Its write is checked as any write is: after the data it clears was written and
  read, and before the next data lands (else a race, naming the reset).

``refuse_racy_reset`` is the verifier's rule before any run (``schedules.lamport.reset_race``); the model finds
the same races by running, which the tests show for a rotation that breaks the rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from executor.reference.machine import _PLAIN, CLOCK, PlanRace, _Buffer, _Machine, _Thread
from schedules.lamport import LamportBuffers, is_sentinel, reset_race, to_wire
from schedules.plan.types import BufferRef, Op, Plan

RESET_TB = -(1 << 20)  # the thread-block id of a reset thread (hosts are -1, port proxies -2 and below)
SENTINEL_FLAG = 1 << 40  # a slot's flag while it holds the sentinel: no launch's, and never "before" a launch


def refuse_racy_reset(plan: Plan) -> None:
    """Raise PlanRace, in one line, where the plan's rotation lets a reset race a reader or a writer."""
    assert plan.lamport is not None, "only Lamport plans rotate their scratch"
    why = reset_race(plan.lamport)
    if why:
        raise PlanRace(f"plan {plan.name}: {why}")


class LamportMachine(_Machine):
    """The reference machine, with Lamport scratch: sentinel words, rotating copies, a reset per launch."""

    def _side_threads(self) -> list[_Thread]:
        return [
            _Thread(r, RESET_TB, k, (Op("nop"),), np.zeros(0, CLOCK), (-1,), (None,))
            for k in range(self.launches)
            for r in range(self.plan.nranks)
        ]

    def _place_buffers(self, rank: int, ichunks: int, ochunks: int, schunks: int) -> None:
        super()._place_buffers(rank, ichunks, ochunks, schunks)
        scratch = self.buffers[(rank, "s")]  # allocated filled with the sentinel, before any launch
        scratch.data[:] = np.float32(-0.0)
        scratch.flag[:] = SENTINEL_FLAG

    def _rotation(self) -> LamportBuffers:
        assert self.plan.lamport is not None  # run_launches makes this machine for Lamport plans only
        return self.plan.lamport

    def _arrived(self, t: _Thread, buf: _Buffer, sl: slice) -> bool:
        """Polling the data words: arrived when none holds the sentinel."""
        return not bool(is_sentinel(buf.data[sl]).any())

    def blocked_reason(self, t: _Thread) -> str:
        why = super().blocked_reason(t)
        if why.endswith("waits for packets"):
            copy = self._rotation().used_by(t.launch)
            return f"{self.where(t)} waits for Lamport data: a word of scratch copy {copy} still holds the sentinel"
        return why

    def where(self, t: _Thread) -> str:
        if t.tb != RESET_TB:
            return super().where(t)
        launch = f"launch {t.launch} " if self.launches > 1 else ""
        return f"{launch}rank {t.rank}'s reset of Lamport scratch copy {self._rotation().reset_by(t.launch)}"

    def _describe(self, index: int, hint: bool = True) -> str:
        t = self.everyone[index]
        if t.tb != RESET_TB:
            return super()._describe(index, hint)
        return (
            f"rank {t.rank}'s reset of Lamport scratch copy {self._rotation().reset_by(t.launch)} in launch {t.launch}"
        )

    def step(self, t: _Thread) -> None:
        if t.tb != RESET_TB:
            super().step(t)
            return
        me = self._index[id(t)]
        self._start(t)
        t.vc[me] += 1
        chunks = self.plan.gpus[t.rank].scratch_chunks
        if chunks:
            copy = self._rotation().reset_by(t.launch)
            buf, sl = self.slots(t.rank, "s", BufferRef(0, chunks, "s"), self.where(t), launch=copy)
            sentinel = np.full((sl.stop - sl.start, self.slot_elems), -0.0, np.float32)
            self._write(t, me, buf, sl, sentinel, SENTINEL_FLAG, t.rank, "scratch", self.where(t), 0)
        t.pc += 1

    def _read(
        self, t: _Thread, me: int, buf: _Buffer, sl: slice, packet: bool, rank: int, name: str, where: str, index: int
    ) -> np.ndarray:
        if packet:
            for k in range(sl.start, sl.stop):
                if buf.flag[k] != t.launch:
                    raise PlanRace(
                        f"plan {self.plan.name}: {where} takes chunk {(index + k - sl.start) // self.G} of rank "
                        f"{rank}'s {name} buffer for launch {t.launch}'s Lamport data, but it holds launch "
                        f"{buf.flag[k]}'s (no reset came between)"
                    )
        return super()._read(t, me, buf, sl, packet, rank, name, where, index)

    def _write(self, t: _Thread, me: int, buf: _Buffer, sl: slice, value: np.ndarray, flag: int, *at: Any) -> None:
        rank, name, where, index = at  # as the base's: rank, buffer name, where, first chunk index
        if flag not in (SENTINEL_FLAG, _PLAIN):  # Lamport data: lands on the sentinel only, as +0.0 where it was -0.0
            for k in range(sl.start, sl.stop):
                if buf.flag[k] != SENTINEL_FLAG:
                    held = "plain data" if buf.flag[k] == _PLAIN else f"launch {buf.flag[k]}'s Lamport data"
                    raise PlanRace(
                        f"plan {self.plan.name}: {where} writes Lamport data into chunk "
                        f"{(index + k - sl.start) // self.G} of rank {rank}'s {name} buffer, which still holds "
                        f"{held} (no reset came between)"
                    )
            value = to_wire(value)
        super()._write(t, me, buf, sl, value, flag, *at)
