"""The Schedule IR (``weft.schedule/1``): which chunk crosses which rank pair at which step.

Within a step every send reads the state at the start of the step and its write lands at the end, so the
sends of one step are simultaneous. ``op`` is ``copy`` (overwrite) or ``reduce`` (add into). ``rounds`` is
SCCL's bandwidth multiplier: a step of r rounds may carry r × a link's chunk capacity over that link.

>>> from schedules.collectives import Collective
>>> s = Schedule(Collective("allgather", 2), "topo-0", (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),))
>>> s.nsteps, s.total_rounds, len(s.content_hash)
(1, 1, 16)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schedules.collectives import Collective, CollectiveError
from weftcore.errors import WeftError
from weftcore.jsonfile import read_json, short_repr, write_text

FORMAT = "weft.schedule/1"
COMPACT_FORMAT = "weft.schedule/2"  # /1 plus an optional symmetry (schedules.compact); readers take both
FORMATS = (FORMAT, COMPACT_FORMAT)
OPS = ("copy", "reduce")


class ScheduleError(WeftError):
    """A schedule file is malformed."""


@dataclass(frozen=True)
class Send:
    chunk: int
    src: int
    dst: int
    op: str = "copy"


@dataclass(frozen=True)
class Step:
    rounds: int
    sends: tuple[Send, ...]


@dataclass(frozen=True)
class Symmetry:
    """A generator g: rank r -> ranks[r], chunk c -> chunks[c], with g^order the identity. A compact schedule's
    listed steps stand for all their images under its generators (schedules.compact)."""

    ranks: tuple[int, ...]
    chunks: tuple[int, ...]
    order: int
    shift: int = 0  # steps each application moves a send later: waves of a pipeline (see schedules.compact)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ranks": list(self.ranks), "chunks": list(self.chunks), "order": self.order}
        if self.shift:
            doc["shift"] = self.shift
        return doc


@dataclass(frozen=True)
class ScheduleMeta:
    """Provenance and scores; not part of the content hash."""

    solver: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    solve_time: float = 0.0
    predicted_us: dict[str, float] = field(default_factory=dict)
    pct_of_bound: float | None = None
    notes: str = ""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"solver": self.solver, "options": self.options, "solve_time": self.solve_time}
        if self.predicted_us:
            doc["predicted_us"] = self.predicted_us
        if self.pct_of_bound is not None:
            doc["pct_of_bound"] = self.pct_of_bound
        if self.notes:
            doc["notes"] = self.notes
        return doc


@dataclass(frozen=True, repr=False)
class Schedule:
    collective: Collective
    topology: str
    steps: tuple[Step, ...]
    name: str = ""
    meta: ScheduleMeta = field(default_factory=ScheduleMeta, compare=False)
    symmetries: tuple[Symmetry, ...] = ()  # compact form: ``steps`` are listed once and repeated by these
    step_rounds: tuple[int, ...] = ()  # with a shifting symmetry: the rounds of every step of the whole schedule

    @property
    def nsteps(self) -> int:
        return len(self.step_rounds) if self.step_rounds else len(self.steps)

    def __repr__(self) -> str:
        """One line: what the schedule is, never its sends."""
        c = self.collective
        return (
            f"Schedule({self.name!r}, {c.name}, {c.nranks} ranks, {c.chunks} chunks per rank, "
            f"{self.nsteps} steps, {self.nsends} sends, {self.topology})"
        )

    @property
    def total_rounds(self) -> int:
        return sum(self.step_rounds) if self.step_rounds else sum(step.rounds for step in self.steps)

    @property
    def nsends(self) -> int:
        """Sends of the whole schedule (a compact schedule's images counted)."""
        listed = sum(len(step.sends) for step in self.steps)
        return listed * self.images

    @property
    def images(self) -> int:
        """How many images of the listed steps the schedule is (1 unless compact)."""
        return math.prod(g.order for g in self.symmetries)

    def content(self) -> dict[str, Any]:
        """The algorithm itself: what the content hash covers."""
        doc: dict[str, Any] = {
            "collective": self.collective.to_json(),
            "topology": self.topology,
            "steps": [
                {"rounds": st.rounds, "sends": [[s.chunk, s.src, s.dst, s.op] for s in st.sends]} for st in self.steps
            ],
        }
        if self.symmetries:
            doc["symmetries"] = [g.to_json() for g in self.symmetries]
        if self.step_rounds:
            doc["step_rounds"] = list(self.step_rounds)
        return doc

    @property
    def content_hash(self) -> str:
        data = json.dumps(self.content(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(data).hexdigest()[:16]

    def with_meta(self, **changes: Any) -> Schedule:
        return replace(self, meta=replace(self.meta, **changes))

    def to_json(self) -> dict[str, Any]:
        content = self.content()
        doc = {
            "format": COMPACT_FORMAT if self.symmetries else FORMAT,
            "name": self.name,
            "collective": content["collective"],
            "topology": self.topology,
            "nchunks": self.collective.nchunks,
            "hash": self.content_hash,
            "meta": self.meta.to_json(),
        }
        if self.symmetries:
            doc["nsends"] = self.nsends
            doc["symmetries"] = content["symmetries"]
        if self.step_rounds:
            doc["step_rounds"] = content["step_rounds"]
        doc["steps"] = content["steps"]
        return doc


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    write_text(path, dumps_schedule(schedule), "schedule", ScheduleError)


def dumps_schedule(schedule: Schedule) -> str:
    """Pretty JSON with one send per line, so schedules diff well."""
    doc = schedule.to_json()
    steps = doc.pop("steps")
    symmetries = doc.pop("symmetries", None)
    step_rounds = doc.pop("step_rounds", None)
    head = json.dumps(doc, indent=2)[:-2]
    if step_rounds:
        head += f',\n  "step_rounds": {json.dumps(step_rounds)}'
    if symmetries:  # one line per generator: a 1024-rank permutation is one long line, not 1024 short ones
        head += ',\n  "symmetries": [\n' + ",\n".join(f"    {json.dumps(g)}" for g in symmetries) + "\n  ]"
    lines = []
    for st in steps:
        sends = ",\n        ".join(json.dumps(s) for s in st["sends"])
        lines.append(f'    {{"rounds": {st["rounds"]}, "sends": [\n        {sends}\n    ]}}')
    return head + ',\n  "steps": [\n' + ",\n".join(lines) + "\n  ]\n}\n"


def load_schedule(path: str | Path) -> Schedule:
    return parse_schedule(read_json(path, "schedule", ScheduleError), str(path))


MAX_ROUNDS = 1 << 32  # rounds of one step: far beyond any schedule (a step needs at most its chunks' count)


def _int(value: object, field_name: str, source: str, low: int = 0, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ScheduleError(f"schedule {source}: {field_name}: must be an integer {bound}, got {short_repr(value)}")
    return value


def parse_schedule(data: object, source: str) -> Schedule:
    """Build a Schedule from decoded JSON. Structural checks only; ``verify`` proves it."""
    if not isinstance(data, dict):
        raise ScheduleError(f"schedule {source}: (top level): must be a JSON object")
    if data.get("format") not in FORMATS:
        raise ScheduleError(
            f"schedule {source}: format: must be {FORMAT!r} or {COMPACT_FORMAT!r}, got {data.get('format')!r}"
        )
    try:
        collective = Collective.from_json(data.get("collective"), f"schedule {source}")
    except CollectiveError as e:
        raise ScheduleError(str(e)) from None
    topology = data.get("topology")
    if not isinstance(topology, str):
        raise ScheduleError(f"schedule {source}: topology: must be a topology fingerprint string")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        raise ScheduleError(f"schedule {source}: steps: must be a list")
    steps = _parse_steps(raw_steps, collective, source)
    meta = _parse_meta(data, source)
    symmetries: tuple[Symmetry, ...] = ()
    if data.get("symmetries") is not None:
        raw = data["symmetries"]
        if data["format"] != COMPACT_FORMAT:
            raise ScheduleError(f"schedule {source}: symmetries: only a {COMPACT_FORMAT} schedule has them")
        if not isinstance(raw, list) or len(raw) > MAX_GENERATORS:
            raise ScheduleError(f"schedule {source}: symmetries: must be a list of at most {MAX_GENERATORS}")
        symmetries = tuple(_symmetry(g, collective, f"{source}: symmetries[{i}]") for i, g in enumerate(raw))
    step_rounds = data.get("step_rounds") or []
    if step_rounds and data["format"] != COMPACT_FORMAT:
        raise ScheduleError(f"schedule {source}: step_rounds: only a {COMPACT_FORMAT} schedule has them")
    if not isinstance(step_rounds, list) or len(step_rounds) > MAX_STEPS:
        raise ScheduleError(f"schedule {source}: step_rounds: must be a list of at most {MAX_STEPS} integers")
    step_rounds = tuple(_int(r, f"step_rounds[{i}]", source, 1) for i, r in enumerate(step_rounds))
    schedule = Schedule(collective, topology, tuple(steps), str(data.get("name", "")), meta, symmetries, step_rounds)
    stated = data.get("hash")
    if stated is not None and stated != schedule.content_hash:
        raise ScheduleError(
            f"schedule {source}: hash: the file says {stated} but its content hashes to {schedule.content_hash} "
            "(edited by hand?)"
        )
    return schedule


def _parse_steps(raw_steps: list[Any], collective: Collective, source: str) -> list[Step]:
    """The listed steps, each send checked against the collective's ranks and chunks."""
    steps = []
    for i, st in enumerate(raw_steps):
        if not isinstance(st, dict) or not isinstance(st.get("sends"), list):
            raise ScheduleError(f"schedule {source}: steps[{i}]: must be an object with 'rounds' and 'sends'")
        rounds = _int(st.get("rounds"), f"steps[{i}].rounds", source, 1, MAX_ROUNDS)
        sends = []
        for j, s in enumerate(st["sends"]):
            where = f"steps[{i}].sends[{j}]"
            if not isinstance(s, list) or len(s) != 4:
                raise ScheduleError(f"schedule {source}: {where}: must be [chunk, src, dst, op]")
            chunk = _int(s[0], f"{where}.chunk", source)
            if chunk >= collective.nchunks:
                raise ScheduleError(
                    f"schedule {source}: {where}.chunk: chunk {chunk} does not exist ({collective.nchunks} chunks)"
                )
            src = _int(s[1], f"{where}.src", source)
            dst = _int(s[2], f"{where}.dst", source)
            for name, r in (("src", src), ("dst", dst)):
                if r >= collective.nranks:
                    raise ScheduleError(
                        f"schedule {source}: {where}.{name}: rank {r} does not exist ({collective.nranks} ranks)"
                    )
            if s[3] not in OPS:
                raise ScheduleError(f"schedule {source}: {where}.op: must be 'copy' or 'reduce', got {s[3]!r}")
            sends.append(Send(chunk, src, dst, s[3]))
        steps.append(Step(rounds, tuple(sends)))
    return steps


def _parse_meta(data: dict[str, Any], source: str) -> ScheduleMeta:
    """The provenance block (absent or not an object: empty), its typed fields checked."""
    meta_doc = data.get("meta", {}) if isinstance(data.get("meta"), dict) else {}
    for key, kind, what in (
        ("options", dict, "an object"),
        ("predicted_us", dict, "an object of sizes to µs"),
        ("solve_time", (int, float), "a number of seconds"),
    ):
        value = meta_doc.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ScheduleError(f"schedule {source}: meta.{key}: must be {what}, got {value!r}")
    return ScheduleMeta(
        solver=str(meta_doc.get("solver", "")),
        options=dict(meta_doc.get("options", {}) or {}),
        solve_time=float(meta_doc.get("solve_time", 0.0) or 0.0),
        predicted_us=dict(meta_doc.get("predicted_us", {}) or {}),
        pct_of_bound=meta_doc.get("pct_of_bound"),
        notes=str(meta_doc.get("notes", "")),
    )


MAX_GENERATORS = 64
MAX_STEPS = 1 << 24


def _symmetry(doc: object, collective: Collective, source: str) -> Symmetry:
    """Structure only (lists of in-range integers, a positive order); verify proves it a symmetry."""
    if not isinstance(doc, dict):
        raise ScheduleError(f"schedule {source}: must be an object with 'ranks', 'chunks' and 'order'")
    maps = {}
    for key, size in (("ranks", collective.nranks), ("chunks", collective.nchunks)):
        values = doc.get(key)
        if not isinstance(values, list) or len(values) != size:
            raise ScheduleError(f"schedule {source}: {key}: must be a list of {size} integers")
        for i, v in enumerate(values):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < size:
                raise ScheduleError(f"schedule {source}: {key}[{i}]: must be an integer in 0..{size - 1}, got {v!r}")
        maps[key] = tuple(values)
    order = _int(doc.get("order"), "order", source, 1)
    if order > max(collective.nranks, collective.nchunks):
        raise ScheduleError(
            f"schedule {source}: order: {order} is more than a permutation of "
            f"{max(collective.nranks, collective.nchunks)} needs"
        )
    shift = _int(doc.get("shift", 0), "shift", source, 0)
    return Symmetry(maps["ranks"], maps["chunks"], order, shift)
