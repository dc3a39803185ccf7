"""Peer liveness (executor/gpu/liveness.py) and the ``weft run --nproc`` launcher, with real processes that exit.

A rank that dies makes the others fail with a clear error naming it, not hang. The Store here is a directory
(torch.distributed.Store's set/get/check), so that child processes can publish into it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from slowdown import idle_s

from executor.errors import ExecutorTimeout, PeerLost
from executor.gpu import liveness
from executor.gpu.engine import InterpreterEngine
from executor.gpu.liveness import RankIdentity, Roster, identity_of, probe
from weft.cli import gpu as launcher
from weft.cli import main

HERE = Path(__file__).parent
ROOT = HERE.parent
PREFIX = "weft/1"
KEY = f"{PREFIX}/1/inbound"  # the first exchange of a communicator whose store prefix is PREFIX


class DirStore:
    """torch.distributed.Store's set, get and check over files, one per key."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key.replace("/", "%")

    def set(self, key: str, value: bytes | str) -> None:
        tmp = self.root / f".{os.getpid()}.tmp"
        tmp.write_bytes(value.encode() if isinstance(value, str) else value)
        os.replace(tmp, self._path(key))

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def check(self, keys: list[str]) -> bool:
        return all(self._path(k).exists() for k in keys)


class FailingStore(DirStore):
    """A store whose host went away: every call fails, as TCPStore's do when rank 0 dies."""

    def set(self, key, value):
        raise ConnectionResetError("Connection reset by peer")

    def get(self, key):
        raise ConnectionResetError("Connection reset by peer")

    def check(self, keys):
        raise ConnectionResetError("Connection reset by peer")


def child_main(root: str, behaviour: str) -> None:
    """Rank 1 of 2: join the roster in ``root``, then exit, stay, or arrive at exchange KEY."""
    roster = Roster.join(DirStore(root), PREFIX, 1, 2)
    if behaviour == "exit":
        os._exit(3)
    if behaviour == "arrive":
        roster.all_gather(KEY, "from rank 1", 30)
        return
    time.sleep(120)  # "stay": alive until the test kills it


def start_rank1(store: DirStore, behaviour: str) -> subprocess.Popen:
    code = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(HERE)!r}]; "
        f"from test_liveness import child_main; child_main(sys.argv[1], sys.argv[2])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.root), behaviour])
    deadline = time.monotonic() + 30
    while not store.check([f"{PREFIX}/identity/1"]):
        assert proc.poll() is None or behaviour == "exit", f"rank 1 exited with {proc.returncode} before joining"
        assert time.monotonic() < deadline, "rank 1 never joined"
        time.sleep(0.01)
    return proc


