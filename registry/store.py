"""The plan registry: verified plans keyed by topology, collective, rank count and message-size range.

Layout (a local directory or any fsspec URL)::

    <root>/entries/<id>.json   one entry: key, provenance, timings and the plan itself, sorted keys; written as
                               ``weft.registry-entry/2`` (the plan's ops zlib-compressed, registry/pack.py),
                               read in that form and as ``/1`` (the plan pretty, one op per line)
    <root>/index.json          a summary of every entry, rebuildable from entries/ at any time
    <root>/baselines.json      NCCL's measured times per topology, collective and size (``weft bench --record``):
                               where NCCL measured faster than the best measured plan, selection picks NCCL
    <root>/norm.json           the fused all-reduce + add + RMSNorm call's measured times per topology, row length,
                               size and plan (``bench/norm_peers.py``, ``weft registry record``; registry/norms.py)

Commits are atomic (write a temporary file, then rename) and serialized by a file lock, so concurrent
writers never lose or tear an entry. Only plans whose verification record says they passed the reference
executor, for this very plan hash, can be committed; the record itself is made by weft's orchestration
(``weft.publish``), since registry/ cannot import the executor.

>>> reg = Registry("memory://doctest-registry")
>>> reg.entries()
[]
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeGuard

import fsspec
from filelock import FileLock, Timeout

from registry import norms
from registry.index import MODES, TIMING_TABLES, EntryKey, IndexRow, Mode, Timings, describes, interpolate, row_hash
from registry.pack import PACKED_FORMAT, pack, unpack
from schedules.collectives import NAMES as COLLECTIVES
from schedules.plan.io import parse_plan
from schedules.plan.types import Plan
from weftcore.errors import CheckFailed, WeftError
from weftcore.gcpause import collector_paused
from weftcore.jsonfile import MAX_FILE_BYTES, decode_json, one_line
from weftcore.jsonfile import short_repr as short

ENTRY_FORMAT = "weft.registry-entry/1"  # an entry document whole (``Entry.to_json``); files hold it packed (/2)
INDEX_FORMAT = "weft.registry-index/1"
BASELINES_FORMAT = "weft.registry-baselines/1"
TMP_MARK = ".tmp-"  # a file being written: <name>.tmp-<pid>-<random>, renamed over <name> when whole
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a file name in entries/, nothing that leaves it
FINGERPRINT = re.compile(r"topo-[0-9a-f]{16}")
MAX_DEPTH = 24  # provenance and the like: deeper than any record weft writes, shallow enough for every reader
log = logging.getLogger("weft.registry")


class RegistryError(WeftError):
    """A registry location, entry id or entry file is unusable."""


class NotVerified(CheckFailed):
    """The plan has no passing verification record for its own hash, so it cannot be committed."""


@dataclass(frozen=True)
class Entry:
    id: str
    key: EntryKey
    plan: Plan
    provenance: dict[str, Any]
    predicted_us: dict[int, float] = field(default_factory=dict)
    measured_us: dict[int, float] = field(default_factory=dict)
    measured_ll128_us: dict[int, float] = field(default_factory=dict)  # an LL plan run with LL128 lines
    measured_compiled_us: dict[int, float] = field(default_factory=dict)  # the plan compiled to its own kernel
    measured_ll128_compiled_us: dict[int, float] = field(default_factory=dict)  # both

    def __repr__(self) -> str:
        return f"Entry({self.id!r}, {self.plan!r})"

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(self.provenance.get("verification", {}).get("dtypes", ()))

    @property
    def timings(self) -> Timings:
        return Timings(self.plan.protocol, self.predicted_us, **self.measured_tables())

    def measured_tables(self) -> dict[str, dict[int, float]]:
        """Every measured table by its name (``Mode.table``), copied."""
        return {mode.table: dict(getattr(self, mode.table)) for mode in MODES}

    def with_measured(self, tables: dict[str, dict[int, float]]) -> Entry:
        """This entry with its measured tables replaced (``measured_tables``' names)."""
        changes: dict[str, Any] = {mode.table: dict(tables[mode.table]) for mode in MODES}
        return replace(self, **changes)

    def measured(self, ll128: bool = False, compiled: bool = False) -> bool:
        """Whether any time was measured (with LL128 lines too when ``ll128``, for an LL plan; as a compiled
        kernel too when ``compiled``)."""
        return self.timings.measured(ll128, compiled)

    def estimate_us(self, nbytes: int, ll128: bool = False, compiled: bool = False) -> tuple[str, float | None]:
        """('measured'|'predicted', time at nbytes) interpolated log-log between recorded sizes; with ``ll128`` (an
        executor that can move LL packets as LL128 lines) and ``compiled`` (one that can run a plan as its own
        kernel) the fastest of the times measured in the modes it may run."""
        basis, time_us, _ = self.estimate(nbytes, ll128, compiled)
        return basis, time_us

    def estimate(self, nbytes: int, ll128: bool = False, compiled: bool = False) -> tuple[str, float | None, Mode]:
        """``estimate_us`` and the mode that time was measured in (run the plan so)."""
        return self.timings.estimate(nbytes, ll128, compiled)

    def serves(self, topology: str | tuple[str, ...], collective: str, nranks: int, nbytes: int) -> bool:
        """Whether this entry may run ``collective`` on ``nranks`` ranks of ``topology`` at ``nbytes``: its key and
        its plan both say so (``parse_entry`` already refuses an entry whose key and plan disagree; this asks the
        plan again, as the executor does before it runs one). Sizes that are not multiples of the plan's granule
        run padded (``Plan.padding``). ``topology``: a fingerprint, or every fingerprint of one fabric
        (``Topology.fingerprints``)."""
        plan, known = self.plan, fingerprints(topology)
        return (
            self.key.topology in known
            and (plan.weft.topology or self.key.topology) in known
            and self.key.collective == collective == plan.collective
            and self.key.nranks == nranks == plan.nranks
            and self.key.covers(nbytes)
            and plan.runs(nbytes)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ENTRY_FORMAT,
            "id": self.id,
            "key": {
                "topology": self.key.topology,
                "collective": self.key.collective,
                "nranks": self.key.nranks,
                "min_bytes": self.key.min_bytes,
                "max_bytes": self.key.max_bytes,
            },
            "provenance": self.provenance,
            "timings": self._timings_json(),
            "plan": self.plan.to_json(),
        }

    def _timings_json(self) -> dict[str, Any]:
        return {
            "predicted_us": {str(k): v for k, v in sorted(self.predicted_us.items())},
            "measured_us": {str(k): v for k, v in sorted(self.measured_us.items())},
            **{
                mode.table: {str(k): v for k, v in sorted(getattr(self, mode.table).items())}
                for mode in MODES[1:]
                if getattr(self, mode.table)
            },
        }

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "topology": self.key.topology,
            "collective": self.key.collective,
            "nranks": self.key.nranks,
            "min_bytes": self.key.min_bytes,
            "max_bytes": self.key.max_bytes,
            "plan": self.plan.name,
            "plan_hash": self.plan.content_hash,
            "solver": self.provenance.get("solver", ""),
            "measured": any(self.measured_tables().values()),  # in any mode
        }

    def index_row(self, text: bytes | str) -> dict[str, Any]:
        """The entry's row in index.json, made from its file's ``text``: what selection reads (``IndexRow``)."""
        row = self.summary() | {
            "protocol": self.plan.protocol,
            "plan_topology": self.plan.weft.topology,
            "dtypes": list(self.dtypes),
            "topology_name": str(self.provenance.get("topology_name", "")),
            "timings": self._timings_json(),
        }
        return row | {"row_hash": row_hash(text, row)}


