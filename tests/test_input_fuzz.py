"""The standing fuzz (issue 39): command-line values, topology, schedule, plan and results files, mutated one
value at a time and run through ``weft``'s entry function in-process (signals to multi-process commands are in
test_signals.py). About 2,090 commands (measured; hypothesis stops early where a strategy holds fewer values
than its max_examples), with the oracle:

- no traceback: every case ends in an exit code of 0, 1 or 2, and a refusal (2) is one line on stderr;
- no hang: each case runs under a 30 s alarm;
- nothing invalid accepted silently: a value that cannot be valid (a bool or a string where a count, rank or
  size belongs, a negative count, an empty list item, a size past the bound, a special file as input or output)
  must be refused, and a refused command writes nothing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from pathlib import Path

import pytest
from bounded import no_hang
from fabrics import ring_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.cli import main

HANG_S = 30


def cases(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(scope="module", autouse=True)
def one_parser():
    """One argument parser for every case (building it is most of a refused case's time; it keeps no state)."""
    import weft.cli

    parser = weft.cli.build_parser()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weft.cli, "build_parser", lambda: parser)
        yield


def weft(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of one command, checked against the oracle's first two rules."""
    err = io.StringIO()
    with no_hang(HANG_S, "a case"), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    text = err.getvalue()
    assert code in (0, 1, 2), (argv, code, text)
    if code == 2:
        last = text.strip().splitlines()[-1]
        assert last.startswith("weft: error: ") and "Traceback" not in text, (argv, text)
    return code, text


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz")
    paths = {
        "root": root,
        "topology": root / "ring4.topo.json",
        "schedule": root / "ring.json",
        "plan": root / "ring.plan.json",
        "results": root / "results.json",
        "fifo": root / "fifo",
        "out": root / "out",
    }
    assert main(["topo", "export", "ring:n=4", "-o", str(paths["topology"])]) == 0
    ring_files(root)
    plan = json.loads(paths["plan"].read_text())["name"]
    paths["results"].write_text(
        json.dumps(
            {
                "collective": "allgather",
                "dtype": "bf16",
                "nranks": 4,
                "mode": "graph",
                "machine": "fuzz",
                "rows": [
                    {
                        "size": s,
                        "nccl_us": 10.0 + s / 1e4,
                        "weft_us": 8.0 + s / 1e4,
                        "wrong": 0,
                        "plan": plan,
                        "median_us": {f"weft:{plan}": 8.0 + s / 1e4},
                    }
                    for s in (1024, 1 << 20)
                ],
            }
        )
    )
    os.mkfifo(paths["fifo"])
    paths["out"].mkdir()
    return paths


# ---- command-line values -------------------------------------------------------------------------------------

WEIRD = st.sampled_from(
    [
        "",
        ",",
        " ",
        "-1",
        "0",
        "1,,2",
        "nan",
        "inf",
        "-inf",
        "1e999",
        "9" * 400,
        "0x10",
        "4Mb",
        "1kb",
        "1.5",
        "2EB",
        "1/2",
        "\x00",
        "\n",
        "é",
        "../../etc/passwd",
        "/dev/zero",
        "/dev/null",
        "true",
        "None",
        "-",
        "--",
        "1KB:1GB",
        "1GB:1KB",
        "3MB+48",
        "+",
        "1 2",
    ]
)
SIZE_TEXT = st.one_of(WEIRD, st.from_regex(r"[0-9]{1,25}(\.[0-9]{1,3})?([kKmMgGtTpPeE]i?[bB]?)?", fullmatch=True))
INVALID_SIZE = st.sampled_from(
    ["", "-1", "0", "nan", "inf", "9" * 400, "4Mb", "1kb", "2EB", "1/2", "1,,2", "\x00", "true", "-", "0x10"]
)


def _synth(size: str, chunks: str, out: Path) -> list[str]:
    return [
        "synth",
        "allgather",
        "-t",
        "ring:n=4",
        "--method",
        "ring",
        "--size",
        size,
        "--chunks",
        chunks,
        "-o",
        str(out / "s.json"),
    ]


@cases(300)
@given(size=SIZE_TEXT, chunks=st.sampled_from(["1", "2", "0", "-3", "x", "", "1000000", "9" * 30]))
def test_synth_values(files, size, chunks):
    out = files["out"] / "synth"
    (out / "s.json").unlink(missing_ok=True)
    code, _ = weft(_synth(size, chunks, out))
    if code != 0:
        assert not (out / "s.json").exists()


@cases(15)
@given(size=INVALID_SIZE)
def test_an_invalid_size_is_never_accepted(files, size):
    assert weft(_synth(size, "1", files["out"] / "bad"))[0] == 2
    assert weft(["verify", str(files["plan"]), "--sizes", size])[0] == 2


@cases(250)
@given(
    flag=st.sampled_from(["--instances", "--threads", "--pipeline", "--protocol", "--ll-max-bytes", "--format"]),
    value=WEIRD,
)
def test_compile_values(files, flag, value):
    out = files["out"] / "c.json"
    code, _ = weft(["compile", str(files["schedule"]), "-t", "ring:n=4", flag, value, "-o", str(out)])
    if code != 0:
        assert not out.exists()
    out.unlink(missing_ok=True)


@cases(200)
@given(flag=st.sampled_from(["--sizes", "--dtypes", "--seed"]), value=WEIRD)
def test_verify_values(files, flag, value):
    weft(["verify", str(files["plan"]), flag, value])


@cases(6)
@given(dtypes=st.sampled_from(["", ",", "fp32,,bf16", "fp64", "FP32 ", "fp32,fp8"]))
def test_invalid_dtypes_are_never_accepted(files, dtypes):
    assert weft(["verify", str(files["plan"]), "--dtypes", dtypes])[0] == 2


@cases(150)
@given(
    spec=st.one_of(
        WEIRD,
        st.from_regex(
            r"(ring|switch|dgx1|torus2d|hypercube|hgx_h100):?([a-z]{1,5}=-?[0-9]{0,6},?){0,3}", fullmatch=True
        ),
    )
)
def test_topology_specs(spec):
    weft(["topo", "show", spec])


@cases(16)
@given(
    command=st.sampled_from(["compile", "synth", "topo export", "plot"]),
    target=st.sampled_from(["fifo", "/dev/null", "/dev/full", "out"]),
)
def test_special_outputs_are_refused(files, command, target):
    path = str(files[target]) if target in files else target
    argv = {
        "compile": ["compile", str(files["schedule"]), "-t", "ring:n=4", "-o", path],
        "synth": [
            "synth",
            "allgather",
            "-t",
            "ring:n=4",
            "--method",
            "ring",
            "-o",
            path + "/x.json" if target == "out" else path,
        ],
        "topo export": ["topo", "export", "ring:n=4", "-o", path],
        "plot": ["plot", "bench", str(files["results"]), "-o", path],
    }[command]
    if command == "synth" and target == "out":
        argv[-1] = path  # a folder is a valid synth output
        return
    assert weft(argv)[0] == 2
    assert os.path.exists(path) and not os.path.isfile(path)


# ---- files -------------------------------------------------------------------------------------------------------

VALUES = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            2**31,
            2**63,
            2**64,
            -(2**63),
            1e308,
            -1e-300,
            0.5,
            "",
            "x" * 300,
            "NaN",
            [],
            {},
            [1, 2],
            {"a": 1},
        ]
    ),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
