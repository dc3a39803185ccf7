"""weft tune: plan variants per schedule, proven and committed, for selection by measured size."""

from __future__ import annotations

import doctest
import json

import pytest

from registry.store import Registry
from topologies import resolve
from weft import tuning
from weft.cli import main
from weft.synthesis import synthesize
from weft.tuning import TuneError, TuneOptions, compile_variants, resident_capacity

TOPO = "hgx_h200:gpus=2"


def test_the_module_examples_hold():
    assert doctest.testmod(tuning).failed == 0


def test_capacity_follows_the_block_size():
    assert resident_capacity(1024, 132) == 132 and resident_capacity(512, 132) == 264
    assert resident_capacity(32, 1) == 32


def test_variants_are_proven_and_those_the_gpu_cannot_hold_are_skipped_with_the_reason():
    topology = resolve(TOPO)
    schedule = synthesize(topology, "allreduce", "direct")
    options = TuneOptions(instances=(1, 128), threads=(256, 1024), protocols=("ll", "simple"))
    outcomes = {o.variant.label: o for o in compile_variants(schedule, topology, options)}
    assert set(outcomes) == {
        "ll-x1-t256",
        "ll-x1",
        "ll-x128-t256",
        "ll-x128",
        "simple-x1-t256",
        "simple-x1",
        "simple-x128-t256",
        "simple-x128",
    }
    for label in ("ll-x128", "simple-x128"):  # 256 blocks of 1024 threads: one per SM fits, 132 SMs
        assert outcomes[label].plan is None and "256 thread blocks of 1024 threads" in outcomes[label].skipped
    made = [o for o in outcomes.values() if o.plan]
    assert len(made) == 6 and all(o.plan.weft.verification["ok"] for o in made)
    assert outcomes["ll-x128-t256"].plan.num_threads_per_block == 256 and outcomes["ll-x128-t256"].threadblocks == 256


def test_simple_plans_alternate_scratch_only_where_that_spares_a_handshake():
    topology = resolve(TOPO)
    options = TuneOptions(instances=(2,), threads=(1024,), protocols=("simple",))
    (one_shot,) = compile_variants(synthesize(topology, "allreduce", "direct"), topology, options)
    (two_shot,) = compile_variants(synthesize(topology, "allreduce", "twoshot"), topology, options)
    assert one_shot.plan.use_double_scratch_buffer and one_shot.plan.name.endswith("-2s")
    assert not two_shot.plan.use_double_scratch_buffer  # its writes are ordered already: no handshake to spare


@pytest.mark.parametrize(
    "options",
    [
        dict(instances=()),
        dict(instances=(0,)),
        dict(threads=(100,)),
        dict(threads=(2048,)),
        dict(protocols=("nccl",)),
        dict(sms=0),
        dict(ll_max_bytes=3 << 10),
        dict(ll_max_bytes=0),
        dict(lamport_max_bytes=3 << 10),
    ],
)
def test_bad_grids_are_refused(options):
    with pytest.raises(TuneError):
        TuneOptions(**options)


