"""Peer liveness: when a wait on a peer runs long, find out whether the peer still exists and name it.

Every rank publishes who it is (pid, host, boot id, pid namespace, process start time) in the Store at its
communicator's first exchange. When a wait fails (a kernel's wait on the GPU, or a bootstrap exchange through
the Store), a peer in this host's pid namespace is probed directly: ``os.kill(pid, 0)`` and ``/proc/<pid>/stat``
tell a live process from one that exited, a zombie, or a reused pid. A peer on another host cannot be probed; it
is reported as not responding within the exchange's bound.

    roster = Roster.join(store, "weft/1", rank, world_size)
    values = roster.all_gather("weft/1/3/context", value, timeout_s=60)   # PeerLost as soon as a peer exits
    roster.raise_if_lost("threadblock 0, op 2: wait on a channel 0")       # after a kernel's wait timed out

The Store is anything with torch.distributed.Store's ``set``, ``get`` and ``check``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from executor.errors import ExecutorError, ExecutorTimeout, PeerLost
from executor.gpu.bootstrap import decode, encode

State = Literal["alive", "exited", "remote", "unjoined"]
PROBE_EVERY_S = 0.25  # how often a bootstrap exchange that is still waiting looks at its missing peers
MAX_PAUSE_S = 0.02  # the longest sleep between two polls of the Store
PF_EXITING = 0x4  # /proc/<pid>/stat flags: the process is in exit (closing its files, the GPU's among them)


@dataclass(frozen=True)
class RankIdentity:
    """Who a rank's process is; a pid means something only within one host's boot and pid namespace."""

    rank: int
    pid: int
    host: str
    boot_id: str
    pid_namespace: int
    start_ticks: int  # /proc/<pid>/stat field 22: a reused pid is another process

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes | str) -> RankIdentity:
        """A peer's identity as it published it; anything but these six fields of these types is refused."""
        doc = json.loads(data)
        kinds = {"rank": int, "pid": int, "host": str, "boot_id": str, "pid_namespace": int, "start_ticks": int}
        if (
            not isinstance(doc, dict)
            or set(doc) != set(kinds)
            or any(not isinstance(doc[k], t) or isinstance(doc[k], bool) for k, t in kinds.items())
        ):
            raise ValueError(f"not a rank identity: {str(data)[:80]}")
        return RankIdentity(**doc)

    def describe(self) -> str:
        return f"rank {self.rank} (pid {self.pid} on host {self.host})"


@dataclass(frozen=True)
class PeerStatus:
    """What a probe found out about one peer rank."""

    rank: int
    state: State
    identity: RankIdentity | None

    def describe(self) -> str:
        return self.identity.describe() if self.identity else f"rank {self.rank}"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, flags, start time in clock ticks) of ``pid``, or None if /proc has no such process."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[6]), int(fields[19])


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def identity_of(rank: int) -> RankIdentity:
    """This process's identity as rank ``rank``."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return RankIdentity(
        rank,
        pid,
        socket.gethostname(),
        _read("/proc/sys/kernel/random/boot_id"),
        _pid_namespace(),
        stat[2] if stat else 0,
    )


def probe(peer: RankIdentity, here: RankIdentity) -> State:
    """Whether ``peer``'s process is alive, as seen from the process ``here``; "remote" where pids do not compare."""
    if (peer.host, peer.boot_id, peer.pid_namespace) != (here.host, here.boot_id, here.pid_namespace):
        return "remote"
    try:
        os.kill(peer.pid, 0)
    except ProcessLookupError:
        return "exited"
    except PermissionError:
        pass  # it exists and belongs to another user
    stat = _proc_stat(peer.pid)
    if stat is None:
        return "exited" if Path("/proc/self/stat").exists() else "alive"
    state, flags, ticks = stat
    if state in ("Z", "X", "x") or flags & PF_EXITING or (peer.start_ticks and ticks != peer.start_ticks):
        return "exited"  # a zombie, a process tearing down (its GPU context can take seconds), or a reused pid
    return "alive"


def _names(statuses: list[PeerStatus]) -> str:
    return ", ".join(s.describe() for s in statuses)


def failure(
    rank: int,
    where: str,
    statuses: list[PeerStatus],
    waited_s: float,
    threadblock: int = -1,
    op: int = -1,
    peer: int | None = None,
) -> ExecutorTimeout:
    """The error for rank ``rank``'s wait at ``where`` that the ranks in ``statuses`` never answered.

    PeerLost when one of them exited, or cannot be checked (another host, or never joined); ExecutorTimeout
    when every one of them is alive (it runs something else, or waits elsewhere).
    """
    exited = [s for s in statuses if s.state == "exited"]
    if exited:
        return PeerLost(
            f"executor: {_names(exited)} exited while rank {rank} waited at {where}",
            rank,
            threadblock,
            op,
            peer,
            tuple(s.rank for s in exited),
        )
    silent = [s for s in statuses if s.state in ("remote", "unjoined")]
    if silent:
        why = "; ".join(f"{s.describe()} {_why_unknown(s.state)}" for s in silent)
        return PeerLost(
            f"executor: {_names(silent)} did not respond within {waited_s:g} s while rank {rank} "
            f"waited at {where}: {why}",
            rank,
            threadblock,
            op,
            peer,
            tuple(s.rank for s in silent),
        )
    return ExecutorTimeout(
        f"executor: rank {rank}: {_names(statuses)} did not reach {where} within {waited_s:g} s "
        "but is alive (it runs another plan or code path)",
        rank,
        threadblock,
        op,
        peer,
    )


