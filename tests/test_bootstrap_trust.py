"""Trust on the GPU path: values between ranks are plain data, never pickles; cached kernels are checked."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from executor.errors import ExecutorError
from executor.gpu import bootstrap as gpu_bootstrap
from executor.gpu import build
from executor.gpu.bootstrap import decode, encode
from executor.gpu.ipc import SharedBuffer
from executor.gpu.liveness import RankIdentity, Roster


class DictStore:
    """torch.distributed.Store's set, get, check and wait over a dict (every key already there)."""

    def __init__(self):
        self.values: dict[str, bytes] = {}

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.values[key]

    def check(self, keys):
        return all(k in self.values for k in keys)

    def wait(self, keys, timeout):
        assert self.check(keys)


class Exploit:
    """A pickle that, once loaded, writes a file: what anyone reaching the Store's port could send."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (self.target, "ran"))


EXCHANGED = [
    None,
    "",
    "cannot export",
    True,
    3,
    2.5,
    float("inf"),
    b"\x00\xff" * 32,
    ("f" * 16, 4096, {"i": SharedBuffer(b"h" * 64, 128), "o": SharedBuffer(b"o" * 64, 0)}, True, False),
    [("abc", 64, {"s": SharedBuffer(b"s" * 64, 8)}), ("def", 128, "why not")],
    ("topo-0123456789abcdef", ["allgather-2r-aaaa", "allreduce-2r-bbbb"]),
]


@pytest.mark.parametrize("value", EXCHANGED)
def test_every_value_the_executor_exchanges_round_trips_as_json(value):
    data = encode(value)
    assert b"\x80" not in data[:2]  # not a pickle
    assert decode(data) == value
    assert type(decode(data)) is type(value)


def test_a_pickle_in_the_store_is_refused_and_never_run(tmp_path):
    target = tmp_path / "pwned"
    store = DictStore()
    store.set("k/1", pickle.dumps(Exploit(target)))
    with pytest.raises(ExecutorError, match="rank 1 at 'k': not weft's plain data"):
        gpu_bootstrap.all_gather(store, "k", 0, 2, "mine", 1.0)
    assert not target.exists()


def test_a_pickle_through_the_roster_is_refused_and_never_run(tmp_path):
    target = tmp_path / "pwned"
    store = DictStore()
    roster = Roster.join(store, "weft/1", 0, 2)
    store.set("weft/1/x/1", pickle.dumps(Exploit(target)))
    with pytest.raises(ExecutorError, match="not weft's plain data"):
        roster.all_gather("weft/1/x", ("mine", 1), 1.0)
    assert not target.exists()


@pytest.mark.parametrize(
    "data",
    [
        b'{"d": {"a": 1}, "x": 2}',
        b'{"obj": "os.system"}',
        b"[" * 100_000,
        b'{"f": "nan", "g": 1}',
        b'{"ipc": "!!", "offset": 0}',
        b"1" * 5000,
    ],
)
def test_malformed_plain_data_is_one_error(data):
    with pytest.raises(ExecutorError, match="bootstrap value"):
        decode(data)


def test_a_rank_identity_with_unknown_fields_is_refused():
    good = RankIdentity(0, 1, "h", "b", 2, 3)
    assert RankIdentity.from_json(good.to_json()) == good
    with pytest.raises(ValueError):
        RankIdentity.from_json(b'{"rank": 0, "__class__": 1}')


@pytest.fixture
def fake_nvcc(monkeypatch):
    """nvcc replaced by a writer of known bytes, counting its runs (the cache logic is what is tested)."""
    runs = []

    def run(command, **_):
        output = Path(command[command.index("-o") + 1])
        output.write_bytes(b"CUBIN-%d" % len(runs))
        runs.append(command)
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(build.subprocess, "run", run)
    return runs


def test_the_kernel_cache_is_private_and_each_cubin_has_its_hash(tmp_path, fake_nvcc):
    cache = tmp_path / "kernels"
    path = build.build_cubin("sm_90", cache)
    assert cache.stat().st_mode & 0o777 == 0o700
    assert build.cached_cubin(path) == b"CUBIN-0"
    assert build.build_cubin("sm_90", cache) == path and len(fake_nvcc) == 1  # cached, checked, reused


@pytest.mark.parametrize("tamper", ["bytes", "hash", "no hash"])
def test_a_tampered_cubin_is_never_loaded_but_built_again(tmp_path, fake_nvcc, tamper):
    cache = tmp_path / "kernels"
    path = build.build_cubin("sm_90", cache)
    digest = path.with_name(path.name + ".sha256")
    if tamper == "bytes":
        path.write_bytes(b"EVIL")
    elif tamper == "hash":
        digest.write_text("0" * 64)
    else:
        digest.unlink()
    assert build.cached_cubin(path) is None
    assert build.build_cubin("sm_90", cache) == path and len(fake_nvcc) == 2
    assert build.cached_cubin(path) == b"CUBIN-1"


def test_a_kernel_cache_others_can_write_is_refused(tmp_path, fake_nvcc):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(ExecutorError, match="writable by other users"):
        build.build_cubin("sm_90", cache)
    assert fake_nvcc == []


# torch.distributed's object collectives pickle on one rank and unpickle on the others: any of them on the GPU path
# would undo the plain-data rule above (weft bench and weft run once gathered their checks and medians that way).
UNPICKLING = re.compile(
    r"\b(all_gather_object|gather_object|broadcast_object_list|scatter_object_list|"
    r"send_object_list|recv_object_list)\s*\(|\bimport pickle\b|\bpickle\.loads?\(|"
    r"\btorch\.load\(|\bUnpickler\b"
)


@pytest.mark.parametrize("folder", ["executor", "weft", "bench", "examples"])
def test_nothing_on_the_gpu_path_unpickles_what_another_rank_sent(folder):
    root = Path(__file__).resolve().parents[1] / folder
    found = [
        f"{path.relative_to(root.parent)}:{n}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if UNPICKLING.search(line)
    ]
    assert found == []


class ExchangingComm:
    """A communicator of ``world_size`` ranks whose exchange goes through the same JSON as the store's."""

    def __init__(self, values_of_others: list):
        self.world_size, self.others = len(values_of_others) + 1, values_of_others
        self.calls: list[object] = []

    def exchange(self, what, value):
        self.calls.append(what)
        return [decode(encode(v)) for v in (value, *self.others)]