NOT_A_COUNT: st.SearchStrategy[object] = st.sampled_from([True, False, "1", "", None, -1, -(2**63), 2**64, 1.5, [], {}])
DELETE = object()


def _paths(doc, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):  # the first few items of long lists
            yield from _paths(v, prefix + (i,))


def _mutated(doc, path, value):
    doc = copy.deepcopy(doc)
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def _write(folder: Path, doc) -> Path:
    path = folder / "mutated.json"
    path.write_text(json.dumps(doc))
    return path


def _file_case(files, kind: str, data, argv_of, counts: tuple[str, ...], n: int):
    doc = json.loads(files[kind].read_text())
    doc.pop("hash", None)
    doc.pop("weft", None) if kind == "plan" else None
    paths = [p for p, _ in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    count_field = isinstance(path[-1], str) and path[-1] in counts and not {"meta", "weft"} & set(path)
    value = data.draw(st.one_of(VALUES, st.just(DELETE), NOT_A_COUNT) if not count_field else NOT_A_COUNT)
    target = _write(files["out"], _mutated(doc, path, value))
    code, err = weft(argv_of(target))
    if count_field and value is not DELETE:
        assert code != 0, (path, value, err)  # a count, rank or size that is not a valid integer


@cases(400)
@given(data=st.data())
def test_topology_files(files, data):
    _file_case(files, "topology", data, lambda p: ["topo", "validate", str(p)], ("nranks", "src", "dst", "count"), 400)


@cases(400)
@given(data=st.data())
def test_schedule_files(files, data):
    _file_case(
        files,
        "schedule",
        data,
        lambda p: ["verify", str(p), "-t", "ring:n=4"],
        ("nranks", "chunks", "rounds", "root"),
        400,
    )


@cases(300)
@given(data=st.data())
def test_plan_files(files, data):
    _file_case(
        files,
        "plan",
        data,
        lambda p: ["verify", str(p), "--dtypes", "fp32"],
        ("input_chunks", "output_chunks", "scratch_chunks", "num_threads_per_block", "id", "index", "size"),
        300,
    )


@cases(200)
@given(data=st.data())
def test_results_files(files, data):
    command = data.draw(st.sampled_from([["topo", "calibrate", "ring:n=4"], ["plot", "bench", "--markdown"]]))
    _file_case(files, "results", data, lambda p: command + [str(p)], (), 200)