@dataclass(frozen=True)
class Selection:
    """The best entry for a size, or ``entry=None`` with the reason (the executor then falls back to NCCL)."""

    entry: Entry | None
    basis: str
    time_us: float | None
    reason: str = ""
    skipped: tuple[str, ...] = ()
    lines: bool = False  # run the entry's LL plan with LL128 lines (select(..., ll128=True) measured it faster so)
    warnings: tuple[str, ...] = ()  # side files ignored (a damaged or stale index.json, baselines.json), one line each
    refused: tuple[str, ...] = ()  # entries that would have won but their plan failed ``trust`` (id: why)
    nearest: tuple[tuple[str, str, int], ...] = ()  # no plan: (topology, its name, nranks) holding this collective
    detail: str = ""  # no plan: why the entries keyed for this call do not run its size (their plan's refusal)
    compiled: bool = False  # run the plan as its own compiled kernel (select(..., compiled=True) measured it faster)

    def __repr__(self) -> str:
        if self.entry is None:
            return f"Selection(None, {self.basis}: {self.reason})"
        time = "no time" if self.time_us is None else f"{self.time_us:.2f} µs"
        return f"Selection({self.entry.plan.name!r}, entry {self.entry.id}, {self.basis} {time})"


# what commit_all commits: (plan, topology fingerprint, provenance, predicted µs by size, measured entry or None)
CommitItem = tuple[Plan, str, dict[str, Any], dict[int, float] | None, Entry | None]


def nccl_faster(nccl_us: dict[int, float], nbytes: int, basis: str, time_us: float | None) -> float | None:
    """NCCL's time at ``nbytes`` where it was measured faster than a plan's measured ``time_us``, else None.

    Only inside the sizes NCCL was measured at (interpolated between them), and only against a measurement: a
    prediction is not comparable with a time on the machine."""
    if basis != "measured" or time_us is None or not nccl_us or not min(nccl_us) <= nbytes <= max(nccl_us):
        return None
    nccl = interpolate(nccl_us, nbytes)
    return nccl if nccl < time_us else None


def contenders_at(
    entries: Sequence[Entry], sizes: Sequence[int], top: int, ll128: bool = False, compiled: bool = False
) -> dict[int, list[Entry]]:
    """Each of ``sizes``' ``top`` fastest entries, in selection's order (``Timings.rank``: measured times first, in
    the modes a run may use, ``ll128`` and ``compiled``, then predicted ones); an entry whose plan does not run a
    size, or has no time, is not kept for it."""
    by_id = {e.id: e for e in entries}
    kept: dict[int, list[Entry]] = {}
    for nbytes in sizes:
        ranked = sorted(
            (*e.timings.rank(nbytes, ll128, compiled), e.id)
            for e in entries
            if e.key.covers(nbytes) and e.plan.runs(nbytes)
        )
        kept[nbytes] = [by_id[entry_id] for _, time_us, entry_id in ranked[:top] if time_us < math.inf]
    return kept


def ranked_anywhere(entries: Sequence[Entry], ranked: dict[int, list[Entry]]) -> list[Entry]:
    """The entries that ``ranked`` (``contenders_at``'s) keeps at any size, in ``entries``' order: ``weft bench
    --top`` loads only these, and times each at the sizes where it ranks, so that a registry of many variants is
    measured again where it matters."""
    kept = {e.id for at_size in ranked.values() for e in at_size}
    return [e for e in entries if e.id in kept]


def default_location() -> str:
    """``$WEFT_REGISTRY``, otherwise the user data directory."""
    env = os.environ.get("WEFT_REGISTRY")
    if env:
        return env
    import platformdirs

    return str(Path(platformdirs.user_data_dir("weft")) / "registry")


def entry_id(plan: Plan, topology: str) -> str:
    digest = hashlib.sha256(f"{topology}/{plan.content_hash}".encode()).hexdigest()[:12]
    return f"{plan.collective}-{plan.nranks}r-{digest}"


ONE_LINE_DEPTH = 7  # an entry's plan ops (entry, plan, gpus, gpu, threadblocks, threadblock, ops, op)


def dumps(doc: dict[str, Any]) -> str:
    """Deterministic, pretty JSON so that a registry kept in git reviews well: two-space indents down to
    ``ONE_LINE_DEPTH``, where each value (a plan's op) takes one line. Indenting every field of every op made a
    128-instance plan's entry 2.5 times larger, for no reviewer's benefit."""
    return _pretty(doc, 0) + "\n"


def _pretty(value: object, depth: int) -> str:
    if not isinstance(value, (dict, list)) or not value or depth >= ONE_LINE_DEPTH:
        return json.dumps(value, sort_keys=True)
    pad, end = "  " * (depth + 1), "  " * depth
    if isinstance(value, dict):
        items = ",\n".join(f"{pad}{json.dumps(k)}: {_pretty(value[k], depth + 1)}" for k in sorted(value))
        return f"{{\n{items}\n{end}}}"
    items = ",\n".join(pad + _pretty(v, depth + 1) for v in value)
    return f"[\n{items}\n{end}]"


