"""Registry orchestration: re-check a plan on the reference executor, then commit it with its provenance.

This lives in weft/ because it spans stages: schedules/ owns the registry but cannot import the executor.
"""

from __future__ import annotations

from pathlib import Path

from schedules.plan import Plan, load_plan, parse_plan
from schedules.registry import (BASELINES_FORMAT, ENTRY_FORMAT, Entry, Registry, RegistryError, parse_baselines,
                                parse_entry, positive_us, require_verified)
from schedules.schedule import Schedule
from topologies import Topology, resolve
from topologies.jsonfile import read_json, short_repr
from weft import __version__
from weft.units import parse_bytes

# Sizes at which a plan's predicted time is stored: 1 KB to 1 GB in powers of 4.
PREDICTION_SIZES = tuple(1 << k for k in range(10, 31, 2))
PREDICTION = "prediction"  # the provenance field saying what made an entry's predicted times
ALPHA_BETA = "alpha-beta model of the links only (launch, hops and protocol not calibrated)"


def registry_location(location: str | None) -> str:
    return Registry(location).location


def verify(plan: Plan) -> dict:
    """Run the plan on the reference executor (random data, its dtypes, several sizes); the record as JSON."""
    from weft.pipeline import check

    return check(plan)


def narrow(plan: Plan, min_bytes: int, max_bytes: int) -> Plan:
    """The plan restricted to a size range (0: unbounded above), checked again since its content changed."""
    from dataclasses import replace

    lo = max(plan.min_message_size, min_bytes)
    hi = plan.max_message_size if max_bytes == 0 else min(plan.max_message_size, max_bytes)
    if (lo, hi) == (plan.min_message_size, plan.max_message_size):
        return plan
    narrowed = replace(plan, min_message_size=lo, max_message_size=hi)
    return narrowed.with_meta(verification=verify(narrowed))


def _predictions(plan: Plan, schedule: Schedule | None, topology: Topology | None) -> tuple[dict[int, float], str]:
    """The plan's predicted times and what made them (``PREDICTION``): the fabric's calibration where it was
    measured (``weft topo calibrate``), else the α-β model of its links, which knows nothing of launches or
    protocols (so a fabric never measured is said to be so next to each prediction)."""
    from weft.calibrate import predictions

    calibrated = predictions(plan, schedule, topology, PREDICTION_SIZES)
    if calibrated is not None:
        return calibrated
    if schedule is not None and topology is not None:
        from schedules.cost import predict_us

        return {n: predict_us(schedule, topology, n) for n in PREDICTION_SIZES}, ALPHA_BETA
    return ({parse_bytes(k, f"plan {plan.name}: weft.predicted_us"): float(v)
             for k, v in plan.weft.predicted_us.items()}, ALPHA_BETA)


def commit(plan: Plan, topology: Topology | str | None = None, location: Registry | str | None = None,
           schedule: Schedule | None = None) -> Entry:
    """Verify ``plan`` on the reference executor and commit it; only a plan that passes is written.
    ``topology``: a Topology, spec, file or fingerprint (default: the plan's); ``location``: a Registry or its
    location (default: ``$WEFT_REGISTRY``, else the user data dir)."""
    registry = location if isinstance(location, Registry) else Registry(location)
    return registry.commit(*_checked(plan, topology, schedule))


