"""weft's results documents, read and checked: a GPU benchmark (bench/results/gpu_*.json) and an SMT Pareto frontier
(``weft.frontier/1``). Each reader raises one line naming the file and the field, before anything is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from weftcore.errors import WeftError
from weftcore.jsonfile import Fields, read_json, short_repr

FRONTIER_FORMAT = "weft.frontier/1"
# Bounds wide enough for any real run, narrow enough that busbw (size / time) and the plot axes stay finite.
MAX_SIZE = 1e18  # bytes
TIME_RANGE_US = (1e-3, 1e12)
MAX_STEPS = 1 << 24


class ResultsError(WeftError):
    """A results file that cannot be read or plotted."""


@dataclass(frozen=True)
class BenchRow:
    size: float
    nccl_us: float | None
    symm_us: float | None
    weft_us: float | None
    plan: str | None
    wrong: int | None
    flashinfer_us: float | None = None
    best_peer: str | None = None  # the fastest implementation other than weft timed in the job (NCCL included)
    best_peer_us: float | None = None
    peers_wrong: int | None = None  # ranks × peers whose output differed from NCCL's


@dataclass(frozen=True)
class BenchResults:
    collective: str
    dtype: str
    nranks: int
    mode: str
    machine: str
    rows: tuple[BenchRow, ...]


@dataclass(frozen=True)
class FrontierRow:
    """One point of a frontier file as read back for plots (the solver's own is synth.smt.FrontierPoint)."""

    steps: int
    rounds: int | None
    chunks: int | None
    rounds_per_chunk: float


@dataclass(frozen=True)
class Frontier:
    collective: str
    topology: str
    points: tuple[FrontierRow, ...]
    lp_bound: float | None


class _Fields(Fields):
    """Field checks for one results file, with the ranges plotting needs."""

    def __init__(self, kind: str, source: str):
        super().__init__(kind, source, ResultsError)

    def rows(self, value: object, where: str) -> list:
        if not isinstance(value, list) or not value:
            raise self.fail(where, "must be a non-empty list")
        return value

    def text(self, doc: dict, key: str, where: str) -> str:
        value = doc.get(key, "")
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, got {short_repr(value)}")
        return value

    def int(self, value: object, where: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(where, f"must be an integer from {low} to {high}, got {short_repr(value)}")
        return value

    def number(self, value: object, where: str, low: float, high: float, what: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            raise self.fail(where, f"must be {what} from {low:g} to {high:g}, got {short_repr(value)}")
        return float(value) if isinstance(value, float) else value


def read_bench(path: str | Path) -> BenchResults:
    """One GPU benchmark file: ``rows`` of {size, nccl_us, symm_us, weft_us, plan, wrong}; times may be null."""
    f = _Fields("bench results", str(path))
    doc = f.obj(read_json(path, f.kind, ResultsError), "(top level)")
    rows = []
    for i, value in enumerate(f.rows(doc.get("rows"), "rows")):
        where = f"rows[{i}]"
        row = f.obj(value, where)
        if "size" not in row:
            raise f.fail(f"{where}.size", "missing (the message size in bytes)")
        times = {}
        for key in ("nccl_us", "symm_us", "weft_us", "flashinfer_us", "best_peer_us"):
            t = row.get(key)
            times[key] = None if t is None else f.number(t, f"{where}.{key}", *TIME_RANGE_US, "a time in µs")
        medians = row.get("median_us")  # every contender's median, the times above are the best of
        if medians is not None:
            for label, t in f.obj(medians, f"{where}.median_us").items():
                if t is not None:
                    f.number(t, f"{where}.median_us.{label[:40]}", *TIME_RANGE_US, "a time in µs")
        plan = row.get("plan")
        if plan is not None and not isinstance(plan, str):
            raise f.fail(f"{where}.plan", f"must be a plan name (a string), got {short_repr(plan)}")
        best_peer = row.get("best_peer")
        if best_peer is not None and not isinstance(best_peer, str):
            raise f.fail(f"{where}.best_peer", f"must be an implementation's name, got {short_repr(best_peer)}")
        wrong = row.get("wrong")
        if wrong is not None:
            wrong = f.int(wrong, f"{where}.wrong", 0, 1 << 62)
        peers_wrong = row.get("peers_wrong")
        if peers_wrong is not None:
            peers_wrong = sum(
                f.int(n, f"{where}.peers_wrong.{name[:40]}", 0, 1 << 62)
                for name, n in f.obj(peers_wrong, f"{where}.peers_wrong").items()
            )
        rows.append(
            BenchRow(
                size=f.number(row["size"], f"{where}.size", 1, MAX_SIZE, "a size in bytes"),
                plan=plan,
                wrong=wrong,
                best_peer=best_peer,
                peers_wrong=peers_wrong,
                **times,
            )
        )
    machine = doc.get("machine")
    if isinstance(machine, dict):
        machine = f.text(machine, "gpu", "machine.gpu")
    elif machine is not None and not isinstance(machine, str):
        raise f.fail("machine", f"must be a string or an object with 'gpu', got {short_repr(machine)}")
    return BenchResults(
        collective=f.text(doc, "collective", "collective"),
        dtype=f.text(doc, "dtype", "dtype"),
        nranks=f.int(doc.get("nranks", 2), "nranks", 1, 1 << 20),
        mode=f.text(doc, "mode", "mode"),
        machine=machine or "",
        rows=tuple(rows),
    )


def read_benches(paths: Sequence[str | Path]) -> BenchResults:
    """Several GPU benchmark files of one benchmark (sizes timed in separate jobs: ``weft bench --sizes``), their
    rows merged in size order. The files must agree on collective, dtype, ranks, mode and machine, and no size may
    come twice (a ResultsError naming the file and field otherwise)."""
    first, *rest = [read_bench(p) for p in paths]
    if not rest:
        return first  # one file: its rows as they are
    rows = {r.size: (r, paths[0]) for r in first.rows}
    for path, bench in zip(paths[1:], rest, strict=True):
        for field in ("collective", "dtype", "nranks", "mode", "machine"):
            mine, theirs = getattr(bench, field), getattr(first, field)
            if mine != theirs:
                raise ResultsError(
                    f"bench results {path}: {field}: {short_repr(mine)}, where {paths[0]} has {short_repr(theirs)} "
                    "(files merged into one table must be of one benchmark)"
                )
        for r in bench.rows:
            if r.size in rows:
                raise ResultsError(
                    f"bench results {path}: rows: size {r.size} is also in {rows[r.size][1]} (each size once)"
                )
            rows[r.size] = (r, path)
    return replace(first, rows=tuple(rows[size][0] for size in sorted(rows)))


def read_frontier(path: str | Path) -> Frontier:
    """One ``weft.frontier/1`` file, as ``weft synth --method smt --pareto -o DIR`` writes it."""
    f = _Fields("frontier", str(path))
    doc = f.obj(read_json(path, f.kind, ResultsError), "(top level)")
    if doc.get("format") != FRONTIER_FORMAT:
        raise f.fail("format", f"must be {FRONTIER_FORMAT!r}, got {short_repr(doc.get('format'))}")
    points = []
    for i, value in enumerate(f.rows(doc.get("points"), "points")):
        where = f"points[{i}]"
        p = f.obj(value, where)
        for key in ("steps", "rounds_per_chunk"):
            if key not in p:
                raise f.fail(f"{where}.{key}", "missing")
        optional = {
            key: None if p.get(key) is None else f.int(p[key], f"{where}.{key}", 1, MAX_STEPS)
            for key in ("rounds", "chunks")
        }
        points.append(
            FrontierRow(
                steps=f.int(p["steps"], f"{where}.steps", 1, MAX_STEPS),
                rounds_per_chunk=f.number(
                    p["rounds_per_chunk"], f"{where}.rounds_per_chunk", 0, MAX_STEPS, "a number of rounds"
                ),
                **optional,
            )
        )
    lp_bound = doc.get("lp_bound")
    if lp_bound is not None:
        lp_bound = f.number(lp_bound, "lp_bound", 0, MAX_STEPS, "a number of rounds")
    return Frontier(
        collective=f.text(doc, "collective", "collective"),
        topology=f.text(doc, "topology", "topology"),
        points=tuple(points),
        lp_bound=lp_bound,
    )