def entry_text(entry: Entry) -> str:
    """An entry's file as weft writes it: ``weft.registry-entry/2``, the plan's ops packed (registry_pack)."""
    return dumps(pack(entry.to_json()))


LOCK_WAIT_S = 120  # another writer's commit (proofs run before the lock, so a holder only writes files)
LOCK_NOTICE_S = 2  # after this long waiting for the lock, progress says so


def _why(e: BaseException) -> str:
    """A backend's exception in a few words on one line (fsspec raises whatever its backend does)."""
    text = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__
    return one_line(f"{type(e).__name__}: {text}" if not isinstance(e, OSError) else text)[:300]


class Registry:
    """A registry at a local path or fsspec URL (``memory://``, ``s3://``, ...)."""

    def __init__(self, location: str | os.PathLike[str] | None = None) -> None:
        self.location = str(location) if location else default_location()
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.location)
        except Exception as e:  # noqa: BLE001 (an unknown protocol, a missing argument, a host that does not resolve)
            raise RegistryError(f"registry {self.location}: cannot open: {_why(e)}") from None
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if self.local and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise RegistryError(f"registry {self.location}: not a directory")

    # ---- paths, the backend and locking ----------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def entry_path(self, id: str) -> str:
        if not isinstance(id, str) or not ID_PATTERN.fullmatch(id):  # an id names a file in entries/, nothing else
            raise RegistryError(
                f"registry {self.location}: no entry {id!r} (an entry id is a file name in entries/, "
                "as `weft registry list` shows it)"
            )
        return self._path("entries", f"{id}.json")

    @contextmanager
    def _backend(self, doing: str) -> Iterator[None]:
        """Any error of the storage backend, as one line naming the registry (``doing``: "read", "write", ...)."""
        try:
            yield
        except WeftError:
            raise
        except Exception as e:  # noqa: BLE001 (fsspec backends raise their own kinds: socket, zip, HTTP errors)
            raise RegistryError(f"registry {self.location}: cannot {doing}: {_why(e)}") from None

    def exists(self, path: str) -> bool:
        with self._backend("read"):
            return bool(self.fs.exists(path))

    @contextmanager
    def _locked(self, progress: Callable[[str], None] | None = None) -> Iterator[None]:
        """The registry's lock around a change; a location that cannot be written is one line naming it, at once."""
        with nullcontext() if self.local else self._backend("write"):  # a local disk's errors are OSErrors
            try:
                if self.local:
                    self.fs.makedirs(self.root, exist_ok=True)
                    lock_path = self._path(".lock")
                else:
                    import platformdirs

                    lock_dir = Path(platformdirs.user_cache_dir("weft")) / "locks"
                    lock_dir.mkdir(parents=True, exist_ok=True)
                    lock_path = str(lock_dir / (hashlib.sha256(self.location.encode()).hexdigest()[:16] + ".lock"))
                with open(lock_path, "a"):  # an unwritable place fails here, at once (FileLock retries until timeout)
                    pass
                lock = FileLock(lock_path)
                try:
                    lock.acquire(timeout=LOCK_NOTICE_S)
                except Timeout:
                    if progress:
                        progress(f"waiting for another writer's lock on {self.location} (at most {LOCK_WAIT_S} s)")
                    lock.acquire(timeout=LOCK_WAIT_S)
                try:
                    yield
                finally:
                    lock.release()
            except OSError as e:
                raise RegistryError(f"registry {self.location}: cannot write: {e.strerror or e}") from None

    def _write_atomic(self, path: str, text: str) -> None:
        tmp = f"{path}{TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(tmp, "w") as f:
            f.write(text)
        try:
            _rename(self.fs, tmp, path)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
            raise

    # ---- reading -------------------------------------------------------------------------------
    def _listing(self, directory: str) -> list[str]:
        with self._backend("read"):
            if not self.fs.exists(directory):
                return []
            return sorted(str(p) for p in self.fs.ls(directory, detail=False))

    def _entry_files(self) -> list[str]:
        return [p for p in self._listing(self._path("entries")) if p.endswith(".json")]

    def _read_bytes(self, path: str, what: str) -> bytes:
        """The file's bytes; unreadable, too large or not a regular file, one line naming it."""
        if self.local:
            from weftcore.jsonfile import read_bytes

            return read_bytes(path, what, RegistryError)
        try:
            with self._backend("read"), self.fs.open(path, "rb") as f:
                data: bytes = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise RegistryError(f"{what} {path}: cannot read: {e.strerror or e}") from None
        if len(data) > MAX_FILE_BYTES:
            raise RegistryError(f"{what} {path}: cannot read: more than {MAX_FILE_BYTES >> 20} MiB")
        return data

    def _read_json(self, path: str, what: str) -> object:
        """The decoded file; unreadable, malformed, too large, too deep or not a regular file, one line naming it
        (``what``: "registry entry", "registry")."""
        return decode_json(self._read_bytes(path, what), what, path, RegistryError)

    def _parse(self, path: str, data: bytes) -> Entry:
        return parse_entry(decode_json(data, "registry entry", path, RegistryError), path, _stem(path))

    def read_entry_file(self, path: str) -> Entry:
        return self._parse(path, self._read_bytes(path, "registry entry"))

    def _load_with_text(self) -> tuple[list[tuple[Entry, bytes]], list[str]]:
        entries, bad = [], []
        with collector_paused():  # every entry's plan, decoded and parsed: no cycles to collect (weftcore.gcpause)
            for path in self._entry_files():
                try:
                    data = self._read_bytes(path, "registry entry")
                    entries.append((self._parse(path, data), data))
                except WeftError as e:
                    bad.append(one_line(str(e)))
        return entries, bad

    def load(self) -> tuple[list[Entry], list[str]]:
        """Every readable entry, and one warning line per entry file that could not be read."""
        found, bad = self._load_with_text()
        return [e for e, _ in found], bad

    def entries(self, topology: str | tuple[str, ...] | None = None, collective: str | None = None) -> list[Entry]:
        found, bad = self.load()
        for line in bad:
            log.warning("skipping %s", line)
        return [
            e
            for e in found
            if (topology is None or e.key.topology in fingerprints(topology))
            and (collective is None or e.key.collective == collective)
        ]

    def baselines(self) -> dict[str, Any]:
        """baselines.json: {"format", "nccl_us": {topology: {collective: {bytes: µs}}}} (empty if none yet)."""
        path = self._path("baselines.json")
        if not self.exists(path):
            return {"format": BASELINES_FORMAT, "nccl_us": {}}
        return parse_baselines(self._read_json(path, "registry"), path)

    def baselines_or_none(self) -> tuple[dict[str, Any], str]:
        """``baselines`` and '', or no NCCL times and the one-line warning where baselines.json is damaged: NCCL's
        times are advisory, and a damaged file never costs the plans."""
        try:
            return self.baselines(), ""
        except RegistryError as e:
            return {"format": BASELINES_FORMAT, "nccl_us": {}}, f"{one_line(str(e))}; NCCL's times ignored"

    def norms(self) -> dict[str, Any]:
        """norm.json (registry/norms.py; empty if none yet), checked: RegistryError naming the field otherwise."""
        path = self._path("norm.json")
        if not self.exists(path):
            return norms.empty()
        try:
            return norms.parse_norms(self._read_json(path, "registry"), _size, measured_us)
        except ValueError as e:
            raise RegistryError(f"registry {path}: {e}") from None

    def norms_or_none(self) -> tuple[dict[str, Any], str]:
        """``norms`` and '', or no fused-call times and the one-line warning where norm.json is damaged (advisory,
        as baselines.json: selection then ranks the fused call's plans by their all-reduce times)."""
        try:
            return self.norms(), ""
        except RegistryError as e:
            return norms.empty(), f"{one_line(str(e))}; the fused call's times ignored"

    def norm_times(self, topology: str | tuple[str, ...], row_elems: int) -> dict[str, dict[int, float]]:
        """The fused call's measured times on ``topology`` for rows of ``row_elems``: plan hash + mode suffix ->
        {bytes: µs} (registry/norms.py)."""
        return norms.times_for(self.norms(), fingerprints(topology), row_elems)

    def record_norm_timings(self, times: dict[str, dict[int, dict[int, dict[str, float]]]]) -> None:
        """Store the fused call's measured times ({topology: {row_elems: {bytes: {plan hash + mode suffix: µs}}}})
        over those norm.json holds, checked before it is written; a damaged norm.json is replaced."""
        with self._locked():
            path = self._path("norm.json")
            _replaceable(self, path)
            text = dumps(norms.with_times(self.norms_or_none()[0], times))
            try:
                norms.parse_norms(decode_json(text, "registry", path, RegistryError), _size, measured_us)
            except ValueError as e:
                raise RegistryError(f"registry record: {e}") from None
            self._write_atomic(path, text)

    def nccl_times(self, topology: str | tuple[str, ...], collective: str) -> dict[int, float]:
        """NCCL's measured times on ``topology`` (bytes -> µs), as ``weft bench --record`` stored them: every
        fingerprint the fabric answers to together, its own fingerprint's time winning at a size both recorded."""
        tables = self.baselines()["nccl_us"]
        table: dict[str, Any] = {}
        for f in reversed(fingerprints(topology)):  # a legacy fingerprint's times first, the fabric's own over them
            table.update(tables.get(f, {}).get(collective, {}))
        return {int(k): float(v) for k, v in table.items()}

    def get(self, id: str) -> Entry:
        path = self.entry_path(id)
        if not self.exists(path):
            raise RegistryError(f"registry {self.location}: no entry {id!r}")
        return self.read_entry_file(path)

    def index(self) -> dict[str, Any]:
        """index.json, checked (RegistryError where it is damaged: ``rebuild-index`` makes it afresh)."""
        path = self._path("index.json")
        if not self.exists(path):
            return {"format": INDEX_FORMAT, "entries": []}
        return parse_index(self._read_json(path, "registry"), path)

    def _index_rows(self) -> tuple[dict[str, dict[str, Any]], str]:
        """index.json's rows by id, and '' or the warning that it is damaged and ignored."""
        try:
            return {row["id"]: row for row in self.index()["entries"]}, ""
        except RegistryError as e:
            return {}, f"{one_line(str(e))}; ignored (`weft registry rebuild-index` repairs it)"

    def rows(self) -> RowScan:
        """An index row for every readable entry: index.json's where it still describes the entry file (its
        ``row_hash``), else made from the entry itself (parsed; kept in ``RowScan.parsed``). Only the entry files'
        bytes are read and hashed, so a current index spares parsing every plan."""
        listed, warning = self._index_rows()
        scan = RowScan([], {}, {}, [], [warning] if warning else [])
        stale = 0
        for path in self._entry_files():
            try:
                data = self._read_bytes(path, "registry entry")
            except WeftError as e:
                scan.bad.append(one_line(str(e)))
                continue
            stem = _stem(path)
            scan.paths[stem] = (path, data)
            row = listed.get(stem)
            if describes(row, data):
                try:
                    scan.rows.append(IndexRow.from_json(row))
                    continue
                except (KeyError, TypeError, ValueError, AttributeError):
                    pass
            try:
                entry = self._parse(path, data)
            except WeftError as e:  # named in ``bad``: its row's age is beside the point
                scan.bad.append(one_line(str(e)))
                continue
            stale += bool(listed)
            scan.parsed[stem] = entry
            scan.rows.append(IndexRow.from_json(entry.index_row(data)))
        if stale:
            scan.warnings.append(
                f"registry {self.location}: index.json does not describe "
                f"{stale} of {len(scan.paths)} entries (read from their files instead; "
                "`weft registry rebuild-index` repairs it)"
            )
        return scan

    def entry_of(self, scan: RowScan, row: IndexRow) -> Entry:
        """The entry a row names, parsed from the bytes the scan read; RegistryError where the row does not
        describe it (index.json edited: the row is not used)."""
        if row.id in scan.parsed:
            return scan.parsed[row.id]
        path, data = scan.paths[row.id]
        entry = self._parse(path, data)
        scan.parsed[row.id] = entry
        if IndexRow.from_json(entry.index_row(data)) != row:
            raise RegistryError(
                f"registry {self.location}: index.json: row {row.id} does not describe its entry "
                "file; ignored (`weft registry rebuild-index` repairs it)"
            )
        return entry

    def rebuilt_index(self) -> tuple[dict[str, Any], list[str]]:
        """The index of every readable entry, and one line per entry file left out because it is unreadable."""
        found, bad = self._load_with_text()
        rows = sorted((e.index_row(data) for e, data in found), key=lambda s: s["id"])
        return {"format": INDEX_FORMAT, "entries": rows}, bad

    # ---- recovery ----------------------------------------------------------------------------------------------
    def orphans(self) -> list[str]:
        """Temporary files that a writer killed between its write and its rename left behind."""
        return [
            p
            for directory in (self.root, self._path("entries"))
            for p in self._listing(directory)
            if TMP_MARK in _stem(p)
        ]

    def index_problems(self) -> list[str]:
        """One line per way index.json disagrees with the readable entry files (a row missing, out of date or
        naming no file), or that it is damaged; [] where it describes every readable entry."""
        listed, warning = self._index_rows()
        if warning:
            return [warning]
        problems = []
        for path in self._entry_files():
            stem = _stem(path)
            row = listed.pop(stem, None)
            try:
                data = self._read_bytes(path, "registry entry")
                if describes(row, data):
                    continue
                self._parse(path, data)
            except WeftError:
                continue  # an unreadable entry is verify's own finding, and has no row to have
            problems.append(
                f"index.json: no row for entry {stem}"
                if row is None
                else f"index.json: the row for entry {stem} is out of date"
            )
        problems += [f"index.json: row {id} names no entry file" for id in sorted(listed)]
        return problems

    # ---- writing: every file is checked by the reader that reads it back, all before the first is written --------
    def _entry_text(self, entry: Entry) -> tuple[str, str]:
        path = self.entry_path(entry.id)
        text = entry_text(entry)
        parse_entry(decode_json(text, "registry entry", path, RegistryError), path, entry.id)
        return path, text

    def _index_text(self, add: Sequence[tuple[Entry, str]] = (), remove: str | None = None) -> tuple[str, str]:
        path = self._path("index.json")
        _replaceable(self, path)
        rows, warning = self._index_rows()
        if warning:  # a damaged index is rebuilt from the entries, never trusted
            rows = {row["id"]: row for row in self.rebuilt_index()[0]["entries"]}
        for entry, text in add:
            rows[entry.id] = entry.index_row(text)
        if remove is not None:
            rows.pop(remove, None)
        text = dumps({"format": INDEX_FORMAT, "entries": [rows[k] for k in sorted(rows)]})
        parse_index(decode_json(text, "registry", path, RegistryError), path)
        return path, text

    def _write_all(self, files: list[tuple[str, str]]) -> None:
        for path, text in files:
            self._write_atomic(path, text)

    def commit(
        self,
        plan: Plan,
        topology: str | None = None,
        provenance: dict[str, Any] | None = None,
        predicted_us: dict[int, float] | None = None,
        measured: Entry | None = None,
    ) -> Entry:
        """Store a verified plan; raises NotVerified unless provenance holds a passing record for this plan.
        ``measured``: an exported entry of this plan whose measured times come along (``registry import``).
        To prove a plan and commit it in one call, use ``weft.commit(plan, topology, registry)``."""
        if topology is None or provenance is None:
            raise NotVerified(
                f"plan {plan.name}: Registry.commit stores a plan with its proof; prove and commit it "
                f"with weft.commit(plan, topology, {self.location!r})"
            )
        return self.commit_all([(plan, topology, provenance, predicted_us, measured)])[0]

    def commit_all(self, items: Sequence[CommitItem], progress: Callable[[str], None] | None = None) -> list[Entry]:
        """Commit each (plan, topology, provenance, predicted_us, measured entry or None), all checked before the
        first is written: one bad item commits nothing."""
        entries = []
        for plan, topology, provenance, predicted_us, measured in items:
            require_verified(plan, provenance)
            key = EntryKey(topology, plan.collective, plan.nranks, plan.min_message_size, plan.max_message_size)
            entry = Entry(
                entry_id(plan, topology),
                key,
                plan,
                provenance,
                _times(dict(predicted_us or {}), "timings.predicted_us", f"plan {plan.name}"),
            )
            if measured is not None:
                entry = entry.with_measured(measured.measured_tables())
            entries.append(entry)
        with self._locked(progress):
            files = []
            for i, entry in enumerate(entries):
                path = self.entry_path(entry.id)
                if items[i][4] is None and self.exists(path):  # the same plan again: its measured times still hold
                    try:
                        old = self.read_entry_file(path)
                        entries[i] = entry = entry.with_measured(old.measured_tables())
                    except WeftError:
                        pass  # an unreadable old entry is simply replaced
                files.append(self._entry_text(entry))
            files.append(self._index_text(add=[(e, text) for e, (_, text) in zip(entries, files, strict=True)]))
            self._write_all(files)
        return entries

    def record_timing(self, id: str, nbytes: int, time_us: float, ll128: bool = False, compiled: bool = False) -> Entry:
        """Store a measured time, so that ``select`` prefers it over the prediction (``ll128``: measured with LL128
        lines, ``compiled``: as the plan's own kernel; only selections for an executor running those use them)."""
        return self.record_timings({id: [(nbytes, time_us, Mode(ll128, compiled))]})[0]

    def record_timings(
        self,
        times: dict[str, list[tuple[int, float, Mode]]],
        nccl: dict[str, dict[str, dict[int, float]]] | None = None,
    ) -> list[Entry]:
        """Store measured times per entry id, each (bytes, µs, the mode measured), and NCCL's measured times
        ({topology: {collective: {bytes: µs}}}), all checked before anything is written. A damaged baselines.json
        is replaced by NCCL's new times (it was advisory, and ignored)."""
        with self._locked():
            entries, files = [], []
            for id, rows in sorted(times.items()):
                entry = self.get(id)
                tables = entry.measured_tables()
                for nbytes, time_us, mode in rows:
                    tables[mode.table][nbytes] = time_us
                entry = entry.with_measured(tables)
                entries.append(entry)
                files.append(self._entry_text(entry))
            if nccl:
                _replaceable(self, self._path("baselines.json"))
                doc = self.baselines_or_none()[0]
                for topology, collectives in nccl.items():
                    for collective, table in collectives.items():
                        stored = doc["nccl_us"].setdefault(topology, {}).setdefault(collective, {})
                        stored.update({str(k): v for k, v in table.items()})
                path = self._path("baselines.json")
                text = dumps(doc)
                parse_baselines(decode_json(text, "registry", path, RegistryError), path)
                files.append((path, text))
            if entries:  # the entries' files come first (not strict: baselines.json may follow them)
                files.append(self._index_text(add=[(e, text) for e, (_, text) in zip(entries, files, strict=False)]))
            self._write_all(files)
        return entries

    def record_nccl(self, topology: str, collective: str, times_us: dict[int, float]) -> None:
        """Store NCCL's measured times (bytes -> µs) on ``topology``, measured in the same job as the plans' times,
        so that selection runs NCCL where it measured faster than every plan."""
        self.record_timings({}, {topology: {collective: times_us}})

    def remove(self, id: str) -> None:
        with self._locked():
            path = self.entry_path(id)
            if not self.exists(path):
                raise RegistryError(f"registry {self.location}: no entry {id!r}")
            index = self._index_text(remove=id)
            self.fs.rm(path)
            self._write_all([index])

    def compact(self) -> Compaction:
        """Rewrite every readable entry file not already as weft writes it (``entry_text``: /1 files become /2),
        and their index rows, all checked by the reader before the first file is written. An entry keeps its id,
        plan, provenance and timings: only its file's form changes. Unreadable entries are left as they are."""
        with self._locked():
            found, bad = self._load_with_text()
            stale = [(e, data) for e, data in found if data != entry_text(e).encode()]
            files = [self._entry_text(e) for e, _ in stale]
            if files:
                files.append(self._index_text(add=[(e, text) for (e, _), (_, text) in zip(stale, files, strict=True)]))
                self._write_all(files)
        before = sum(len(data) for _, data in found)
        after = before + sum(len(text.encode()) - len(data) for (_, data), (_, text) in zip(stale, files, strict=False))
        return Compaction(len(found), len(stale), before, after, bad)

    def rebuild_index(self) -> tuple[dict[str, Any], list[str]]:
        """index.json made afresh from the entry files, and the orphaned temporary files removed (under the lock,
        no writer is between its write and its rename); the lines name the entries left out as unreadable."""
        with self._locked():
            path = self._path("index.json")
            _replaceable(self, path)
            for orphan in self.orphans():
                self.fs.rm(orphan)
            index, bad = self.rebuilt_index()
            text = dumps(index)
            parse_index(decode_json(text, "registry", path, RegistryError), path)
            self._write_atomic(path, text)
        return index, bad

    # ---- selection -----------------------------------------------------------------------------
    def select(
        self,
        topology: str | tuple[str, ...],
        collective: str,
        nbytes: int,
        dtype: str | None = None,
        nranks: int | None = None,
        ll128: bool = False,
        trust: Callable[[Entry], str] | None = None,
        floor_us: float = 0.0,
        compiled: bool = False,
    ) -> Selection:
        """The best entry for this size: the lowest measured time, else the lowest predicted time (``ll128``: for an
        executor that can move LL packets as LL128 lines, whose measured times then count too; ``lines`` says
        whether the chosen time is one of them; ``compiled`` likewise for an executor that can run a plan as its own
        kernel, and the Selection's ``compiled``).

        Ranked from index rows; only the winner's entry is parsed, then asked again whether its plan serves the
        call, and ``trust`` (entry -> '' or why not: weft proves the plan on the reference executor) may refuse
        it, as may a measured time below ``floor_us`` (the fabric's latency): the next one is tried."""
        known = fingerprints(topology)  # a fabric answers to every fingerprint it has had (Topology.fingerprints)
        scan = self.rows()
        candidates = {r.id: r for r in scan.rows if r.may_serve(known, collective, nranks, nbytes, dtype)}
        refused, size_why, warnings = [], "", list(scan.warnings)
        while candidates:
            row = min(candidates.values(), key=lambda r: (*r.timings.rank(nbytes, ll128, compiled), r.id))
            del candidates[row.id]
            try:
                entry = self.entry_of(scan, row)
            except RegistryError as e:
                if row.id not in scan.parsed:  # the file no longer reads (a row made by a weft that read it)
                    scan.bad.append(one_line(str(e)))
                    continue
                warnings.append(one_line(str(e)))  # the row lied about its entry: rank it by what its file says
                entry = scan.parsed[row.id]
                true_row = IndexRow.from_json(entry.index_row(scan.paths[row.id][1]))
                if true_row.may_serve(known, collective, nranks, nbytes, dtype):
                    candidates[row.id] = true_row
                continue
            if not entry.serves(topology, collective, nranks or entry.plan.nranks, nbytes):
                size_why = size_why or _padding_refusal(entry, nbytes)
                continue
            basis, t, mode = entry.estimate(nbytes, ll128, compiled)
            if basis == "measured" and t is not None and t < floor_us:
                refused.append(f"{entry.id}: measured {t:.3g} µs, below the fabric's latency ({floor_us:g} µs)")
                continue
            why = trust(entry) if trust else ""
            if why:
                refused.append(f"{entry.id}: {one_line(why)}")
                continue
            baselines, warning = self.baselines_or_none()
            warnings += [warning] if warning else []
            tables = baselines["nccl_us"]
            table: dict[str, Any] = next((tables[f][collective] for f in known if collective in tables.get(f, {})), {})
            nccl = nccl_faster({int(k): float(v) for k, v in table.items()}, nbytes, basis, t)
            if nccl is not None and t is not None:  # (nccl_faster answers only against a time)
                return Selection(
                    None,
                    "nccl",
                    nccl,
                    nccl_reason(collective, nbytes, nccl, entry.plan.name, t),
                    tuple(scan.bad),
                    False,
                    tuple(warnings),
                    tuple(refused),
                )
            return Selection(
                entry,
                basis,
                t,
                "",
                tuple(scan.bad),
                mode.lines,
                tuple(warnings),
                tuple(refused),
                compiled=mode.compiled,
            )
        reason = (
            f"no plan for {collective} on {known[0]} at {nbytes} bytes"
            + (f" in {dtype}" if dtype else "")
            + (f" ({size_why})" if size_why else "")
            + (f" (refused: {'; '.join(refused)})" if refused else "")
        )
        nearest = sorted(
            {
                (r.key.topology, r.topology_name, r.key.nranks)
                for r in scan.rows
                if r.key.collective == collective
                and r.key.topology not in known
                and (nranks is None or r.key.nranks == nranks)
            }
        )
        return Selection(
            None,
            "none",
            None,
            reason,
            tuple(scan.bad),
            False,
            tuple(warnings),
            tuple(refused),
            tuple(nearest),
            size_why,
        )


