"""What the CLI prints reads as English: counts agree with their nouns, names are never cut, bounds are in µs and
GB/s for the size asked about."""

from __future__ import annotations

import doctest
import json
import re
from pathlib import Path

from weft.cli import main, words

CLI = Path(__file__).resolve().parents[1] / "weft" / "cli"


def test_counted_picks_the_noun_for_the_number():
    assert doctest.testmod(words).failed == 0
    assert words.counted(1, "entry", "entries") == "1 entry" and words.counted(3, "entry", "entries") == "3 entries"


def test_no_cli_line_puts_a_count_before_a_fixed_plural_noun():
    # `{n} ranks` prints "1 ranks" for n == 1; every such count goes through words.counted (sizes, µs and GB/s
    # are units, not nouns; a constant of many, such as MAX_SENDS, needs no choice)
    nouns = (
        r"(ranks|entries|links|sends|points|instances|thread blocks|GPUs|gpus|executions|variants|sizes|hosts"
        r"|groups|plan times)"
    )
    pattern = re.compile(r"\{[^{}]*\} " + nouns + r"\b")
    found = [
        f"{path.name}:{i}: {line.strip()}"
        for path in sorted(CLI.glob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "{MAX_SENDS}" not in line
    ]
    assert found == []


def test_the_bound_is_in_microseconds_and_gigabytes_per_second_for_the_size(capsys):
    assert main(["topo", "bound", "dgx1", "allgather", "--size", "1GB"]) == 0
    out = capsys.readouterr().out
    assert "size ×" not in out and "1e3" not in out
    assert "bandwidth bound: 6263.494 µs for 1GB (algbw <= 171.43 = 1200/7 GB/s)" in out
    assert "lower bound:     6263.494 µs for 1GB (algbw <= 171.43 GB/s, busbw <= 150.00 GB/s)" in out
    assert "at S with 7 ranks" in out


def _pair(tmp_path: Path, name: str = "pair") -> Path:
    topology = tmp_path / f"{name}.json"
    links = [{"src": a, "dst": b, "bandwidth": 25.0, "latency": 0.7} for a, b in ((0, 1), (1, 0))]
    topology.write_text(json.dumps({"format": "weft.topology/1", "name": name, "nranks": 2, "links": links}))
    return topology


def test_one_of_a_thing_is_singular(tmp_path, capsys):
    topology = _pair(tmp_path)
    assert main(["topo", "validate", str(topology)]) == 0
    assert "pair, 2 ranks, 2 links" in capsys.readouterr().out
    assert main(["topo", "show", "switch:n=2"]) == 0
    assert "ranks     2 on 1 host\n" in capsys.readouterr().out
    registry = tmp_path / "reg"
    assert main(["registry", "list", "--registry", str(registry)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("0 entries")
    assert (
        main(
            [
                "synth",
                "allreduce",
                "-t",
                str(topology),
                "--method",
                "direct",
                "--commit",
                "--registry",
                str(registry),
                "-o",
                str(tmp_path / "s.json"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["registry", "list", "--registry", str(registry)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 entry in ")
    assert main(["registry", "export", str(tmp_path / "out"), "--registry", str(registry)]) == 0
    assert capsys.readouterr().out.startswith("exported 1 entry to ")


def test_long_schedule_names_are_printed_whole(tmp_path, capsys):
    topology = _pair(tmp_path, "two_gpus_joined_by_one_bonded_nvlink_bridge")
    assert main(["synth", "allreduce", "-t", str(topology), "--method", "ring", "-o", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    name = "ring-allreduce-two_gpus_joined_by_one_bonded_nvlink_bridge"
    assert re.search(rf"^{re.escape(name)} +2 +2 +1 ", out, re.M)  # whole, then steps, rounds, chunks