def wait_exited_unreaped(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` has exited, leaving it a zombie (as a dead peer is to a rank that is not its parent)."""
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


@pytest.fixture()
def store(tmp_path) -> DirStore:
    return DirStore(tmp_path)


@pytest.fixture()
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


# ---------------------------------------------------------------- identities and probes


def test_identity_names_this_process():
    me = identity_of(3)
    assert (me.rank, me.pid, me.host) == (3, os.getpid(), socket.gethostname())
    if sys.platform.startswith("linux"):
        assert me.boot_id and me.pid_namespace and me.start_ticks > 0


def test_identity_round_trips_through_json():
    me = identity_of(0)
    assert RankIdentity.from_json(me.to_json()) == me
    assert me.describe() == f"rank 0 (pid {me.pid} on host {me.host})"


def test_a_running_peer_is_alive(store, procs):
    procs.append(start_rank1(store, "stay"))
    peer = RankIdentity.from_json(store.get(f"{PREFIX}/identity/1"))
    assert peer.pid == procs[0].pid
    assert probe(peer, identity_of(0)) == "alive"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux: zombies are read from /proc")
def test_a_peer_that_exited_is_exited_before_its_parent_reaps_it(store, procs):
    procs.append(start_rank1(store, "exit"))
    wait_exited_unreaped(procs[0])
    assert Path(f"/proc/{procs[0].pid}").exists()  # still a zombie: os.kill(pid, 0) alone would say alive
    assert probe(RankIdentity.from_json(store.get(f"{PREFIX}/identity/1")), identity_of(0)) == "exited"


def test_a_peer_that_exited_and_was_reaped_is_exited(store, procs):
    procs.append(start_rank1(store, "exit"))
    assert procs[0].wait(timeout=30) == 3
    assert probe(RankIdentity.from_json(store.get(f"{PREFIX}/identity/1")), identity_of(0)) == "exited"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux: start times are read from /proc")
def test_a_reused_pid_is_another_process():
    me = identity_of(0)
    assert probe(dataclasses.replace(me, rank=1, start_ticks=me.start_ticks + 1), me) == "exited"
    assert probe(dataclasses.replace(me, rank=1), me) == "alive"


def test_a_process_tearing_down_counts_as_exited(monkeypatch):
    """Between exit and zombie a process closes its files: its GPU context, and a TCPStore it hosts."""
    me = identity_of(0)
    peer = dataclasses.replace(me, rank=1)
    monkeypatch.setattr(liveness, "_proc_stat", lambda pid: ("D", liveness.PF_EXITING | 0x400000, me.start_ticks))
    assert probe(peer, me) == "exited"
    monkeypatch.setattr(liveness, "_proc_stat", lambda pid: ("D", 0x400000, me.start_ticks))
    assert probe(peer, me) == "alive"


@pytest.mark.parametrize(
    "field,value", [("host", "other-host"), ("boot_id", "another-boot"), ("pid_namespace", 4026531836 + 7)]
)
def test_a_peer_whose_pid_does_not_compare_is_remote(field, value):
    me = identity_of(0)
    assert probe(dataclasses.replace(me, rank=1, **{field: value}), me) == "remote"


# ---------------------------------------------------------------- bootstrap exchanges


def test_all_gather_returns_every_ranks_value_in_rank_order(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "arrive"))
    assert roster.all_gather(KEY, {"from": 0}, 30) == [{"from": 0}, "from rank 1"]
    assert procs[0].wait(timeout=30) == 0
    assert sorted(roster.known) == [0, 1]


def test_a_peer_that_exits_fails_the_exchange_at_once_naming_it(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "exit"))
    wait_exited_unreaped(procs[0])
    start = time.monotonic()
    with pytest.raises(PeerLost) as info:
        roster.all_gather(KEY, None, timeout_s=60)
    assert time.monotonic() - start < idle_s(5)  # found by probing, not by waiting out the 60 s bound
    assert str(info.value) == (
        f"executor: rank 1 (pid {procs[0].pid} on host {socket.gethostname()}) exited while "
        f"rank 0 waited at bootstrap exchange '{KEY}'"
    )
    assert info.value.lost == (1,) and info.value.rank == 0 and info.value.exit_code == 1
    assert isinstance(info.value, ExecutorTimeout)


def test_a_peer_that_never_joined_did_not_respond_within_the_bound(store):
    roster = Roster.join(store, PREFIX, 0, 2)
    start = time.monotonic()
    with pytest.raises(
        PeerLost,
        match=r"^executor: rank 1 did not respond within 0.6 s while rank 0 waited at "
        r"bootstrap exchange 'weft/1/1/inbound': rank 1 never published its identity",
    ):
        roster.all_gather(KEY, None, timeout_s=0.6)
    assert 0.6 <= time.monotonic() - start < 0.6 + idle_s(2.4)


def test_a_live_peer_that_does_not_arrive_is_a_timeout_not_a_lost_peer(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "stay"))
    start = time.monotonic()
    with pytest.raises(
        ExecutorTimeout,
        match=r"did not reach bootstrap exchange 'weft/1/1/inbound' within 0.6 s but is "
        r"alive",
    ) as info:
        roster.all_gather(KEY, None, timeout_s=0.6)
    assert not isinstance(info.value, PeerLost)
    assert 0.6 <= time.monotonic() - start < 0.6 + idle_s(2.4)


def test_a_peer_on_another_host_that_does_not_arrive_is_lost_after_the_bound(store):
    roster = Roster.join(store, PREFIX, 0, 2)
    remote = dataclasses.replace(roster.me, rank=1, pid=4242, host="node7")
    store.set(f"{PREFIX}/identity/1", remote.to_json())
    with pytest.raises(
        PeerLost,
        match=r"^executor: rank 1 \(pid 4242 on host node7\) did not respond within 0.4 s "
        r".*runs on another host",
    ) as info:
        roster.all_gather(KEY, None, timeout_s=0.4)
    assert info.value.lost == (1,)


def test_a_dead_store_host_is_named_from_the_identities_read_before(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "exit"))
    roster.learn()
    assert procs[0].wait(timeout=30) == 3
    roster.store = FailingStore(store.root)
    with pytest.raises(
        PeerLost,
        match=rf"^executor: rank 1 \(pid {procs[0].pid} on host .*\) exited while rank 0 "
        r"waited at bootstrap exchange",
    ):
        roster.all_gather(KEY, None, timeout_s=30)


def test_a_failing_store_with_every_peer_alive_says_the_store_failed(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "stay"))
    roster.learn()
    roster.store = FailingStore(store.root)
    with pytest.raises(
        ExecutorTimeout,
        match=r"^executor: rank 0: the store failed during bootstrap exchange "
        r"'weft/1/1/inbound': Connection reset by peer; alive: rank 1 \(pid",
    ) as info:
        roster.all_gather(KEY, None, timeout_s=30)
    assert not isinstance(info.value, PeerLost)


# ---------------------------------------------------------------- after a kernel's wait timed out


def test_a_kernel_wait_on_a_dead_peer_names_it_and_where_this_rank_waited(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "exit"))
    wait_exited_unreaped(procs[0])
    with pytest.raises(PeerLost) as info:
        roster.raise_if_lost("threadblock 0, op 2: wait on a channel 0 (peer rank 1)", 0, 2, 1)
    assert str(info.value) == (
        f"executor: rank 1 (pid {procs[0].pid} on host {socket.gethostname()}) exited while "
        "rank 0 waited at threadblock 0, op 2: wait on a channel 0 (peer rank 1)"
    )
    e = info.value
    assert (e.rank, e.threadblock, e.op, e.peer, e.lost) == (0, 0, 2, 1, (1,))


def test_a_kernel_wait_with_every_peer_alive_leaves_the_timeout_to_recovery(store, procs):
    roster = Roster.join(store, PREFIX, 0, 2)
    procs.append(start_rank1(store, "stay"))
    roster.raise_if_lost("threadblock 0, op 0: wait on a channel 0 (peer rank 1)", 0, 0, 1)
    assert roster.statuses([1])[0].state == "alive"


# ---------------------------------------------------------------- the communicator's two hook points


def bare_communicator(store: DirStore) -> InterpreterEngine:
    """Rank 0 of 2 without a GPU: only what the exchanges and the device-error path read."""
    comm: Any = InterpreterEngine.__new__(InterpreterEngine)  # a bare executor: the test sets the fields it reads
    comm.rank, comm.world_size, comm.timeout_s, comm.store = 0, 2, 3.0, store
    comm._prefix, comm._keys = PREFIX, 0
    comm._contexts = {"ctx": SimpleNamespace(tables=SimpleNamespace(channel_peers=[1]))}
    return comm


def test_the_communicators_first_exchange_publishes_its_identity(store, procs):
    comm = bare_communicator(store)
    procs.append(start_rank1(store, "arrive"))
    assert comm._all_gather("inbound", "from rank 0") == ["from rank 0", "from rank 1"]
    assert RankIdentity.from_json(store.get(f"{PREFIX}/identity/0")) == identity_of(0)


def test_the_communicators_exchange_fails_when_its_peer_exits(store, procs):
    comm = bare_communicator(store)
    procs.append(start_rank1(store, "exit"))
    with pytest.raises(
        PeerLost,
        match=rf"^executor: rank 1 \(pid {procs[0].pid} on host .*\) exited while rank 0 "
        r"waited at bootstrap exchange 'weft/1/1/inbound'$",
    ):
        comm._all_gather("inbound", None)


def test_a_device_timeout_on_a_dead_peer_raises_peer_lost_before_recovery(store, procs):
    comm = bare_communicator(store)
    comm._roster = Roster.join(store, PREFIX, 0, 2)
    comm._error = np.array([1, 1, 0, 0, 2, 0, 0, 0], np.int32)  # flag, wait on a channel, rank 0, tb 0, op 2, channel 0
    procs.append(start_rank1(store, "exit"))
    wait_exited_unreaped(procs[0])
    with pytest.raises(PeerLost) as info:
        comm._raise_device_error()  # recovery would need CuPy: it must not be reached
    assert str(info.value) == (
        f"executor: rank 1 (pid {procs[0].pid} on host {socket.gethostname()}) exited while "
        "rank 0 waited at threadblock 0, op 2: wait on a channel 0 (peer rank 1)"
    )
    assert (info.value.threadblock, info.value.op, info.value.peer, info.value.lost) == (0, 2, 1, (1,))


# ---------------------------------------------------------------- the launcher

FAKE_RANK = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
out = sys.argv[1]
with open(os.path.join(out, f"rank{rank}"), "w") as f:
    f.write(" ".join([str(os.getpid()), os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], os.environ["MASTER_PORT"],
                      os.environ["NCCL_NVLS_ENABLE"]]))
action = dict(a.split("=") for a in sys.argv[2:]).get(str(rank), "ok")
if action == "ok":
    sys.exit(0)
if action.startswith("exit"):
    time.sleep(0.3)
    sys.exit(int(action[4:]))
if action == "kill":
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
if action == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(120)
"""


def fake_ranks(out: Path, *actions: str) -> list[str]:
    """A rank entry point; ``actions`` like '1=exit3' (exit 3), '0=hang', '1=kill' (SIGKILL), '0=stubborn'."""
    return [sys.executable, "-c", FAKE_RANK, str(out), *actions]


def pids(out: Path, n: int) -> list[int]:
    return [int((out / f"rank{r}").read_text().split()[0]) for r in range(n)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"


def test_ranks_that_all_succeed_exit_0_with_their_environment(tmp_path):
    assert launcher.launch_ranks(fake_ranks(tmp_path), 3) == 0
    fields = [(tmp_path / f"rank{r}").read_text().split() for r in range(3)]
    assert [f[1:3] for f in fields] == [["3", "0"], ["3", "1"], ["3", "2"]]
    assert len({f[3] for f in fields}) == 1 and all(f[4] == "0" for f in fields)  # one port; NVLS off


def test_a_rank_that_exits_nonzero_stops_the_others(tmp_path):
    start = time.monotonic()
    with pytest.raises(launcher.RankFailed) as info:
        launcher.launch_ranks(fake_ranks(tmp_path, "0=hang", "1=exit3", "2=hang"), 3)
    assert time.monotonic() - start < idle_s(10)
    assert str(info.value) == "rank 1 of 3 exited with code 3; stopped ranks 0, 2"
    assert info.value.exit_code == 3
    assert all(gone(p) for p in pids(tmp_path, 3))


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path):
    with pytest.raises(launcher.RankFailed) as info:
        launcher.launch_ranks(fake_ranks(tmp_path, "0=hang", "1=kill"), 2)
    assert str(info.value) == "rank 1 of 2 was killed by signal 9 (SIGKILL); stopped rank 0"
    assert info.value.exit_code == 128 + 9


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    start = time.monotonic()
    with pytest.raises(launcher.RankFailed, match="rank 1 of 2 exited with code 2; stopped rank 0"):
        launcher.launch_ranks(fake_ranks(tmp_path, "0=stubborn", "1=exit2"), 2, grace_s=1.0)
    assert 1.0 <= time.monotonic() - start < 1.0 + idle_s(7)
    assert gone(pids(tmp_path, 2)[0])


def test_the_launcher_leaves_sigterm_handling_as_it_found_it(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    assert launcher.launch_ranks(fake_ranks(tmp_path), 1) == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_weft_run_prints_one_line_naming_the_failed_rank(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(launcher, "_require_gpu_stack", lambda: None)
    monkeypatch.setattr(launcher, "_rank_command", lambda: fake_ranks(tmp_path, "0=hang", "1=exit3"))
    plan = HERE / "gpu" / "plans" / "allreduce-direct-simple-x1.json"
    assert main(["run", str(plan), "--nproc", "2", "--size", "1MB"]) == 3
    err = capsys.readouterr().err
    assert err == "weft: error: rank 1 of 2 exited with code 3; stopped rank 0\n"
    assert all(gone(p) for p in pids(tmp_path, 2))