def _replaceable(registry: Registry, path: str) -> None:
    """A side file weft is about to replace must be a regular file or absent: checked before the first file of a
    change is written, so a folder (or FIFO) in its place refuses the change whole, in one line."""
    if registry.local and os.path.lexists(path) and not os.path.isfile(path):
        raise RegistryError(
            f"registry {registry.location}: {_stem(path)}.json: not a regular file; move it away "
            "(`weft registry rebuild-index` then makes it afresh)"
        )


@dataclass(frozen=True)
class Compaction:
    """What ``Registry.compact`` did: readable entries, how many it rewrote, their files' bytes before and after,
    and one line per entry file left out as unreadable."""

    entries: int
    rewritten: int
    bytes_before: int
    bytes_after: int
    bad: list[str]


@dataclass
class RowScan:
    """What ``Registry.rows`` read: a row per readable entry, the entries it had to parse, each entry file's path
    and bytes (by id), the unreadable entries and the warnings about index.json (one line each)."""

    rows: list[IndexRow]
    parsed: dict[str, Entry]
    paths: dict[str, tuple[str, bytes]]
    bad: list[str]
    warnings: list[str]


def _padding_refusal(entry: Entry, nbytes: int) -> str:
    """Why the entry's plan does not run ``nbytes`` (its range or padding), or ''."""
    try:
        entry.plan.padding(nbytes)
    except WeftError as err:
        return str(err)
    return ""


