"""Core types: collectives' pre/post-conditions, the schedule format, sizes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules.collectives import NAMES, Collective, CollectiveError
from schedules.schedule import Schedule, ScheduleError, Send, Step, dumps_schedule, parse_schedule
from weft.units import SizeError, format_bytes, parse_bytes, parse_size_range


@pytest.mark.parametrize("name", NAMES)
def test_buffers_hold_exactly_the_pre_and_postconditions(name):
    c = Collective(name, 4, 2, root=1)
    for r in range(4):
        assert c.precondition(r) <= set(c.input_map(r)) or c.precondition(r) == set()
        assert c.postcondition(r) <= set(c.output_map(r))
        assert max(len(c.input_map(r)), len(c.output_map(r))) == c.size_chunks
    every = set().union(*(c.precondition(r) for r in range(4)))
    assert every == set(range(c.nchunks))


def test_alltoall_sends_each_block_from_its_source_to_its_destination():
    c = Collective("alltoall", 3, 1)
    chunk = (2 * 3 + 0) * 1  # from rank 2 to rank 0
    assert chunk in c.precondition(2) and chunk in c.postcondition(0)
    assert chunk not in c.postcondition(1)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"name": "allscatter", "nranks": 4}, "unknown collective"),
        ({"name": "allgather", "nranks": 4, "chunks": 0}, "chunks"),
        ({"name": "broadcast", "nranks": 4, "root": 4}, "root 4"),
    ],
)
def test_bad_collectives_are_refused_with_the_field(kwargs, field):
    with pytest.raises(CollectiveError, match=field):
        Collective(**kwargs)


sends = st.builds(Send, st.integers(0, 7), st.integers(0, 3), st.integers(0, 3), st.sampled_from(["copy", "reduce"]))
schedules = st.builds(
    lambda steps, name: Schedule(Collective("allreduce", 4, 2), "topo-abc", tuple(steps), name),
    st.lists(st.builds(Step, st.integers(1, 4), st.lists(sends, max_size=6).map(tuple)), max_size=5),
    st.text("abcxyz-", max_size=8),
)


@settings(max_examples=60, deadline=None)
@given(schedules)
def test_schedule_json_round_trips_with_its_hash(schedule):
    text = dumps_schedule(schedule)
    back = parse_schedule(json.loads(text), "s.json")
    assert back == schedule and back.content_hash == schedule.content_hash


def test_an_edited_schedule_file_is_caught_by_its_hash():
    s = Schedule(Collective("allgather", 2), "topo-x", (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),))
    doc = json.loads(dumps_schedule(s))
    doc["steps"][0]["sends"][0][2] = 0
    with pytest.raises(ScheduleError, match="hash"):
        parse_schedule(doc, "s.json")


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d.update(format="weft.schedule/9"), "format"),
        (lambda d: d["steps"][0].update(rounds=0), "steps[0].rounds"),
        (lambda d: d["steps"][0]["sends"][0].__setitem__(0, 99), "steps[0].sends[0].chunk"),
        (lambda d: d["steps"][0]["sends"][0].__setitem__(2, 5), "steps[0].sends[0].dst"),
        (lambda d: d["steps"][0]["sends"][0].__setitem__(3, "move"), "steps[0].sends[0].op"),
    ],
)
def test_malformed_schedules_name_the_field(mutate, field):
    s = Schedule(Collective("allgather", 2), "topo-x", (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),))
    doc = json.loads(dumps_schedule(s))
    doc.pop("hash")
    mutate(doc)
    with pytest.raises(ScheduleError) as err:
        parse_schedule(doc, "s.json")
    assert field in str(err.value) and "s.json" in str(err.value) and "\n" not in str(err.value)


def test_sizes_read_and_print_like_nccl_tests():
    assert parse_bytes("4MB") == 4 << 20 and parse_bytes("3MB+48") == (3 << 20) + 48
    assert parse_size_range("1KB:8KB") == [1024, 2048, 4096, 8192]
    assert format_bytes(1 << 30) == "1GB" and format_bytes(1000) == "1000B"
    with pytest.raises(SizeError):
        parse_bytes("four megabytes")
