"""Registry orchestration: re-check a plan on the reference executor, then commit it with its provenance.

This lives in weft/ because it spans stages: registry/ stores the plans but cannot import the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from executor.reference import proofs
from registry import norms
from registry.index import Mode
from registry.pack import PACKED_FORMAT
from registry.store import (
    BASELINES_FORMAT,
    ENTRY_FORMAT,
    Entry,
    Registry,
    RegistryError,
    Selection,
    measured_us,
    parse_baselines,
    parse_entry,
    require_verified,
)
from schedules.plan.io import parse_plan
from schedules.plan.types import Plan
from schedules.schedule import Schedule
from topologies import Topology, resolve
from weft import __version__
from weft.predictions import predictions
from weftcore.errors import WeftError
from weftcore.jsonfile import read_json, short_repr

PREDICTION = "prediction"  # the provenance field saying what made an entry's predicted times
Progress = Callable[[str], None]  # a line for the user on a long wait; the CLI prints it, library code never does


def registry_location(location: str | None) -> str:
    return Registry(location).location


def verify(plan: Plan, progress: Progress | None = None) -> dict:
    """Run the plan on the reference executor (random data, its dtypes, several sizes); the record as JSON, and
    this machine remembers that it proved the plan (``proven``)."""
    if progress:
        progress(f"proving plan {plan.name} on the reference executor")
    record = proofs.check(plan, progress=progress)
    proofs.remember(plan, record, weft_version=__version__)
    return record


def proven(entry: Entry, progress: Progress | None = None) -> str:
    """'' where this machine proved the entry's plan on the reference executor (now, or before: a plan is proven
    the first time this machine serves it, then remembered by its content), else why it must not run."""
    return proofs.proven(entry.plan, progress, prove=verify)


def narrow(plan: Plan, min_bytes: int, max_bytes: int) -> Plan:
    """The plan restricted to a size range (0: unbounded above), checked again since its content changed."""
    from dataclasses import replace

    lo = max(plan.min_message_size, min_bytes)
    hi = plan.max_message_size if max_bytes == 0 else min(plan.max_message_size, max_bytes)
    if (lo, hi) == (plan.min_message_size, plan.max_message_size):
        return plan
    narrowed = replace(plan, min_message_size=lo, max_message_size=hi)
    return narrowed.with_meta(verification=verify(narrowed))


def commit(
    plan: Plan,
    topology: Topology | str | None = None,
    location: Registry | str | None = None,
    schedule: Schedule | None = None,
    progress: Progress | None = None,
) -> Entry:
    """Verify ``plan`` on the reference executor and commit it; only a plan that passes is written.
    ``topology``: a Topology, spec, file or fingerprint (default: the plan's); ``location``: a Registry or its
    location (default: ``$WEFT_REGISTRY``, else the user data dir)."""
    registry = location if isinstance(location, Registry) else Registry(location)
    return registry.commit_all([_checked(plan, topology, schedule, progress=progress)], progress)[0]


def _fabric(topology: Topology | str | None, fingerprint: str) -> Topology | None:
    """The Topology behind ``topology`` (a spec, a file, or a fingerprint whose entry names a catalog spec that
    has it), or None where it cannot be known."""
    if isinstance(topology, Topology):
        return topology
    if isinstance(topology, str) and topology and not topology.startswith("topo-"):
        found = resolve(topology)
        return found if not fingerprint or found.known_as(fingerprint) else None
    return None


def check_fits(plan: Plan, fingerprint: str, topology: Topology | None, source: str) -> None:
    """The plan must be for this fabric: its own topology (where it names one) and, where the fabric is known,
    its rank count (a 4-rank plan never serves 2 GPUs)."""
    if plan.weft.topology and plan.weft.topology != fingerprint:
        named = f"{topology.name} ({fingerprint})" if topology is not None else fingerprint
        raise RegistryError(f"{source}: weft.topology: the plan is for {plan.weft.topology}, not {named}")
    if topology is not None and plan.nranks != topology.nranks:
        raise RegistryError(
            f"{source}: gpus: the plan has {plan.nranks} ranks, but topology {topology.name} has {topology.nranks}"
        )


def _checked(
    plan: Plan,
    topology: Topology | str | None,
    schedule: Schedule | None,
    exported: Entry | None = None,
    progress: Progress | None = None,
) -> tuple[Plan, str, dict, dict[int, float], Entry | None]:
    """Everything ``Registry.commit`` needs, each part checked (the plan proven on the reference executor);
    nothing is written, so callers can check a whole batch before committing any of it."""
    topo = resolve(topology) if isinstance(topology, str) and not topology.startswith("topo-") else topology
    if isinstance(topo, Topology):
        fingerprint = topo.fingerprint
    else:  # topo is topology itself here: a fingerprint, or None
        fingerprint = (topology if isinstance(topology, str) else None) or plan.weft.topology
    if isinstance(topo, Topology) and topo.known_as(plan.weft.topology):
        fingerprint = plan.weft.topology  # a plan recorded under the fabric's older fingerprint stays keyed by it
    if not fingerprint:
        raise RegistryError(f"plan {plan.name}: weft.topology: the plan names no topology; pass -t TOPO")
    named = exported.provenance.get("topology_name") if exported is not None else None
    try:
        fabric = topo if isinstance(topo, Topology) else _fabric(named, fingerprint)
    except WeftError:
        fabric = None  # an exported entry's name for its fabric is a hint; the fingerprint is the key
    check_fits(plan, fingerprint, fabric, f"plan {plan.name}")
    if isinstance(topo, Topology) and len(topo.hosts) == plan.nranks:
        from executor.hosts import ipc_across_hosts

        crossing = ipc_across_hosts(plan, topo.hosts)  # a memory channel is CUDA IPC: never between hosts
        if crossing:
            raise RegistryError(crossing.replace("(host ", f"(topology {topo.name} host "))
    provenance = {
        "solver": plan.weft.solver,
        "weft_version": __version__,
        "schedule_hash": plan.weft.schedule_hash,
        "instances": plan.weft.instances,
        "protocol": plan.protocol,
    }
    if isinstance(topo, Topology):
        provenance["topology_name"] = topo.name
    if schedule is not None:
        provenance["options"] = schedule.meta.options
    if exported is not None:  # an exported entry keeps what it recorded; only its verification is made afresh
        provenance = {**exported.provenance}
        predicted = exported.predicted_us
    else:
        predicted, provenance[PREDICTION] = predictions(plan, schedule, topo if isinstance(topo, Topology) else None)
    provenance["verification"] = verify(plan, progress)
    require_verified(plan, provenance)
    return plan, fingerprint, provenance, predicted, exported


def commit_file(path: str, topology: str | None, location: str | None, progress: Progress | None = None) -> Entry:
    from schedules.schedule import FORMATS as SCHEDULE_FORMATS

    doc = read_json(path, "plan", RegistryError)
    if isinstance(doc, dict) and doc.get("format") in SCHEDULE_FORMATS:
        raise RegistryError(
            f"registry commit {path}: a schedule ({doc['format']}), not a plan: compile it "
            f"first (`weft compile {path} -o PLAN.json`), then commit the plan"
        )
    return commit(parse_plan(doc, str(path)), topology, location, progress=progress)


def verify_registry(location: str | None, progress: Progress | None = None) -> dict:
    """Re-check every entry file (parse, hash, the reference executor), and what a writer killed mid-commit leaves:
    orphaned temporary files and index.json rows missing or out of date. Reported, not fixed
    (``registry rebuild-index`` repairs the index and the orphans)."""
    reg = Registry(location)
    rows = []
    paths = reg._entry_files()
    for i, path in enumerate(paths):
        name = Path(path).stem
        if progress:
            progress(f"entry {i + 1} of {len(paths)}: {name}")
        try:
            entry = reg.read_entry_file(path)
            verify(entry.plan)
            rows.append({"id": name, "ok": True})
        except Exception as e:  # every failure is a row in the report, never a crash of the whole check
            rows.append({"id": name, "ok": False, "error": str(e).splitlines()[0] if str(e) else type(e).__name__})
    bad = sum(not r["ok"] for r in rows)
    orphans = [Path(p).name for p in reg.orphans()]
    index = reg.index_problems()
    return {
        "registry": reg.location,
        "entries": rows,
        "ok": len(rows) - bad,
        "bad": bad,
        "orphans": orphans,
        "index": index,
    }


def import_directory(directory: str, location: str | None, progress: Progress | None = None) -> list[Entry]:
    """Commit every plan or registry-entry file in ``directory``, each verified afresh, with an exported entry's
    predictions, measurements and provenance, and merge an exported baselines.json (NCCL's times); every file is
    read and proven before the first commit, so a bad file commits nothing."""
    if not Path(directory).is_dir():
        raise RegistryError(f"registry import {directory}: not a directory")
    registry = Registry(location)
    checked, baselines = [], None
    files = sorted(Path(directory).glob("*.json"))
    if not files:  # /etc, /dev or a mistyped folder: importing nothing is never what was meant
        raise RegistryError(
            f"registry import {directory}: no plan or exported entry files (*.json) in it; "
            "`weft registry export DIR` writes them"
        )
    for i, path in enumerate(files):
        doc = read_json(path, "registry import", RegistryError)
        if path.name == "baselines.json" and isinstance(doc, dict) and doc.get("format") == BASELINES_FORMAT:
            baselines = parse_baselines(doc, f"registry import {path}")
            continue
        plan, topology, exported = _import_doc(doc, path)
        if progress:
            progress(f"file {i + 1} of {len(files)}: {path.name}")
        checked.append(_checked(plan, topology, None, exported, progress))
    entries = registry.commit_all(checked, progress)
    if baselines is not None:
        tables = {
            topology: {collective: {int(k): v for k, v in times.items()} for collective, times in c.items()}
            for topology, c in baselines["nccl_us"].items()
        }
        registry.record_timings({}, tables)
    return entries


def export_directory(directory: str, location: str | None) -> tuple[int, list[str], list[str]]:
    """Write every readable entry as ``<id>.json`` and baselines.json into ``directory`` (created if missing),
    nothing outside it: the names come from the entries' own file names, which the registry checked.
    Returns how many entries were written, one line per entry left out as unreadable, and a warning where
    baselines.json is damaged (left out: it is advisory and never costs the entries)."""
    from registry.store import ID_PATTERN, dumps, entry_text
    from weftcore.jsonfile import make_directory, write_text

    registry = Registry(location)
    entries, bad = registry.load()
    baselines, warning = registry.baselines_or_none()
    out = make_directory(directory, "registry export", RegistryError)
    files = []
    for e in entries:
        target = out / f"{e.id}.json"
        if not ID_PATTERN.fullmatch(e.id) or target.parent != out:
            raise RegistryError(f"registry export {out}: entry id {e.id!r}: not a file name in the folder")
        files.append((target, entry_text(e)))
    if baselines["nccl_us"]:
        files.append((out / "baselines.json", dumps(baselines)))
    for target, text in files:
        write_text(target, text, "registry export", RegistryError)
    return len(entries), bad, [warning] if warning else []


def _import_doc(doc: object, path: Path) -> tuple[Plan, str | None, Entry | None]:
    """The plan in an exported registry entry (with its topology and the entry) or in a plan file (naming its own)."""
    if not isinstance(doc, dict) or "format" not in doc:  # plan files (MSCCL++'s layout) carry no format
        return parse_plan(doc, str(path)), None, None
    if doc["format"] not in (ENTRY_FORMAT, PACKED_FORMAT):
        raise RegistryError(
            f"registry import {path}: format: must be {PACKED_FORMAT!r} or {ENTRY_FORMAT!r} (an exported entry) or "
            f"absent (a plan file), got {short_repr(doc['format'])}"
        )
    old = parse_entry(doc, str(path), path.stem)
    return old.plan, old.key.topology, old


def record_bench(
    registry: Registry, collective: str, rows: list[dict], source: str = "bench rows"
) -> tuple[int, list[str]]:
    """A bench job's times into ``registry``: each plan's into its entry (times with LL128 lines, and as a compiled
    kernel, apart: ``Mode``), and NCCL's, measured in the same job, per topology of the plans timed. A size whose
    fastest plan gave a wrong result records nothing; one whose fastest compiled kernel did records no compiled
    time. Every row is checked first, and nothing is written unless all of it can be.
    Returns how many plan times were stored, and the plans skipped as not in the registry (hash, and name where
    the file gives it)."""
    _check_rows(rows, source)
    entries = {e.plan.content_hash: e for e in registry.entries(collective=collective)}
    times: dict[str, list[tuple[int, float, Mode]]] = {}
    nccl: dict[str, dict[int, float]] = {}
    skipped: dict[str, str] = {}
    for row in rows:
        if row["wrong"]:
            continue
        plain = row["plans_us"] if "plans_us" in row else {} if row.get("lines") else {row["plan_hash"]: row["weft_us"]}
        tables = [(plain, Mode()), (row.get("plans_ll128_us", {}), Mode(lines=True))]
        if not row.get("compiled_wrong"):
            kernels = row.get("plans_compiled_us", {})
            for lines in (False, True):
                tables.append(
                    ({_unsuffixed(k): us for k, us in kernels.items() if _lined(k) == lines}, Mode(lines, True))
                )
        for table, mode in tables:
            for plan_hash, us in table.items():
                if plan_hash not in entries:
                    named = row.get("plan") if row.get("plan_hash") == plan_hash else None
                    skipped[plan_hash] = skipped.get(plan_hash) or (f"{plan_hash} ({named})" if named else plan_hash)
                if plan_hash in entries:
                    times.setdefault(entries[plan_hash].id, []).append((row["size"], float(us), mode))
                    if row.get("nccl_us") is not None:
                        nccl.setdefault(entries[plan_hash].key.topology, {})[row["size"]] = float(row["nccl_us"])
    registry.record_timings(times, {topology: {collective: table} for topology, table in nccl.items()})
    return sum(len(v) for v in times.values()), [skipped[k] for k in sorted(skipped)]


def _lined(key: str) -> bool:
    """Whether a ``plans_compiled_us`` key (a plan hash, +ll128 for a time with LL128 lines) is one with lines."""
    return key.endswith(Mode(lines=True).suffix)


def _unsuffixed(key: str) -> str:
    return key.removesuffix(Mode(lines=True).suffix)


def _check_rows(rows: object, source: str) -> None:
    """Bench rows as ``record_bench`` stores them: one line naming the row and field that is out of range."""
    if not isinstance(rows, list):
        raise RegistryError(f"registry record {source}: rows: must be a list of sizes")
    for i, row in enumerate(rows):
        where = f"registry record {source}: rows[{i}]"
        if not isinstance(row, dict):
            raise RegistryError(f"{where}: must be an object")
        size = row.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size < 1 << 64:
            raise RegistryError(f"{where}.size: must be a size in bytes (a positive integer), got {short_repr(size)}")
        wrong = row.get("wrong")
        if isinstance(wrong, bool) or not isinstance(wrong, int) or wrong < 0:
            raise RegistryError(f"{where}.wrong: must be a count of wrong elements, got {short_repr(wrong)}")
        if row.get("nccl_us") is not None and not measured_us(row["nccl_us"]):
            raise RegistryError(
                f"{where}.nccl_us: must be a measured time in µs (at least 0.01), got {short_repr(row['nccl_us'])}"
            )
        if wrong:
            continue
        tables = [
            ("plans_ll128_us", row.get("plans_ll128_us", {})),
            ("plans_compiled_us", row.get("plans_compiled_us", {})),
        ]
        if "plans_us" in row or row.get("lines"):
            tables.append(("plans_us", row.get("plans_us", {})))
        else:
            tables.append(("weft_us", {row.get("plan_hash"): row.get("weft_us")}))
        for name, table in tables:
            if not isinstance(table, dict):
                raise RegistryError(f"{where}.{name}: must map plan hashes to µs, got {short_repr(table)}")
            for plan_hash, us in table.items():
                if not isinstance(plan_hash, str) or not measured_us(us):
                    raise RegistryError(
                        f"{where}.{name}: {short_repr(plan_hash)}: must map a plan hash to a "
                        f"measured time in µs (at least 0.01), got {short_repr(us)}"
                    )


@dataclass(frozen=True)
class Recorded:
    """What ``record_results_file`` stored from one results file."""

    fused: bool  # bench/norm_peers.py's fused-call times (into norm.json), else `weft bench`'s plan times
    stored: int  # times stored
    sizes: int  # sizes in the file
    skipped: list[str]  # plans not in the registry
    planned: int | None = None  # the sizes a `weft bench` job planned, where its file says it stopped short


def record_results_file(path: str, location: str | None) -> Recorded:
    """A results file into the registry, read once: bench/norm_peers.py's (``_record_norm_doc``) or `weft bench`'s
    (``_record_bench_doc``), as the file says."""
    doc = read_json(Path(path), "registry record", RegistryError)
    if _is_norm_doc(doc):
        return Recorded(True, *_record_norm_doc(doc, path, location))
    return Recorded(False, *_record_bench_doc(doc, path, location))


def _record_bench_doc(doc: object, path: str, location: str | None) -> tuple[int, int, list[str], int | None]:
    """``record_bench`` from the results ``weft bench`` wrote to ``path`` (``doc``, decoded): (plan times stored,
    sizes in the file, the plans skipped as not in the registry, and the sizes its job planned where the file says
    it stopped short: ``complete`` false, as a job cut by its time limit leaves it; else None)."""
    if not isinstance(doc, dict):
        raise RegistryError(f"registry record {path}: must be an object, as `weft bench` writes its results")
    collective, rows = doc.get("collective"), doc.get("rows")
    if not isinstance(collective, str) or not collective:
        raise RegistryError(f"registry record {path}: collective: missing; is this a `weft bench` results file?")
    if not isinstance(rows, list):
        raise RegistryError(f"registry record {path}: rows: must be a list of sizes")
    for i, row in enumerate(rows):
        for field, kind in (("size", int), ("nccl_us", (int, float)), ("wrong", int), ("plans_us", dict)):
            if not isinstance(row, dict) or not isinstance(row.get(field), kind) or isinstance(row.get(field), bool):
                raise RegistryError(f"registry record {path}: rows[{i}].{field}: missing or malformed")
    stored, skipped = record_bench(Registry(location), collective, rows, path)
    planned = doc.get("sizes_planned") if doc.get("complete") is False else None
    return stored, len(rows), skipped, len(planned) if isinstance(planned, list) else None


NORM_BENCHMARK = "allreduce_norm"  # the "benchmark" of bench/norm_peers.py's results: the fused call alone


def _is_norm_doc(doc: object) -> TypeGuard[dict]:
    """bench/norm_peers.py's results: tagged, or (files from before the tag) its "op" naming the fused call."""
    return isinstance(doc, dict) and (doc.get("benchmark") == NORM_BENCHMARK or "RMSNorm" in str(doc.get("op")))


def _record_norm_doc(doc: object, path: str, location: str | None) -> tuple[int, int, list[str]]:
    """The fused call's times from bench/norm_peers.py's results (``doc``, decoded from ``path``) into the registry's
    norm.json (registry/norms.py): each row's ``plans_us`` (plan hash + mode suffix -> µs) for rows of the file's
    ``hidden`` elements, under the fabric of the registry entry holding each plan; a time whose call gave a wrong
    result (``plans_wrong``) is left out. Every row is checked first, and nothing is written unless all of it can be.
    Returns (times stored, sizes in the file, the plans skipped as not in the registry)."""
    source = f"registry record {path}"
    if not _is_norm_doc(doc):
        raise RegistryError(f"{source}: benchmark: must be {NORM_BENCHMARK!r}, as bench/norm_peers.py writes it")
    hidden, rows = doc.get("hidden"), doc.get("rows")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or not 0 < hidden < 1 << 31:
        raise RegistryError(f"{source}: hidden: must be the row length in elements, got {short_repr(hidden)}")
    if not isinstance(rows, list):
        raise RegistryError(f"{source}: rows: must be a list of sizes")
    registry = Registry(location)
    entries = {e.plan.content_hash: e for e in registry.entries(collective="allreduce")}
    times: dict[str, dict[int, dict[int, dict[str, float]]]] = {}
    skipped: set[str] = set()
    for i, row in enumerate(rows):
        where = f"{source}: rows[{i}]"
        if not isinstance(row, dict):
            raise RegistryError(f"{where}: must be an object")
        size, plans, wrong = row.get("size"), row.get("plans_us"), row.get("plans_wrong", {})
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size < 1 << 64:
            raise RegistryError(f"{where}.size: must be a size in bytes (a positive integer), got {short_repr(size)}")
        if not isinstance(plans, dict) or not isinstance(wrong, dict):
            raise RegistryError(
                f"{where}.plans_us: missing or malformed (files bench/norm_peers.py wrote before 2026-11-28 hold "
                "no plans_us and cannot be recorded)"
            )
        for key, us in plans.items():
            try:
                plan_hash, _ = norms.split_key(key)
            except ValueError as e:
                raise RegistryError(f"{where}.plans_us: {e}") from None
            if not measured_us(us):
                raise RegistryError(f"{where}.plans_us.{key}: must be a measured time in µs, got {short_repr(us)}")
            if wrong.get(key):
                continue
            if plan_hash not in entries:
                skipped.add(plan_hash)
                continue
            topology = entries[plan_hash].key.topology
            times.setdefault(topology, {}).setdefault(hidden, {}).setdefault(size, {})[key] = float(us)
    registry.record_norm_timings(times)
    stored = sum(len(p) for rows_ in times.values() for sizes in rows_.values() for p in sizes.values())
    return stored, len(rows), sorted(skipped)


def latency_floor_us(topology: Topology) -> float:
    """No collective on two or more ranks of ``topology`` ends sooner than one crossing between two ranks (the
    lowest-latency rank-to-rank path, through switches where they join the ranks)."""
    if topology.nranks < 2:
        return 0.0
    return min(
        (
            link.latency
            for link in topology.without_switches().links
            if isinstance(link.src, int) and isinstance(link.dst, int)
        ),
        default=0.0,
    )


def select(
    location: str | None,
    topology: Topology | str,
    collective: str,
    nbytes: int,
    dtype: str | None = None,
    ll128: bool = False,
    progress: Progress | None = None,
    compiled: bool = False,
) -> Selection:
    """``Registry.select`` for a fabric (a spec, a file, a Topology or a fingerprint): only entries of its rank
    count, measured no faster than its latency allows, whose plan this machine proved on the reference executor
    (the first time it serves one: ``proven``), in a protocol the GPU executor runs (``executor.gpu.protocols``)."""
    from executor.gpu.protocols import protocol_refusal

    fabric = topology if isinstance(topology, Topology) else _fabric(topology, "")
    known = fabric.fingerprints if fabric is not None else str(topology)  # its older fingerprint too
    return Registry(location).select(
        known,
        collective,
        nbytes,
        dtype,
        fabric.nranks if fabric else None,
        ll128,
        trust=lambda entry: protocol_refusal(entry.plan) or proven(entry, progress),  # what a GPU job could run
        floor_us=latency_floor_us(fabric) if fabric else 0.0,
        compiled=compiled,
    )
