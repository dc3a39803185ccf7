"""The Lamport protocol: the sentinel mapping per dtype, the plan format, codegen, and the reference executor's model
of the sentinel, the rotation and the reset (back-to-back launches, racy resets refused)."""

import json
from dataclasses import replace

import numpy as np
import pytest

from codegen import CodegenError, compile_schedule
from codegen.msccl_xml import to_msccl_xml
from executor.reference.machine import PlanDeadlock, PlanRace, round_to
from executor.reference.prove import check_plan, expected_outputs, random_inputs, run_launches
from registry.store import Registry
from schedules.collectives import Collective
from schedules.lamport import SENTINEL_BITS, LamportBuffers, reset_race, to_wire, to_wire_bits
from schedules.plan.io import dumps_plan, parse_plan
from schedules.plan.types import PlanError
from synth.baselines import direct
from topologies.catalog import build
from weft.synthesis import synthesize


def _one_shot(n: int = 2, instances: int = 1):
    return compile_schedule(
        direct(build(f"fully_connected:n={n}"), Collective("allreduce", n)), instances=instances, protocol="lamport"
    )


# --- the sentinel and its mapping -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_sixteen_bit_mapping_changes_negative_zero_only(dtype):
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every fp16 / bf16 bit pattern
    mapped = to_wire_bits(every, dtype)
    changed = np.flatnonzero(mapped != every)
    assert changed.tolist() == [0x8000] and SENTINEL_BITS[dtype] == 0x8000
    assert mapped[0x8000] == 0  # -0.0 -> +0.0
    assert not (mapped == 0x8000).any()  # no sender ever writes the sentinel


def test_fp32_mapping_keeps_nan_payloads_and_every_other_pattern():
    rng = np.random.default_rng(0)
    nans = np.array([0x7FC00001, 0xFFC00001, 0x7F800001, 0xFFFFFFFF], np.uint32)  # quiet/signalling, both signs
    special = np.array([0x80000000, 0x00000000, 0x80000001, 0x7F800000, 0xFF800000], np.uint32)
    bits = np.concatenate([nans, special, rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)])
    mapped = to_wire_bits(bits, "fp32")
    negative_zero = bits == SENTINEL_BITS["fp32"]
    assert (mapped[: len(nans)] == nans).all() and mapped[len(nans)] == 0
    assert (mapped[negative_zero] == 0).all() and (mapped[~negative_zero] == bits[~negative_zero]).all()
    assert not (mapped == SENTINEL_BITS["fp32"]).any()


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_reference_mapping_on_float32_storage_agrees_with_each_dtypes_bits(dtype):
    # the reference holds fp16 and bf16 as float32; its mapping must be the dtype's own, bit for bit
    values = round_to(np.array([-0.0, 0.0, -1.5, 3.0, np.nan, -np.inf, 1e-8], np.float32), dtype)
    values[4] = np.float32(-np.nan)
    ours = to_wire(values)
    if dtype == "fp32":
        want = to_wire_bits(values.view(np.uint32), "fp32")
        assert (ours.view(np.uint32) == want).all()
    elif dtype == "fp16":
        want = to_wire_bits(values.astype(np.float16).view(np.uint16), "fp16")
        assert (ours.astype(np.float16).view(np.uint16) == want).all()
    else:
        want = to_wire_bits((values.view(np.uint32) >> 16).astype(np.uint16), "bf16")
        assert ((ours.view(np.uint32) >> 16).astype(np.uint16) == want).all()
    assert np.signbit(ours[0]) == False and ours[0] == 0  # noqa: E712 (numpy bool)


# --- the rotation rule --------------------------------------------------------------------------------------------


def test_three_buffers_reset_two_calls_ahead_clear_the_previous_calls_buffer():
    rotation = LamportBuffers()
    assert (rotation.buffers, rotation.reset_ahead) == (3, 2)
    assert [(rotation.used_by(c), rotation.reset_by(c)) for c in range(4)] == [(0, 2), (1, 0), (2, 1), (0, 2)]
    assert reset_race(rotation) == ""


@pytest.mark.parametrize(
    ("buffers", "ahead", "says"),
    [(2, 1, "2 buffers cannot rotate so"), (3, 1, "at least 2 calls ahead"), (3, 3, "must be below buffers")],
)
def test_a_rotation_whose_reset_could_race_is_named(buffers, ahead, says):
    assert says in reset_race(LamportBuffers(buffers, ahead))


# --- the plan format and codegen ----------------------------------------------------------------------------------


def test_a_lamport_plan_names_its_protocol_and_rotation_in_json():
    plan = _one_shot()
    doc = json.loads(dumps_plan(plan))
    assert doc["protocol"] == "Lamport" and doc["lamport"] == {"buffers": 3, "reset_ahead": 2}
    assert doc["use_double_scratch_buffer"] is False
    assert parse_plan(doc, "p.json") == plan
    assert plan.scratch_copies == 3 and plan.name.endswith("-lamport-x1")
    assert plan.accepts(plan.max_message_size) and plan.max_message_size == 4 << 20


