"""weftcore.rendezvous: rendezvous ports outside the kernel's ephemeral range, and never one that is taken."""

from __future__ import annotations

import socket

import pytest

from weftcore.rendezvous import ephemeral_range, rendezvous_port


def test_the_port_is_below_or_above_the_ephemeral_range_and_binds(tmp_path):
    spec = tmp_path / "range"
    spec.write_text("32768\t60999\n")
    for _ in range(50):
        port = rendezvous_port(path=spec)
        assert 10000 <= port < 32768 or port > 60999
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_handed_out(tmp_path):
    spec = tmp_path / "range"
    spec.write_text("10001 65535\n")  # one port left outside the range: 10000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 10000))
        s.listen()
        with pytest.raises(OSError, match="no free port"):
            rendezvous_port(path=spec, tries=20)
    assert rendezvous_port(path=spec) == 10000


def test_an_unreadable_range_reads_as_linux_default(tmp_path):
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
    (tmp_path / "bad").write_text("x")
    assert ephemeral_range(tmp_path / "bad") == (32768, 60999)


def test_a_ranks_environment_names_its_rendezvous_and_turns_multicast_off():
    import doctest

    import weftcore.rendezvous as rendezvous

    assert doctest.testmod(rendezvous).failed == 0
    env = rendezvous.rank_env(3, 4, 12345)
    assert env == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "3",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "12345",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    assert rendezvous.rank_env(3, 4, "12345", local_rank=0)["LOCAL_RANK"] == "0"