def store_failure(rank: int, where: str, statuses: list[PeerStatus], error: Exception) -> ExecutorTimeout:
    """The error for a Store that failed during rank ``rank``'s wait at ``where`` (its host may have died)."""
    exited = [s for s in statuses if s.state == "exited"]
    if exited:
        return failure(rank, where, exited, 0.0)
    text = str(error).strip()
    alive = [s for s in statuses if s.state == "alive"]
    unchecked = [s for s in statuses if s.state != "alive"]
    return ExecutorTimeout(
        f"executor: rank {rank}: the store failed during {where}: "
        f"{text.splitlines()[0] if text else type(error).__name__}"
        + (f"; alive: {_names(alive)}" if alive else "")
        + (f"; not checked: {_names(unchecked)}" if unchecked else ""),
        rank,
    )


def _why_unknown(state: State) -> str:
    if state == "remote":
        return "runs on another host, so whether it exited cannot be checked"
    return "never published its identity (it died before creating its communicator, or runs other code)"


@dataclass
class Roster:
    """The ranks of one communicator as this rank knows them; identities are cached once read, so a dead
    Store host can still be named."""

    store: Any
    prefix: str
    me: RankIdentity
    world_size: int
    known: dict[int, RankIdentity] = field(default_factory=dict)

    @classmethod
    def join(cls, store: Any, prefix: str, rank: int, world_size: int) -> Roster:
        """Publish this process's identity under ``prefix`` and return the roster it belongs to."""
        me = identity_of(rank)
        store.set(f"{prefix}/identity/{rank}", me.to_json())
        return cls(store, prefix, me, world_size, {rank: me})

    def learn(self) -> None:
        """Read the identities not yet known, without waiting; a Store that fails leaves the cache as it is."""
        for r in range(self.world_size):
            if r in self.known:
                continue
            key = f"{self.prefix}/identity/{r}"
            try:
                if self.store.check([key]):
                    self.known[r] = RankIdentity.from_json(self.store.get(key))
            except Exception:  # noqa: BLE001 - the Store's own types (DistStoreError, RuntimeError, OSError)
                return

    def statuses(self, ranks: list[int]) -> list[PeerStatus]:
        self.learn()
        return [
            PeerStatus(r, probe(self.known[r], self.me) if r in self.known else "unjoined", self.known.get(r))
            for r in ranks
        ]

    def others(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.me.rank]

    def raise_if_lost(self, where: str, threadblock: int = -1, op: int = -1, peer: int | None = None) -> None:
        """Raise PeerLost if another rank's process has exited (after this rank's wait at ``where`` timed out)."""
        exited = [s for s in self.statuses(self.others()) if s.state == "exited"]
        if exited:
            raise failure(self.me.rank, where, exited, 0.0, threadblock, op, peer)

    def all_gather(self, key: str, value: Any, timeout_s: float) -> list[Any]:
        """Every rank's ``value`` for ``key``, in rank order; PeerLost as soon as a missing peer has exited,
        and after ``timeout_s`` a PeerLost or ExecutorTimeout that says what each missing peer is doing."""
        keys = [f"{key}/{r}" for r in range(self.world_size)]
        where = f"bootstrap exchange {key!r}"
        try:
            self.store.set(keys[self.me.rank], encode(value))
            self._await(keys, where, timeout_s)
            values = [decode(self.store.get(k), f"rank {r} at {where}") for r, k in enumerate(keys)]
        except (ExecutorTimeout, ExecutorError):
            raise
        except Exception as e:  # noqa: BLE001 - the Store's own types (DistStoreError, RuntimeError, OSError)
            raise store_failure(self.me.rank, where, self.statuses(self.others()), e) from None
        if len(self.known) < self.world_size:
            self.learn()
        return values

    def _await(self, keys: list[str], where: str, timeout_s: float) -> None:
        start = time.monotonic()
        pause, next_probe = 0.0005, start + PROBE_EVERY_S
        while not self.store.check(keys):
            now = time.monotonic()
            if now >= next_probe or now - start >= timeout_s:
                self._probe_missing(keys, where, timeout_s, now - start >= timeout_s)
                next_probe = now + PROBE_EVERY_S
            time.sleep(pause)
            pause = min(2 * pause, MAX_PAUSE_S)

    def _probe_missing(self, keys: list[str], where: str, timeout_s: float, expired: bool) -> None:
        """Raise if a rank that has not arrived has exited, or if the wait's bound has passed."""
        statuses = self.statuses([r for r, k in enumerate(keys) if not self.store.check([k])])
        if statuses and (expired or any(s.state == "exited" for s in statuses)):
            raise failure(self.me.rank, where, statuses, timeout_s)