def _checked(plan: Plan, topology: Topology | str | None, schedule: Schedule | None,
             exported: Entry | None = None) -> tuple[Plan, str, dict, dict[int, float], Entry | None]:
    """Everything ``Registry.commit`` needs, each part checked (the plan proven on the reference executor);
    nothing is written, so callers can check a whole batch before committing any of it."""
    topo = resolve(topology) if isinstance(topology, str) and not topology.startswith("topo-") else topology
    fingerprint = topo.fingerprint if isinstance(topo, Topology) else (topology or plan.weft.topology)
    if isinstance(topo, Topology) and topo.known_as(plan.weft.topology):
        fingerprint = plan.weft.topology  # a plan recorded under the fabric's older fingerprint stays keyed by it
    if not fingerprint:
        raise RegistryError(f"plan {plan.name}: weft.topology: the plan names no topology; pass -t TOPO")
    if plan.weft.topology and plan.weft.topology != fingerprint:
        named = f"{topo.name} ({fingerprint})" if isinstance(topo, Topology) else fingerprint
        raise RegistryError(f"plan {plan.name}: weft.topology: the plan is for {plan.weft.topology}, not {named}")
    if isinstance(topo, Topology) and len(topo.hosts) == plan.nranks:
        from executor.hosts import ipc_across_hosts

        crossing = ipc_across_hosts(plan, topo.hosts)  # a memory channel is CUDA IPC: never between hosts
        if crossing:
            raise RegistryError(crossing.replace("(host ", f"(topology {topo.name} host "))
    provenance = {
        "solver": plan.weft.solver, "weft_version": __version__, "schedule_hash": plan.weft.schedule_hash,
        "instances": plan.weft.instances, "protocol": plan.protocol,
    }
    if isinstance(topo, Topology):
        provenance["topology_name"] = topo.name
    if schedule is not None:
        provenance["options"] = schedule.meta.options
    if exported is not None:  # an exported entry keeps what it recorded; only its verification is made afresh
        provenance = {**exported.provenance}
        predictions = exported.predicted_us
    else:
        predictions, provenance[PREDICTION] = _predictions(plan, schedule,
                                                           topo if isinstance(topo, Topology) else None)
    provenance["verification"] = verify(plan)
    require_verified(plan, provenance)
    return plan, fingerprint, provenance, predictions, exported


def commit_file(path: str, topology: str | None, location: str | None) -> Entry:
    return commit(load_plan(path), topology, location)


def verify_registry(location: str | None) -> dict:
    """Re-check every entry file: parse, hash, and the reference executor. Bad entries are reported, not fixed."""
    reg = Registry(location)
    rows = []
    for path in reg._entry_files():
        name = Path(path).stem
        try:
            entry = reg.read_entry_file(path)
            verify(entry.plan)
            rows.append({"id": name, "ok": True})
        except Exception as e:  # every failure is a row in the report, never a crash of the whole check
            rows.append({"id": name, "ok": False, "error": str(e).splitlines()[0] if str(e) else type(e).__name__})
    bad = sum(not r["ok"] for r in rows)
    return {"registry": reg.location, "entries": rows, "ok": len(rows) - bad, "bad": bad}


def import_directory(directory: str, location: str | None) -> list[Entry]:
    """Commit every plan or registry-entry file in ``directory``, each verified afresh, with an exported entry's
    predictions, measurements and provenance, and merge an exported baselines.json (NCCL's times); every file is
    read and proven before the first commit, so a bad file commits nothing."""
    if not Path(directory).is_dir():
        raise RegistryError(f"registry import {directory}: not a directory")
    registry = Registry(location)
    checked, baselines = [], None
    for path in sorted(Path(directory).glob("*.json")):
        doc = read_json(path, "registry import", RegistryError)
        if path.name == "baselines.json" and isinstance(doc, dict) and doc.get("format") == BASELINES_FORMAT:
            baselines = parse_baselines(doc, f"registry import {path}")
            continue
        plan, topology, exported = _import_doc(doc, path)
        checked.append(_checked(plan, topology, None, exported))
    entries = registry.commit_all(checked)
    if baselines is not None:
        tables = {topology: {collective: {int(k): v for k, v in times.items()} for collective, times in c.items()}
                  for topology, c in baselines["nccl_us"].items()}
        registry.record_timings({}, tables)
    return entries


