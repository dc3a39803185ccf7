"""executor.gpu.clocks: NVML's violation counters read per policy (a policy the GPU does not count left out), the
time each grew between two readings, and a reader that is None wherever NVML cannot answer."""

from __future__ import annotations

from dataclasses import dataclass

from executor.gpu.clocks import POLICIES, grown, violation_reader, violations


@dataclass
class _Time:
    violationTime: int  # noqa: N815 (NVML's field name)


class _NotSupported(Exception):
    pass


class FakeNvml:
    """pynvml's three functions the reader calls, answering from counters the test moves."""

    def __init__(self, counters: dict[int, int], uuids: tuple[str, ...] = ("GPU-415aff52",)):
        self.counters, self.uuids, self.inits = counters, uuids, 0

    def nvmlInit(self) -> None:  # noqa: N802 (NVML's names)
        self.inits += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802
        if uuid not in self.uuids:
            raise _NotSupported(f"no GPU {uuid}")
        return uuid

    def nvmlDeviceGetViolationStatus(self, handle: str, policy: int) -> _Time:  # noqa: N802
        if policy not in self.counters:
            raise _NotSupported("not supported")
        return _Time(self.counters[policy])


def test_each_counted_policy_is_read_by_name_and_the_others_are_left_out():
    nvml = FakeNvml({POLICIES["power"]: 5_000, POLICIES["thermal"]: 0, POLICIES["base_clocks"]: 7})
    assert violations(nvml, "GPU-415aff52") == {"power": 5_000, "thermal": 0, "base_clocks": 7}


def test_the_reader_takes_torchs_uuid_with_or_without_nvmls_prefix_and_counts_what_grew():
    nvml = FakeNvml({POLICIES["power"]: 1_000, POLICIES["board_limit"]: 20})
    for uuid in ("415aff52", "GPU-415aff52"):
        read = violation_reader(uuid, nvml)
        assert read is not None
        before = read()
        nvml.counters[POLICIES["power"]] += 12_345
        assert grown(before, read()) == {"power": 12_345, "board_limit": 0}


def test_no_reader_where_nvml_cannot_answer():
    assert violation_reader("0b0466f6", FakeNvml({0: 1})) is None  # no such GPU
    assert violation_reader("", FakeNvml({0: 1})) is None  # torch gave no uuid


def test_grown_keeps_only_the_policies_both_readings_have():
    assert grown({"power": 1, "thermal": 2}, {"power": 4, "sync_boost": 9}) == {"power": 3}
