"""Command-line and file values that were read as if valid, or crashed, are refused in one line (issues 38, 39)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fabrics import ring_files

from schedules.collectives import Collective, CollectiveError
from weft.cli import main
from weft.units import SizeError, parse_bytes


def _one_line_refusal(capsys, argv: list[str], code: int = 2) -> str:
    capsys.readouterr()
    assert main(argv) == code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("weft: error: ") and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("values")
    schedule, plan = ring_files(folder)
    return {"schedule": schedule, "plan": plan, "folder": folder}


def test_a_size_of_400_digits_is_refused_in_one_line(capsys):
    err = _one_line_refusal(capsys, ["synth", "allreduce", "-t", "dgx1", "--method", "ring", "--size", "9" * 400])
    assert "--size" in err and len(err) < 200


@pytest.mark.parametrize("text", ["9223372036854775808", "8EB", "1025PB"])
def test_sizes_past_the_bound_are_refused(text):
    with pytest.raises(SizeError, match="largest size, 1EB"):
        parse_bytes(text)


def test_the_size_bound_and_units_are_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1KB = 1KiB = 1024 B" in text and "2^60" in text and "decimal GB/s" in text


@pytest.mark.parametrize("text", ["4Mb", "1kb", "2Gb", "8b"])
def test_a_lowercase_b_is_bits_and_refused(text):
    with pytest.raises(SizeError, match="lowercase b means bits"):
        parse_bytes(text)


def test_binary_units_are_read_in_any_case():
    assert parse_bytes("4MB") == parse_bytes("4mB") == parse_bytes("4MiB") == parse_bytes("4m") == 4 << 20
    assert parse_bytes("1.5KB") == 1536 and parse_bytes("1EB") == 1 << 60


@pytest.mark.parametrize("command", ["verify", "compile"])
def test_a_schedule_with_rounds_2_to_the_63_is_refused(capsys, files, tmp_path, command):
    doc = json.loads(files["schedule"].read_text())
    doc.pop("hash", None)
    doc["steps"][0]["rounds"] = 2**63
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    argv = [command, str(path), "-t", "ring:n=4"] + (["-o", str(tmp_path / "p.json")] if command == "compile" else [])
    err = _one_line_refusal(capsys, argv)
    assert "steps[0].rounds: must be an integer in 1..4294967296" in err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("field", ["root", "nranks"])
def test_a_bool_is_not_a_rank_or_a_count(field):
    with pytest.raises(CollectiveError):
        Collective("broadcast", **{"nranks": 4, "root": 0, field: True})


def test_a_schedule_whose_root_is_true_is_refused(capsys, files, tmp_path):
    doc = json.loads(files["schedule"].read_text())
    doc.pop("hash", None)
    doc["collective"]["root"] = True
    path = tmp_path / "root.json"
    path.write_text(json.dumps(doc))
    assert "root True is not a rank" in _one_line_refusal(capsys, ["verify", str(path), "-t", "ring:n=4"])


@pytest.mark.parametrize("dtypes", ["", ",", "fp32,,bf16"])
def test_empty_dtypes_are_refused(capsys, files, dtypes):
    assert "--dtypes" in _one_line_refusal(capsys, ["verify", str(files["plan"]), "--dtypes", dtypes])


@pytest.mark.parametrize(
    "flag,value",
    [("--instances", "1,,2"), ("--instances", ""), ("--threads", "256,"), ("--pipeline", "x"), ("--protocols", ",")],
)
def test_tune_refuses_empty_or_bad_list_items(capsys, flag, value):
    err = _one_line_refusal(capsys, ["tune", "allreduce", "-t", "hgx_h200:gpus=2", "--dry-run", flag, value])
    assert flag in err


@pytest.mark.parametrize("folder", ["/etc", "/dev"])
def test_registry_import_of_a_folder_without_plans_says_nothing_was_imported(capsys, tmp_path, folder):
    err = _one_line_refusal(capsys, ["registry", "import", folder, "--registry", str(tmp_path / "r")])
    assert "no plan or exported entry files" in err and not (tmp_path / "r").exists()


def test_no_doubled_prefix(capsys):
    """argparse's own errors name the program, and the CLI prefixes "weft: error:": said once."""
    assert _one_line_refusal(capsys, []) == "weft: error: the following arguments are required: command"


def test_one_tree_per_root_is_singular(capsys, tmp_path):
    assert (
        main(["synth", "allgather", "-t", "ring:n=4", "--method", "trees", "--k", "1", "-o", str(tmp_path / "t.json")])
        == 0
    )
    err = capsys.readouterr().err
    assert "trees: 1 tree per root" in err and "1 trees" not in err, err