def export_directory(directory: str, location: str | None) -> tuple[int, list[str]]:
    """Write every readable entry as ``<id>.json`` and baselines.json into ``directory`` (created if missing),
    nothing outside it: the names come from the entries' own file names, which the registry checked.
    Returns how many entries were written, and one line per entry left out as unreadable."""
    from schedules.registry import ID_PATTERN, dumps
    from topologies.jsonfile import make_directory, write_text

    registry = Registry(location)
    entries, bad = registry.load()
    baselines = registry.baselines()
    out = make_directory(directory, "registry export", RegistryError)
    files = []
    for e in entries:
        target = out / f"{e.id}.json"
        if not ID_PATTERN.fullmatch(e.id) or target.parent != out:
            raise RegistryError(f"registry export {out}: entry id {e.id!r}: not a file name in the folder")
        files.append((target, dumps(e.to_json())))
    if baselines["nccl_us"]:
        files.append((out / "baselines.json", dumps(baselines)))
    for target, text in files:
        write_text(target, text, "registry export", RegistryError)
    return len(entries), bad


def _import_doc(doc: object, path: Path) -> tuple[Plan, str | None, Entry | None]:
    """The plan in an exported registry entry (with its topology and the entry) or in a plan file (naming its own)."""
    if not isinstance(doc, dict) or "format" not in doc:  # plan files (MSCCL++'s layout) carry no format
        return parse_plan(doc, str(path)), None, None
    if doc["format"] != ENTRY_FORMAT:
        raise RegistryError(f"registry import {path}: format: must be {ENTRY_FORMAT!r} (an exported entry) or "
                            f"absent (a plan file), got {short_repr(doc['format'])}")
    old = parse_entry(doc, str(path), path.stem)
    return old.plan, old.key.topology, old


def record_bench(registry: Registry, collective: str, rows: list[dict], source: str = "bench rows") -> int:
    """A bench job's times into ``registry``: each plan's into its entry (times with LL128 lines apart), and
    NCCL's, measured in the same job, per topology of the plans timed. A size whose fastest plan gave a wrong
    result records nothing. Every row is checked first, and nothing is written unless all of it can be.
    Returns how many plan times were stored."""
    _check_rows(rows, source)
    entries = {e.plan.content_hash: e for e in registry.entries(collective=collective)}
    times: dict[str, list[tuple[int, float, bool]]] = {}
    nccl: dict[str, dict[int, float]] = {}
    for row in rows:
        if row["wrong"]:
            continue
        plain = row["plans_us"] if "plans_us" in row else {} if row.get("lines") else {row["plan_hash"]: row["weft_us"]}
        lined = row.get("plans_ll128_us", {})
        for table, ll128 in ((plain, False), (lined, True)):
            for plan_hash, us in table.items():
                if plan_hash in entries:
                    times.setdefault(entries[plan_hash].id, []).append((row["size"], float(us), ll128))
                    if row.get("nccl_us") is not None:
                        nccl.setdefault(entries[plan_hash].key.topology, {})[row["size"]] = float(row["nccl_us"])
    registry.record_timings(times, {topology: {collective: table} for topology, table in nccl.items()})
    return sum(len(v) for v in times.values())


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
        if row.get("nccl_us") is not None and not positive_us(row["nccl_us"]):
            raise RegistryError(f"{where}.nccl_us: must be a positive, finite time in µs, got "
                                f"{short_repr(row['nccl_us'])}")
        if wrong:
            continue
        tables = [("plans_ll128_us", row.get("plans_ll128_us", {}))]
        if "plans_us" in row or row.get("lines"):
            tables.append(("plans_us", row.get("plans_us", {})))
        else:
            tables.append(("weft_us", {row.get("plan_hash"): row.get("weft_us")}))
        for name, table in tables:
            if not isinstance(table, dict):
                raise RegistryError(f"{where}.{name}: must map plan hashes to µs, got {short_repr(table)}")
            for plan_hash, us in table.items():
                if not isinstance(plan_hash, str) or not positive_us(us):
                    raise RegistryError(f"{where}.{name}: {short_repr(plan_hash)}: must map a plan hash to a "
                                        f"positive, finite time in µs, got {short_repr(us)}")


def record_bench_file(path: str, location: str | None) -> tuple[int, int]:
    """``record_bench`` from a results file that ``weft bench`` wrote: (plan times stored, sizes in the file)."""
    doc = read_json(Path(path), "registry record", RegistryError)
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
    return record_bench(Registry(location), collective, rows, path), len(rows)