def fingerprints(topology: str | tuple[str, ...]) -> tuple[str, ...]:
    """A fingerprint, or every fingerprint of one fabric, as a tuple (a lone string is one fingerprint)."""
    return (topology,) if isinstance(topology, str) else tuple(topology)


def _stem(path: str) -> str:
    name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-5] if name.endswith(".json") else name


def require_verified(plan: Plan, provenance: dict[str, Any]) -> None:
    """Raise NotVerified unless ``provenance`` holds a passing verification record for this very plan."""
    record = provenance.get("verification") or {}
    if not record.get("ok") or record.get("plan_hash") != plan.content_hash:
        raise NotVerified(
            f"plan {plan.name}: no passing verification record for plan hash {plan.content_hash}; "
            "run `weft verify` (only verified plans can be committed)"
        )


def _rename(fs: Any, src: str, dst: str) -> None:
    """Atomic on local disks (os.replace); fsspec's move elsewhere."""
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        os.replace(src, dst)
    else:
        fs.mv(src, dst)


def nccl_reason(collective: str, nbytes: int, nccl_us: float, plan: str, time_us: float) -> str:
    """The line selection gives, and inference jobs log, where NCCL runs because it measured faster."""
    return (
        f"NCCL measured faster for {collective} at {nbytes} bytes ({nccl_us:.1f} µs against {time_us:.1f} µs "
        f"for the fastest plan, {plan})"
    )