def test_the_rotation_is_part_of_the_plan_hash():
    plan = _one_shot()
    assert replace(plan, lamport=LamportBuffers(4, 2)).content_hash != plan.content_hash


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.pop("lamport"), "lamport: missing"),
        (lambda d: d.update(protocol="LL"), "only a Lamport plan rotates"),
        (lambda d: d["lamport"].pop("reset_ahead"), "lamport.reset_ahead: missing"),
        (lambda d: d.update(use_double_scratch_buffer=True), "rotates its scratch by lamport.buffers"),
    ],
)
def test_malformed_lamport_fields_are_refused(edit, says):
    doc = json.loads(dumps_plan(_one_shot()))
    doc["weft"].pop("hash")
    edit(doc)
    with pytest.raises(PlanError, match=says):
        parse_plan(doc, "p.json")


def test_msccl_xml_and_double_scratch_refuse_lamport():
    schedule = direct(build("fully_connected:n=2"), Collective("allreduce", 2))
    with pytest.raises(CodegenError, match="Simple and LL only"):
        to_msccl_xml(schedule, protocol="lamport")
    with pytest.raises(CodegenError, match="three scratch buffers"):
        compile_schedule(schedule, protocol="lamport", double_scratch=True)


# --- the reference executor: back-to-back launches ----------------------------------------------------------------


def _inputs_with_negative_zeros(plan, elems, rng):
    """Random non-zero data, different every call, with -0.0 in about a quarter of the words (and, at word 0 of
    every rank, an element whose every contribution is -0.0)."""
    out = []
    for x in random_inputs(plan, elems, rng):
        x[rng.random(x.size) < 0.25] = -0.0
        x[0] = -0.0
        out.append(x)
    return out


@pytest.mark.parametrize(
    ("topology", "collective", "method"),
    [
        ("fully_connected:n=4", "allreduce", "direct"),
        ("fully_connected:n=4", "allreduce", "twoshot"),
        ("ring:n=4", "allreduce", "ring"),
        ("fully_connected:n=4", "allgather", "direct"),
        ("fully_connected:n=3", "broadcast", "direct"),
        ("hgx_h200:gpus=4", "scatter", "ring"),  # relays hold plain data in scratch, which the reset clears too
    ],
)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_synthesized_plans_run_back_to_back_with_negative_zeros(topology, collective, method, dtype):
    plan = compile_schedule(synthesize(topology, collective, method), instances=2, protocol="lamport")
    nbytes = 2 * plan.granule
    elems = plan.chunk_bytes(nbytes) // {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    rng = np.random.default_rng(7)
    launches = [_inputs_with_negative_zeros(plan, elems, rng) for _ in range(7)]  # every buffer reused twice
    spec = plan.collective_spec()
    for k, outputs in enumerate(run_launches(plan, launches, nbytes, dtype)):
        for r, want in enumerate(expected_outputs(spec, launches[k], elems, dtype)):
            got = outputs[r].reshape(-1, elems)
            for idx, chunk in want.items():
                assert np.array_equal(got[idx], chunk), (k, r, idx)  # IEEE equality: -0.0 == +0.0


def test_a_zero_that_crossed_a_lamport_buffer_is_positive():
    plan = _one_shot()
    outputs = run_launches(plan, [[np.full(2, -0.0, np.float32)] * 2] * 4, 8, "fp32")
    assert all(np.signbit(out).sum() == 0 for launch in outputs for out in launch)  # -0.0 + (+0.0): +0.0


def test_check_plan_proves_a_lamport_plan_over_every_buffers_reuse():
    record = check_plan(_one_shot(4, instances=2), [64], ("bf16",))
    assert record.ok and record.back_to_back == 4 and "(4 launches back to back)" in record.checks[0]


# --- the reference executor: the sentinel is waited on, the reset is checked ---------------------------------------


def test_a_receiver_waits_while_a_word_holds_the_sentinel(monkeypatch):
    import executor.reference.lamport as model

    monkeypatch.setattr(model, "to_wire", lambda values: values)  # a sender that forgot the mapping
    x = np.array([1.0, -0.0], np.float32)
    with pytest.raises(PlanDeadlock, match="waits for Lamport data: a word of scratch copy 0 still holds the sentinel"):
        run_launches(_one_shot(), [[x, x]], 8, "fp32")


def test_data_that_no_reset_cleared_is_a_race(monkeypatch):
    import executor.reference.lamport as model

    monkeypatch.setattr(model.LamportMachine, "_side_threads", lambda self: [])  # no reset thread
    inputs = [[np.full(2, 1.0 + k, np.float32), np.full(2, 2.0, np.float32)] for k in range(4)]
    # the reader of launch 3 takes launch 0's stale data for its own (or its writer lands on it first): a race
    with pytest.raises(PlanRace, match=r"launch 3 .* launch 0's (Lamport data )?\(no reset came between\)"):
        run_launches(_one_shot(), inputs, 8, "fp32")