def test_weft_tune_commits_every_proven_variant_and_bench_can_then_measure_them(tmp_path, capsys):
    reg = tmp_path / "reg"
    assert (
        main(
            [
                "tune",
                "allreduce",
                "-t",
                TOPO,
                "--instances",
                "1,4",
                "--threads",
                "1024",
                "--registry",
                str(reg),
                "--json",
                "-o",
                str(tmp_path / "plans"),
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    plans = [v for v in doc["variants"] if v["plan"]]
    assert len(plans) == len(doc["variants"]) == 12  # direct and twoshot x ll, simple, lamport x 1, 4 instances
    entries = Registry(str(reg)).entries(collective="allreduce")
    assert {e.plan.name for e in entries} == {v["plan"] for v in plans}
    assert len(list((tmp_path / "plans").glob("*.plan.json"))) == 12
    sel = Registry(str(reg)).select(resolve(TOPO).fingerprint, "allreduce", 1 << 20, "bf16")
    assert sel.entry is not None


def test_a_dry_run_commits_nothing(tmp_path, capsys):
    reg = tmp_path / "reg"
    assert (
        main(
            [
                "tune",
                "allgather",
                "-t",
                TOPO,
                "--instances",
                "2",
                "--threads",
                "512",
                "--registry",
                str(reg),
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "nothing committed" in out and not Registry(str(reg)).entries()


def test_a_variant_that_accepts_no_power_of_two_size_is_flagged(tmp_path, capsys):
    """x3 splits messages into chunk counts with a factor 3: no 1 KB–1 GB power of two fits, so say so."""
    assert (
        main(
            [
                "tune",
                "allgather",
                "-t",
                TOPO,
                "--instances",
                "2,3",
                "--threads",
                "512",
                "--protocols",
                "simple",
                "--registry",
                str(tmp_path / "reg"),
                "--dry-run",
                "--json",
            ]
        )
        == 0
    )
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["variants"]}
    assert rows["simple-x2-t512"]["powers_of_two"] and not rows["simple-x3-t512"]["powers_of_two"]
    assert (
        main(
            [
                "tune",
                "allgather",
                "-t",
                TOPO,
                "--instances",
                "3",
                "--threads",
                "512",
                "--protocols",
                "simple",
                "--registry",
                str(tmp_path / "reg"),
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "simple-x3-t512" in out and "warning: it accepts no power-of-two size" in out


def test_simple_variants_can_be_pipelined(tmp_path, capsys):
    """--pipeline 1,2: each Simple variant also cut into two sub-pieces per instance, proven like the others; LL
    variants stay as they are (their packets already flow behind per-packet flags)."""
    assert (
        main(
            [
                "tune",
                "allreduce",
                "-t",
                TOPO,
                "--method",
                "twoshot",
                "--instances",
                "4",
                "--threads",
                "512",
                "--pipeline",
                "1,2",
                "--registry",
                str(tmp_path / "reg"),
                "--dry-run",
                "--json",
            ]
        )
        == 0
    )
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["variants"]}
    assert set(rows) == {"ll-x4-t512", "simple-x4-t512", "simple-x4-p2-t512", "lamport-x4-t512"}
    assert "-p2" in rows["simple-x4-p2-t512"]["plan"] and "-p2" not in rows["simple-x4-t512"]["plan"]


@pytest.mark.parametrize(
    "argv,field",
    [
        (["--pipeline", "0"], "--pipeline"),
        (["--threads", "100"], "--threads"),
        (["--instances", "a,b"], "--instances"),
        (["--protocols", "xl"], "--protocols"),
        (["--method", "nope"], "method"),
        (["--lamport-max-bytes", "3KB"], "--lamport-max-bytes"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, field):
    assert main(["tune", "allreduce", "-t", TOPO, "--registry", str(tmp_path / "r"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and not (tmp_path / "r").exists()


def test_a_schedule_of_another_collective_is_refused(tmp_path, capsys):
    schedule = tmp_path / "ag.json"
    assert main(["synth", "allgather", "-t", TOPO, "--method", "direct", "-o", str(schedule)]) == 0
    capsys.readouterr()
    assert main(["tune", "allreduce", "-t", TOPO, "--schedule", str(schedule), "--registry", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (
        f"weft: error: weft tune: schedule {schedule}: collective: allgather, not allreduce\n"
    )


@pytest.mark.parametrize("method", [[], ["--method", "direct"]])
def test_a_bad_schedule_file_is_reported_before_the_baselines_are_built(tmp_path, capsys, method):
    # direct cannot be built on dgx1 (no link 0->5): the file's own error must be what the user sees
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "weft.schedule/1"}')
    assert main(["tune", "allreduce", "-t", "dgx1", *method, "--schedule", str(bad), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == f"weft: error: schedule {bad}: collective: must be an object\n"


def test_a_schedule_file_for_another_topology_is_named_in_the_error(tmp_path, capsys):
    schedule = tmp_path / "ring8.json"
    assert main(["synth", "allreduce", "-t", "ring:n=8", "--method", "ring", "-o", str(schedule)]) == 0
    capsys.readouterr()
    assert (
        main(["tune", "allreduce", "-t", "dgx1", "--schedule", str(schedule), "--registry", str(tmp_path / "r")]) == 1
    )
    err = capsys.readouterr().err
    assert err.startswith(f"weft: error: schedule {schedule}: verification failed: topology: the schedule is for ")
    assert err.count("\n") == 1 and not (tmp_path / "r").exists()


def test_pull_variants_join_the_simple_ones():
    labels = [v.label for v in tuning.grid(TuneOptions(instances=(8,), threads=(1024,), pull=True))]
    assert labels == ["ll-x8", "simple-x8", "simple-x8-pull", "lamport-x8"]
    topology = resolve(TOPO)
    (plain, pulled) = compile_variants(
        synthesize(topology, "allreduce", "direct"),
        topology,
        TuneOptions(instances=(8,), threads=(1024,), protocols=("simple",), pull=True),
    )
    assert pulled.plan.name.endswith("-x8-pull") and pulled.threadblocks == 8 and plain.threadblocks == 16


def test_ll_variants_can_accept_larger_messages_for_executors_with_ll128_lines(capsys):
    topology = resolve(TOPO)
    options = TuneOptions(instances=(4,), threads=(256,), protocols=("ll", "simple"), ll_max_bytes=8 << 20)
    ll, simple = compile_variants(synthesize(topology, "allreduce", "direct"), topology, options)
    assert ll.plan.max_message_size == 8 << 20 and ll.plan.name.endswith("-ll-x4-t256-max8MB")
    assert ll.plan.accepts(4 << 20) and ll.plan.weft.verification["ok"]
    assert simple.plan.max_message_size > 8 << 20 and "max" not in simple.plan.name  # Simple plans: any size
    assert main(["tune", "allreduce", "-t", TOPO, "--ll-max-bytes", "3KB", "--dry-run"]) == 2
    assert "--ll-max-bytes: a whole number of MB" in capsys.readouterr().err


def test_lamport_variants_can_accept_the_mid_sizes_the_traffic_model_puts_them_ahead_at():
    # the 4-rank multi-peer Lamport two-shot, predicted fastest of weft's shapes at 8 and 16 MB (issue 33;
    # bench/results/traffic_predictions_midsize_4xh200.json), and its per-peer twin, both proven
    topology = resolve("hgx_h200:gpus=4")
    options = TuneOptions(instances=(1,), threads=(1024,), protocols=("lamport",), lamport_max_bytes=16 << 20)
    outcomes = compile_variants(synthesize(topology, "allreduce", "twoshot"), topology, options)
    assert [o.plan.name for o in outcomes if o.plan] == [
        "twoshot-allreduce-hgx_h200:gpus=4-lamport-x1-max16MB",
        "twoshot-allreduce-hgx_h200:gpus=4-lamport-x1-mp-max16MB",
    ]
    assert all(o.plan.accepts(16 << 20) and o.plan.weft.verification["ok"] for o in outcomes if o.plan)


def test_the_lamport_limit_leaves_other_protocols_alone():
    topology = resolve(TOPO)
    options = TuneOptions(instances=(4,), threads=(256,), protocols=("ll", "simple"), lamport_max_bytes=16 << 20)
    ll, simple = compile_variants(synthesize(topology, "allreduce", "direct"), topology, options)
    assert ll.plan.max_message_size == 1 << 20 and "max" not in ll.plan.name + simple.plan.name


def test_an_unwritable_output_folder_is_refused_before_anything_is_committed(tmp_path, capsys):
    reg, taken = tmp_path / "reg", tmp_path / "taken"
    taken.write_text("a file, not a folder")
    assert (
        main(
            [
                "tune",
                "allreduce",
                "-t",
                TOPO,
                "--instances",
                "1",
                "--threads",
                "1024",
                "--protocols",
                "simple",
                "--registry",
                str(reg),
                "-o",
                str(taken / "plans"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("weft: error: output ") and err.count("\n") == 1 and str(taken) in err
    assert not reg.exists()


def test_on_a_topology_without_all_pairs_linked_the_defaults_fall_back_to_a_ring(tmp_path, capsys):
    """direct and two-shot need a link between every pair (NVSwitch); on dgx1's cube-mesh weft tune says it left
    them out and tunes a ring, instead of failing on the first default."""
    argv = ["tune", "allreduce", "-t", "dgx1", "--instances", "1", "--threads", "1024", "--registry", str(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "weft tune: left out direct: topology dgx1 has no link" in err
    assert "weft tune: left out twoshot: topology dgx1 has no link" in err and "weft tune: tuning ring instead" in err
    names = {e.plan.name for e in Registry(tmp_path).entries()}
    ring = "ring-allreduce-dgx1"
    assert names == {f"{ring}-ll-x1", f"{ring}-simple-x1", f"{ring}-lamport-x1-max16MB"}  # a ring's scratch: < 2x


def test_a_method_asked_for_by_name_is_not_replaced(tmp_path, capsys):
    assert main(["tune", "allreduce", "-t", "dgx1", "--method", "direct", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("weft: error: direct: topology dgx1 has no link")


def test_defaults_that_apply_are_kept_and_notes_name_the_others():
    schedules, notes = tuning.default_schedules(resolve("hgx_h200:gpus=4"), "allreduce")
    assert [s.meta.solver for s in schedules] == ["direct", "twoshot"] and notes == []
    schedules, notes = tuning.default_schedules(resolve("ring:n=4"), "allgather")
    assert [s.meta.solver for s in schedules] == ["ring"] and notes[-1] == "tuning ring instead"


def test_weft_tune_prints_each_variant_once_under_a_heading_per_schedule(capsys):
    assert main(["tune", "allreduce", "-t", TOPO, "--instances", "1,128", "--threads", "256,1024", "--dry-run"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("schedule ")]
    assert [lines[i].split()[1] for i in headings] == [
        "direct-allreduce-hgx_h200:gpus=2",
        "twoshot-allreduce-hgx_h200:gpus=2",
    ]
    variants = [line.split()[0] for line in lines if line.startswith("  ")]
    labels = [
        "ll-x1-t256",
        "ll-x1",
        "ll-x128-t256",
        "ll-x128",
        "simple-x1-t256",
        "simple-x1",
        "simple-x128-t256",
        "simple-x128",
        "lamport-x1-t256",
        "lamport-x1",
        "lamport-x128-t256",
        "lamport-x128",
    ]
    assert variants == labels + labels  # once per schedule, in grid order, nowhere else
    assert headings[1] == headings[0] + 1 + len(labels)
    assert not any(label in captured.err for label in labels)
    assert "(1 thread block)" in captured.out and "(1 thread blocks)" not in captured.out
    assert lines[-1].startswith("21 of 24 variants proven")


def test_duplex_all_to_all_blocks_both_write_and_wait_so_twice_the_instances_fit():
    # a direct all-to-all's receive roles only wait (the peer writes the data): per-peer blocks spin on half their
    # SMs, so x32 of 1024 threads (224 blocks) does not fit 132 SMs; duplex blocks (128) do, every one writing
    topology = resolve("hgx_h200:gpus=4")
    schedule = synthesize(topology, "alltoall", "direct")
    options = TuneOptions(instances=(32,), threads=(1024,), protocols=("simple",), multipeer=False, duplex=True)
    outcomes = {o.variant.label: o for o in compile_variants(schedule, topology, options)}
    assert outcomes["simple-x32"].plan is None and "hold 132 at once" in outcomes["simple-x32"].skipped
    duplex = outcomes["simple-x32-dx"].plan
    assert duplex is not None and duplex.weft.verification["ok"] and duplex.name.endswith("-dx")
    blocks = duplex.gpus[0].threadblocks
    assert len(blocks) == 4 * 32
    peers = [tb for tb in blocks if any(op.name == "put" for op in tb.ops)]
    assert len(peers) == 3 * 32 and all(any(op.name == "wait" for op in tb.ops) for tb in peers)


def test_by_default_one_host_gets_every_protocol_and_several_hosts_simple_alone(capsys):
    # across hosts a plan moves data over port channels, which carry plain puts: codegen refuses LL and Lamport there,
    # so tuning them by default would only list refusals
    argv = ["--instances", "4", "--threads", "512", "--method", "direct", "--dry-run", "--json"]
    protocols = {}
    for topo in (TOPO, "hgx_h200:nodes=2,gpus=2"):
        assert main(["tune", "allreduce", "-t", topo, *argv]) == 0
        variants = json.loads(capsys.readouterr().out)["variants"]
        assert all(v["plan"] for v in variants)
        protocols[topo] = {v["variant"].split("-")[0] for v in variants}
    assert protocols == {TOPO: {"ll", "simple", "lamport"}, "hgx_h200:nodes=2,gpus=2": {"simple"}}
    # protocols named are tried as named: Lamport across hosts is refused, variant by variant, and nothing is made
    assert main(["tune", "allreduce", "-t", "hgx_h200:nodes=2,gpus=2", *argv, "--protocols", "lamport"]) == 1
    variants = json.loads(capsys.readouterr().out)["variants"]
    assert variants and all(not v["plan"] and "port channels" in v["skipped"] for v in variants)


@pytest.mark.parametrize(
    "spec,method,limit_mb",
    [
        ("hgx_h200:gpus=4", "direct", 4),  # a 4-rank one-shot's scratch holds 3x the message a copy
        ("hgx_h200:gpus=4", "twoshot", 16),  # 1.5x
        ("hgx_h200:gpus=2", "twoshot", 16),  # 1x
        ("hgx_h200:gpus=2", "direct", 16),  # 1x
    ],
)
def test_lamport_variants_accept_more_by_default_where_their_scratch_is_small(spec, method, limit_mb, capsys):
    argv = ["tune", "allreduce", "-t", spec, "--method", method, "--protocols", "lamport", "--instances", "4"]
    argv += ["--threads", "512", "--no-multipeer", "--dry-run", "--json"]
    assert main(argv) == 0
    (variant,) = json.loads(capsys.readouterr().out)["variants"]
    assert variant["plan"].endswith("-max16MB") == (limit_mb == 16)
    topology = resolve(spec)
    (outcome,) = compile_variants(
        synthesize(topology, "allreduce", method),
        topology,
        TuneOptions(instances=(4,), threads=(512,), protocols=("lamport",), multipeer=False),
    )
    assert outcome.plan.max_message_size == limit_mb << 20 and outcome.plan.accepts(limit_mb << 20)
    assert outcome.plan.weft.verification["ok"]
    # --lamport-max-bytes, where given, is every variant's limit
    assert main([*argv, "--lamport-max-bytes", "8MB"]) == 0
    (variant,) = json.loads(capsys.readouterr().out)["variants"]
    assert variant["plan"].endswith("-max8MB")
