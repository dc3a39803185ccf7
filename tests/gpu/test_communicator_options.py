"""The Communicator's launch options checked before anything starts (torch on the CPU is enough): a wrong one is
the caller's error in one line, not a silent fall back to NCCL."""

from __future__ import annotations

import pytest


def test_a_communicator_refuses_a_cluster_below_one_instead_of_falling_back_to_nccl():
    pytest.importorskip("torch")
    from executor import Communicator

    with pytest.raises(ValueError, match="cluster 0: a cluster holds 1 block or more") as e:
        Communicator.from_process_group(cluster=0)  # before any process group is asked
    assert "\n" not in str(e.value)
