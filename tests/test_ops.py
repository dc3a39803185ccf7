"""The op table (schedules/ops.py) is the one statement of what each op means, and the kernel's tables follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor.gpu import tables as gpu_tables
from schedules.ops import DEVICE_KINDS, OPS
from schedules.plan import types as plan_module
from schedules.plan.io import load_plan, parse_plan
from schedules.plan.types import PlanError, channel_pairs

ROOT = Path(__file__).parent


def test_kernel_args_follow_the_layout_and_types():
    values = {name: k + 1 for k, (name, _) in enumerate(gpu_tables.KERNEL_PARAMS)}
    args = gpu_tables.kernel_args(**values)
    assert [int(a) for a in args] == list(range(1, len(values) + 1))
    assert [type(a).__name__ for a in args][-5:] == ["uint64", "int32", "int64", "int32", "int32"]
    swapped = gpu_tables.with_kernel_args(args, tb_start=99)
    assert int(swapped[1]) == 99 and swapped[0] == args[0]
    with pytest.raises(Exception, match="missing or unknown"):
        gpu_tables.kernel_args(**{k: v for k, v in values.items() if k != "rank"})
    traced = gpu_tables.kernel_args(**values, trace=1234)  # a -DWEFT_TRACE build's extra parameter comes last
    assert traced[:-1] == args and int(traced[-1]) == 1234 and type(traced[-1]).__name__ == "uint64"


def test_derived_op_sets():
    assert {"ppkt", "rppkt", "upkt", "cpkt", "repkt", "respkt", "recpkt", "recspkt"} == plan_module.PACKET_OPS
    assert {
        "signal",
        "wait",
        "rlxsignal",
        "rlxwait",
        "flush",
        "put",
        "pws",
        "pwsf",
        "get",
        "res",
        "rre",
        "rres",
        "ppkt",
        "rppkt",
        "respkt",
        "recspkt",
    } == plan_module.CHANNEL_OPS
    assert {n for n, s in OPS.items() if s.local_only} == {"copy", "re", "upkt", "cpkt", "repkt", "recpkt"}
    assert all(spec.device in DEVICE_KINDS for spec in OPS.values())


@pytest.mark.parametrize(
    "name,srcs,dsts,nch,msg",
    [
        ("put", [(True, 1)], [(True, 1)], 1, "reads local src_buff entries and writes remote dst_buff entries"),
        ("get", [(False, 1)], [(False, 1)], 0, "reads remote src_buff entries and writes local dst_buff entries"),
        ("res", [(True, 1)], [(False, 1)], 1, "reads local src_buff entries only"),
        ("copy", [(False, 1)], [(True, 1)], 0, "local buffers only"),
        ("copy", [(False, 1)], [(False, 2)], 0, "differs from src_buff"),
        ("repkt", [(False, 1)], [(False, 1)], 0, "at least one packet entry"),
        ("rre", [(True, 1)], [(True, 1)], 2, "at least one local dst_buff"),
        ("put", [(False, 1)], [(True, 1)], 2, "needs 1 channel id"),
        ("pws", [(False, 1)], [(True, 1)], 0, "needs 1 channel id"),
        ("signal", [], [], 0, "needs 1 channel id"),
        ("sem_release", [], [], 0, "semaphore id"),
    ],
)
def test_shape_errors_come_from_the_table(name, srcs, dsts, nch, msg):
    assert msg in OPS[name].shape_error(srcs, dsts, nch, 0)[1]


def test_signal_on_an_unpaired_channel_is_one_plan_error():
    # MSCCL++ lets a channel end go unlisted on the peer (its executor makes the missing end); weft refuses only a
    # signal or wait through such an end, since nothing listed pairs with it
    signal = {"name": "signal", "channel_type": "memory", "channel_ids": [1]}
    doc = {
        "name": "x",
        "collective": "allgather",
        "protocol": "Simple",
        "gpus": [
            {
                "id": r,
                "input_chunks": 1,
                "output_chunks": 2,
                "channels": [{"channel_type": "memory", "connected_to": [1 - r] * (r + 1)}],
                "threadblocks": [
                    {
                        "id": 0,
                        "ops": [signal] * r,
                        "channels": [{"channel_type": "memory", "channel_ids": list(range(r + 1))}],
                    }
                ],
            }
            for r in range(2)
        ],
    }
    with pytest.raises(PlanError, match=r"x.json: gpus: .*channel 1 to rank 0 has no matching channel on rank 0"):
        parse_plan(doc, "x.json")


def test_pairs_are_symmetric():
    pairs = channel_pairs(load_plan(ROOT / "gpu" / "plans" / "allreduce-twoshot-simple-x8.json"))
    for (rank, cid), (peer, back) in pairs.items():
        assert pairs[(peer, back)] == (rank, cid)