@pytest.mark.parametrize(("buffers", "ahead"), [(2, 1), (3, 1)])
def test_the_verifier_refuses_a_reset_that_could_race_in_one_line(buffers, ahead):
    plan = replace(_one_shot(), lamport=LamportBuffers(buffers, ahead))
    with pytest.raises(PlanRace) as caught:
        check_plan(plan, [8], ("fp32",))
    message = str(caught.value)
    assert "\n" not in message and f"lamport.reset_ahead {ahead}" in message and plan.name in message


@pytest.mark.parametrize(("buffers", "ahead"), [(2, 1), (3, 1)])
def test_running_a_racy_rotation_finds_the_reset_racing_a_peers_write(buffers, ahead):
    plan = replace(_one_shot(), lamport=LamportBuffers(buffers, ahead))
    inputs = [[np.full(2, 1.0 + k, np.float32), np.full(2, 3.0, np.float32)] for k in range(4)]
    with pytest.raises(PlanRace, match=r"concurrently with a write by rank \d's reset of Lamport scratch copy 1"):
        run_launches(plan, inputs, 8, "fp32")


def test_codegen_gates_a_writer_that_could_overtake_the_reset(monkeypatch):
    # a broadcast's root hears nothing back, so it could run two calls ahead into a buffer being reset
    schedule = synthesize("fully_connected:n=3", "broadcast", "direct")
    gated = compile_schedule(schedule, protocol="lamport")
    assert any(op.name == "wait" for g in gated.gpus for tb in g.threadblocks for op in tb.ops)
    assert check_plan(gated, [12], ("fp32",)).ok
    import codegen.sync

    monkeypatch.setattr(codegen.sync, "lamport_unsafe_channels", lambda actions, needs: set())
    ungated = compile_schedule(schedule, protocol="lamport")
    with pytest.raises(PlanRace, match="reset of Lamport scratch copy"):
        check_plan(ungated, [12], ("fp32",))


def test_a_one_shot_needs_no_handshake():
    plan = _one_shot(4)
    assert not any(op.name in ("wait", "signal") for g in plan.gpus for tb in g.threadblocks for op in tb.ops)


# --- tune makes the variant; the GPU side refuses it and selection there never picks it ---------------------------


def test_weft_tune_makes_and_proves_lamport_variants(tmp_path, capsys):
    from weft.cli import main

    reg = tmp_path / "reg"
    argv = ["tune", "allreduce", "-t", "fully_connected:n=2", "--method", "direct", "--protocols", "lamport,ll"]
    assert main(argv + ["--instances", "1", "--threads", "1024", "--registry", str(reg), "--json"]) == 0
    labels = {v["variant"]: v["plan"] for v in json.loads(capsys.readouterr().out)["variants"]}
    # a 2-rank one-shot's scratch holds the message once a copy: wide by default (weft.tuning.lamport_limit)
    assert labels["lamport-x1"].endswith("-lamport-x1-max16MB") and labels["ll-x1"].endswith("-ll-x1")
    (entry,) = [e for e in Registry(str(reg)).entries() if e.plan.protocol == "Lamport"]
    assert entry.plan.weft.verification["back_to_back"] == 4


def test_the_interpreter_takes_a_lamport_plan_and_the_port_engine_refuses_it_in_one_line():
    from executor.gpu.protocols import PORT_PROTOCOLS, protocol_refusal
    from executor.gpu.tables import build_tables

    assert build_tables(_one_shot(), 0, 1024).lamport_buffers == 3
    why = protocol_refusal(_one_shot(), PORT_PROTOCOLS, "the port engine")
    assert "protocol Lamport: the port engine runs Simple and LL plans only" in why and "\n" not in why


def test_gpu_side_selection_weighs_a_lamport_plan_by_its_measured_time():
    from executor.inference.plans import PlanChoice
    from weft import publish
    from weft.pipeline import compile_and_verify

    topology = build("fully_connected:n=2")
    schedule = direct(topology, Collective("allreduce", 2))
    location = "memory://lamport-choice"
    for protocol in ("lamport", "ll"):
        publish.commit(compile_and_verify(schedule, topology, protocol=protocol), topology, location, schedule)
    registry = Registry(location)
    ids = {e.plan.protocol: e.id for e in registry.entries()}
    registry.record_timing(ids["Lamport"], 1024, 0.5)
    registry.record_timing(ids["LL"], 1024, 0.7)
    registry.record_timing(ids["Lamport"], 4096, 0.9)
    registry.record_timing(ids["LL"], 4096, 0.6)
    choice = PlanChoice(registry, topology.fingerprint, 2)
    assert {e.plan.protocol for e in choice.entries} == {"LL", "Lamport"}
    assert choice.plan("allreduce", 1024, "bf16").protocol == "Lamport"  # measured fastest there
    assert choice.plan("allreduce", 4096, "bf16").protocol == "LL"
    for nbytes, protocol in ((1024, "Lamport"), (4096, "LL")):  # `weft registry select` agrees
        assert publish.select(location, topology, "allreduce", nbytes, "bf16").entry.plan.protocol == protocol