def _fail(source: str, where: str, message: str, kind: str = "registry entry") -> RegistryError:
    return RegistryError(f"{kind} {source}: {where}: {message}")


def _depth_within(value: object, limit: int) -> bool:
    """Whether ``value`` nests no deeper than ``limit`` (checked without recursion)."""
    level = [value]
    for _ in range(limit + 1):
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())]
        if not level:
            return True
    return False


def _size(text: object) -> int | None:
    """A size in bytes written as a JSON object key: decimal digits, 1 to 2**64 - 1; else None."""
    if not isinstance(text, str) or not text.isdecimal() or not text.isascii() or len(text) > 20 or text[0] == "0":
        return None
    value = int(text)
    return value if value < 1 << 64 else None


MAX_TIME_US = 1e12  # 11.6 days: beyond any collective's time, and what the results readers accept


MIN_MEASURED_US = 0.01  # 10 ns: below any GPU kernel launch; a measured time under it (1e-300) is not a measurement


def positive_us(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a time in µs that a measurement or prediction can be: positive, finite, plausible."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= MAX_TIME_US


def measured_us(value: object) -> bool:
    """Whether ``value`` is a time in µs that a measurement can be: ``positive_us`` and no shorter than a launch
    (selection also refuses what is faster than the fabric's own latency, where it knows the fabric)."""
    return positive_us(value) and value >= MIN_MEASURED_US


def parse_baselines(doc: object, source: str) -> dict[str, Any]:
    """A baselines.json document, checked: one line naming the file and field where it is malformed."""
    if not isinstance(doc, dict) or doc.get("format") != BASELINES_FORMAT:
        raise _fail(source, "format", f"must be {BASELINES_FORMAT!r}", "registry")
    tables = doc.get("nccl_us")
    if not isinstance(tables, dict):
        raise _fail(source, "nccl_us", "must be an object of topologies", "registry")
    for topology, collectives in tables.items():
        if not isinstance(collectives, dict):
            raise _fail(source, f"nccl_us.{topology}", "must be an object of collectives", "registry")
        for collective, times in collectives.items():
            where = f"nccl_us.{topology[:40]}.{collective[:40]}"
            if collective not in COLLECTIVES:
                raise _fail(source, where, f"not a collective (one of {', '.join(COLLECTIVES)})", "registry")
            if not isinstance(times, dict):
                raise _fail(source, where, "must map sizes in bytes to µs", "registry")
            for size, us in times.items():
                if _size(size) is None or not measured_us(us):
                    raise _fail(
                        source,
                        f"{where}.{size[:24]}",
                        "must be a size in bytes mapped to a positive, "
                        f"finite time in µs that a GPU can measure ({MIN_MEASURED_US} to {MAX_TIME_US:g}), "
                        f"got {short(us)}",
                        "registry",
                    )
    return doc


PROVENANCE_FIELDS = {
    "solver": str,
    "topology_name": str,
    "options": dict,
    "protocol": str,
    "schedule_hash": str,
    "weft_version": str,
    "prediction": str,
}
INDEX_FIELDS = {
    "id": str,
    "topology": str,
    "collective": str,
    "nranks": int,
    "min_bytes": int,
    "max_bytes": int,
    "plan": str,
    "plan_hash": str,
    "solver": str,
    "measured": bool,
}


def parse_index(doc: object, source: str) -> dict[str, Any]:
    """index.json, checked: a summary row per entry (``Entry.summary``); extra fields are allowed."""
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT or not isinstance(doc.get("entries"), list):
        raise _fail(source, "format", f"must be {INDEX_FORMAT!r} with a list of entries", "registry")
    for i, row in enumerate(doc["entries"]):
        if not isinstance(row, dict):
            raise _fail(source, f"entries[{i}]", "must be an object", "registry")
        for name, kind in INDEX_FIELDS.items():
            value = row.get(name)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise _fail(
                    source, f"entries[{i}].{name}", f"must be a {kind.__name__}, got {short(value)}", "registry"
                )
        if not ID_PATTERN.fullmatch(row["id"]):
            raise _fail(source, f"entries[{i}].id", f"not an entry id: {short(row['id'])}", "registry")
    return doc


def _times(table: object, where: str, source: str, measured: bool = False) -> dict[int, float]:
    """A timings table: sizes in bytes mapped to positive µs (selection interpolates them on a log scale);
    ``measured``: times a GPU measured, no shorter than ``MIN_MEASURED_US``."""
    if not isinstance(table, dict):
        raise _fail(source, where, "must map sizes in bytes to µs")
    out = {}
    for size, us in table.items():
        nbytes = size if isinstance(size, int) and not isinstance(size, bool) and 0 < size < 1 << 64 else _size(size)
        if nbytes is None or not (measured_us if measured else positive_us)(us):
            what = "a positive, finite time in µs" + (
                f" that a GPU can measure ({MIN_MEASURED_US} to {MAX_TIME_US:g})" if measured else ""
            )
            raise _fail(
                source, f"{where}.{str(size)[:24]}", f"must be a size in bytes mapped to {what}, got {short(us)}"
            )
        out[nbytes] = float(us)
    return out


def _key(doc: dict[str, Any], source: str) -> EntryKey:
    key_doc = doc.get("key")
    if not isinstance(key_doc, dict):
        raise _fail(source, "key", "must be an object")
    fields: list[Any] = []  # each checked below against its kind
    for name, kind in (("topology", str), ("collective", str), ("nranks", int), ("min_bytes", int), ("max_bytes", int)):
        value = key_doc.get(name)
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (kind is int and isinstance(value, int) and not 0 <= value < 1 << 64)
        ):
            raise _fail(source, f"key.{name}", f"missing or malformed, got {short(value)}")
        fields.append(value)
    if not FINGERPRINT.fullmatch(fields[0]):
        raise _fail(source, "key.topology", f"must be a topology fingerprint (topo-<16 hex>), got {short(fields[0])}")
    return EntryKey(*fields)


