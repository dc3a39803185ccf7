"""bench/norm_peers.py --plans: the named registry plans the fused call can run, with their modes, and a one-line
reason for each it cannot, the Communicator's own pin left as it was (a fake Communicator: no GPU, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from _bench import bench_script


@dataclass
class FakeComm:
    """Pins as Communicator.pin_norm_plan does: ValueError for a plan that cannot run the call."""

    names: list[str]
    cannot: dict[str, str]
    pinned: object = None
    history: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.choice = SimpleNamespace(entries=[SimpleNamespace(plan=SimpleNamespace(name=n)) for n in self.names])

    def pin_norm_plan(self, nbytes, dtype, rows, plan, mode=None):
        self.history.append(plan and plan.name)
        if plan is not None and plan.name in self.cannot:
            raise ValueError(f"weft: cannot pin {plan.name} for the fused norm: {self.cannot[plan.name]}\nmore")
        self.pinned = plan

    def norm_mode_for(self, nbytes, dtype, rows):
        return f"mode of {self.pinned.name}"


def test_named_plans_come_with_their_modes_and_the_others_with_one_line_each():
    named = bench_script("norm_peers")._named
    comm = FakeComm(["a", "b", "c", "chosen"], {"b": "its rows do not fit"})
    found, refused = named(comm, ["a", "b", "missing", "chosen", "c"], 4096, "bf16", "rows", {"chosen"})
    assert [(p.name, how) for p, how in found] == [("a", "mode of a"), ("c", "mode of c")]
    assert refused == {
        "weft:b": "weft: cannot pin b for the fused norm: its rows do not fit",
        "weft:missing": "no such plan among the registry's for this fabric",
    }
    assert comm.history == ["a", None, "b", None, "c", None]  # every pin undone, the refused one too
    assert named(FakeComm([], {}), ["a"], 4096, "bf16", "rows", set())[1] == {
        "weft:a": "no such plan among the registry's for this fabric"
    }