def test_bench_agrees_on_refusals_and_slowest_medians_through_plain_data():
    from executor.gpu.bench import _refused_anywhere, _slowest_rank

    comm = ExchangingComm([{"nccl": 9.5, "weft:a": 3.0}])
    assert _slowest_rank(comm, {"nccl": 8.0, "weft:a": 4.0}) == {"nccl": 9.5, "weft:a": 4.0}
    assert _refused_anywhere(ExchangingComm(["too many thread blocks"]), "")
    assert not _refused_anywhere(ExchangingComm([""]), "")
    assert comm.calls == ["bench-medians"]


class _Array(np.ndarray):
    """A numpy array with the few tensor methods all_gather_plain calls."""

    def to(self, device):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.view(__import__("numpy").ndarray)


def fake_torch(peer_values: list):
    """torch and torch.distributed, just enough for all_gather_plain: this rank is 0, and each peer's all_gather
    contribution is what its own all_gather_plain would send for its value."""
    import types

    import numpy as np

    arr = lambda a: np.asarray(a).view(_Array)  # noqa: E731
    torch = types.SimpleNamespace(
        int64=np.int64,
        uint8=np.uint8,
        device=lambda *a: a,
        cuda=types.SimpleNamespace(current_device=lambda: 0),
        tensor=lambda v, dtype, device: arr(np.array(v, dtype=dtype)),
        empty_like=lambda t: arr(np.empty_like(t)),
        zeros=lambda n, dtype, device: arr(np.zeros(n, dtype=dtype)),
        frombuffer=lambda b, dtype: arr(np.frombuffer(bytes(b), dtype=dtype)),
    )
    peers = [encode(v) for v in peer_values]

    def all_gather(out, mine, group=None):
        if mine.dtype == np.int64:
            values = [mine, *(arr(np.array([len(p)], dtype=np.int64)) for p in peers)]
        else:
            values = [mine, *(arr(np.frombuffer(p.ljust(len(mine), b"\0"), dtype=np.uint8)) for p in peers)]
        for slot, value in zip(out, values, strict=True):
            slot[...] = value

    dist = types.SimpleNamespace(
        get_world_size=lambda group=None: 1 + len(peers), get_backend=lambda group=None: "nccl", all_gather=all_gather
    )
    torch.distributed = dist
    return torch, dist


@pytest.mark.parametrize(
    "mine, theirs",
    [(("host-a/boot", "rank-id"), [("host-b/boot", "x" * 300)]), (True, [False, True]), (["e1", "e2"], ["why not"])],
)
def test_a_group_all_gather_moves_plain_json_bytes(monkeypatch, mine, theirs):
    import sys

    torch, dist = fake_torch(theirs)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    assert gpu_bootstrap.all_gather_plain(mine) == [mine, *theirs]


def test_a_pickle_through_a_group_all_gather_is_refused(monkeypatch, tmp_path):
    import sys

    torch, dist = fake_torch(["placeholder"])
    forged = pickle.dumps(Exploit(tmp_path / "ran"))
    monkeypatch.setattr(gpu_bootstrap, "encode", lambda value: forged if value == "bait" else encode(value))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    with pytest.raises(ExecutorError, match="not weft's plain data"):
        gpu_bootstrap.all_gather_plain("bait")  # this rank's own bytes come back as a pickle: refused, never run
    assert not (tmp_path / "ran").exists()