def _check_key(key: EntryKey, plan: Plan, source: str) -> None:
    """The key must say what the plan is: an entry must never serve one collective's plan under another's key."""
    facts = (
        ("collective", key.collective, plan.collective),
        ("nranks", key.nranks, plan.nranks),
        ("min_bytes", key.min_bytes, plan.min_message_size),
        ("max_bytes", key.max_bytes, plan.max_message_size),
    )
    for name, said, actual in facts:
        if said != actual:
            raise _fail(
                source, f"key.{name}", f"{short(said)} does not match its plan ({short(actual)}); edited by hand?"
            )
    if plan.weft.topology and plan.weft.topology != key.topology:
        raise _fail(
            source, "key.topology", f"{key.topology} does not match its plan ({plan.weft.topology}); edited by hand?"
        )


def parse_entry(doc: object, source: str, expected_id: str | None = None) -> Entry:
    """An entry document, checked in full; ``expected_id``: the id its file name gives (they must agree)."""
    if isinstance(doc, dict):
        doc = unpack(doc, source)  # a /2 file's plan, whole again (a /1 document as it is)
    if not isinstance(doc, dict) or doc.get("format") != ENTRY_FORMAT:
        raise _fail(source, "format", f"must be {PACKED_FORMAT!r} or {ENTRY_FORMAT!r}")
    entry_id_ = doc.get("id")
    if not isinstance(entry_id_, str) or not ID_PATTERN.fullmatch(entry_id_):
        raise _fail(source, "id", f"must be an entry id (letters, digits, '.', '_', '-'), got {short(entry_id_)}")
    if expected_id is not None and entry_id_ != expected_id:
        raise _fail(source, "id", f"{entry_id_!r} does not match the file's name ({expected_id!r})")
    key = _key(doc, source)
    timings = doc.get("timings", {})
    if not isinstance(timings, dict):
        raise _fail(source, "timings", "must be an object")
    predicted, *measured = (
        _times(timings.get(name, {}), f"timings.{name}", source, measured=name != "predicted_us")
        for name in TIMING_TABLES
    )
    provenance = doc.get("provenance", {})
    if not isinstance(provenance, dict) or not isinstance(provenance.get("verification") or {}, dict):
        raise _fail(source, "provenance.verification", "must be an object")
    if not _depth_within(provenance, MAX_DEPTH):
        raise _fail(source, "provenance", f"nests deeper than {MAX_DEPTH} levels")
    for name, kind in PROVENANCE_FIELDS.items():
        if name in provenance and not isinstance(provenance[name], kind):
            raise _fail(source, f"provenance.{name}", f"must be a {kind.__name__}, got {short(provenance[name])}")
    dtypes = (provenance.get("verification") or {}).get("dtypes", [])
    if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
        raise _fail(source, "provenance.verification.dtypes", f"must be a list of dtype names, got {short(dtypes)}")
    plan = parse_plan(doc.get("plan"), f"{source}: plan")
    record = provenance.get("verification") or {}
    if record.get("plan_hash") != plan.content_hash:
        raise _fail(
            source,
            "plan",
            f"content hash {plan.content_hash} does not match its verification record "
            f"({short(record.get('plan_hash'))}); edited by hand?",
        )
    _check_key(key, plan, source)
    if entry_id_ != entry_id(plan, key.topology):
        raise _fail(
            source,
            "id",
            f"{entry_id_!r} is not this plan's id on {key.topology} "
            f"({entry_id(plan, key.topology)!r}); edited by hand?",
        )
    return Entry(entry_id_, key, plan, provenance, predicted, *measured)
