"""Registry orchestration: re-check a plan on the reference executor, then commit it with its provenance.

This lives in weft/ because it spans stages: schedules/ owns the registry but cannot import the executor.
"""

from __future__ import annotations

from pathlib import Path

from schedules.plan import Plan, load_plan, parse_plan
from schedules.registry import ENTRY_FORMAT, Entry, Registry, RegistryError, parse_entry, require_verified
from schedules.schedule import Schedule
from topologies import Topology, resolve
from topologies.jsonfile import read_json
from weft import __version__
from weft.units import parse_bytes

# Sizes at which a plan's predicted time is stored: 1 KB to 1 GB in powers of 4.
PREDICTION_SIZES = tuple(1 << k for k in range(10, 31, 2))


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


def _predictions(plan: Plan, schedule: Schedule | None, topology: Topology | None) -> dict[int, float]:
    if schedule is not None and topology is not None:
        from schedules.cost import predict_us

        return {n: predict_us(schedule, topology, n) for n in PREDICTION_SIZES}
    return {parse_bytes(k, f"plan {plan.name}: weft.predicted_us"): float(v) for k, v in plan.weft.predicted_us.items()}


def commit(plan: Plan, topology: Topology | str | None, location: str | None = None,
           schedule: Schedule | None = None) -> Entry:
    """Verify ``plan`` on the reference executor and commit it; only a plan that passes is written."""
    return Registry(location).commit(*_checked(plan, topology, schedule))


def _checked(plan: Plan, topology: Topology | str | None,
             schedule: Schedule | None) -> tuple[Plan, str, dict, dict[int, float]]:
    """Everything ``Registry.commit`` needs, each part checked (the plan proven on the reference executor);
    nothing is written, so callers can check a whole batch before committing any of it."""
    topo = resolve(topology) if isinstance(topology, str) and not topology.startswith("topo-") else topology
    fingerprint = topo.fingerprint if isinstance(topo, Topology) else (topology or plan.weft.topology)
    if not fingerprint:
        raise RegistryError(f"plan {plan.name}: weft.topology: the plan names no topology; pass -t TOPO")
    if plan.weft.topology and plan.weft.topology != fingerprint:
        raise RegistryError(f"plan {plan.name}: weft.topology: the plan is for {plan.weft.topology}, "
                            f"not {fingerprint}")
    provenance = {
        "solver": plan.weft.solver, "weft_version": __version__, "schedule_hash": plan.weft.schedule_hash,
        "instances": plan.weft.instances, "protocol": plan.protocol, "verification": verify(plan),
    }
    require_verified(plan, provenance)
    if schedule is not None:
        provenance["options"] = schedule.meta.options
    return plan, fingerprint, provenance, _predictions(plan, schedule, topo if isinstance(topo, Topology) else None)


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
    """Commit every plan or registry-entry file in ``directory``, each verified afresh; every file is read and
    proven before the first commit, so a bad file commits nothing."""
    if not Path(directory).is_dir():
        raise RegistryError(f"registry import {directory}: not a directory")
    registry = Registry(location)
    checked = [_checked(*_import_file(f), None) for f in sorted(Path(directory).glob("*.json"))]
    return [registry.commit(*c) for c in checked]


def _import_file(path: Path) -> tuple[Plan, str | None]:
    """The plan in an exported registry entry (with its topology) or in a plan file (naming its own)."""
    doc = read_json(path, "registry import", RegistryError)
    if not isinstance(doc, dict) or "format" not in doc:  # plan files (MSCCL++'s layout) carry no format
        return parse_plan(doc, str(path)), None
    if doc["format"] != ENTRY_FORMAT:
        raise RegistryError(f"registry import {path}: format: must be {ENTRY_FORMAT!r} (an exported entry) or "
                            f"absent (a plan file), got {doc['format']!r}")
    old = parse_entry(doc, str(path))
    return old.plan, old.key.topology


def record_bench(registry: Registry, collective: str, rows: list[dict]) -> int:
    """A bench job's times into ``registry``: each plan's into its entry (times with LL128 lines apart), and
    NCCL's, measured in the same job, per topology of the plans timed. A size whose fastest plan gave a wrong
    result records nothing. Returns how many plan times were stored."""
    entries = {e.plan.content_hash: e for e in registry.entries(collective=collective)}
    nccl: dict[str, dict[int, float]] = {}
    stored = 0
    for row in rows:
        if row["wrong"]:
            continue
        plain = row.get("plans_us", {} if row.get("lines") else {row["plan_hash"]: row["weft_us"]})
        lined = row.get("plans_ll128_us", {})
        for times, ll128 in ((plain, False), (lined, True)):
            for plan_hash, us in times.items():
                if plan_hash in entries:
                    registry.record_timing(entries[plan_hash].id, row["size"], us, ll128=ll128)
                    nccl.setdefault(entries[plan_hash].key.topology, {})[row["size"]] = row["nccl_us"]
                    stored += 1
    for topology, times in sorted(nccl.items()):
        registry.record_nccl(topology, collective, times)
    return stored


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
    return record_bench(Registry(location), collective, rows), len(rows)
