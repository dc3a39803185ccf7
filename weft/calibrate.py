"""Calibrating the cost model to a fabric from committed GPU results (``weft topo calibrate``), and pricing plans
with the calibration at commit time.

A bench results file (``bench/results/gpu_*.json``) names each plan it timed (``direct-allreduce-hgx_h200:gpus=2-
ll-x64-t256``: schedule, protocol, instances, threads, ...). The plan is rebuilt from its name (the baseline
schedule synthesized again, compiled with the same options), its ``PlanFeatures`` read, and each of its median
times becomes an ``Observation``. Times measured with LL128 lines are left out: they are another packet format,
priced by their own measurements; so are compiled kernels' (``+compiled``): the model prices the interpreter.

The Lamport plans were timed in jobs of their own (``LAMPORT_RESULTS``), beside LL and Simple plans timed again on
other days: from those files only the Lamport plans' times are taken, so that each protocol's terms rest on the
jobs that were run to measure it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from schedules.calibration import PROTOCOLS as CALIBRATED_PROTOCOLS
from schedules.calibration import Calibration, CalibrationError, Observation, PlanFeatures, fit, load_calibration
from schedules.cost import loads
from schedules.ops import OPS
from schedules.plan.types import Plan
from schedules.schedule import Schedule
from topologies import Topology
from weft.synthesis import BASELINES
from weftcore.jsonfile import decode_json, read_bytes

RESULTS = Path(__file__).parent.parent / "bench" / "results"
MAX_RESULTS_BYTES = 16 << 20  # a results file of every size and plan is tens of KB
MAX_NAME = 200
# A plan named in a results file is rebuilt only where it is as small as a measured plan can be: the
# rebuild (synthesis and compile) grows with ranks^2 x instances x pipeline, and a 121-byte file must not name a
# plan that takes minutes (a trees plan, or a ring on thousands of ranks).
MAX_REBUILD_WORK = 1 << 21
# The Lamport jobs' results (module docstring), by GPU count: globs under RESULTS
LAMPORT_RESULTS = "lamport_*/gpu_allreduce_bf16_graph_{n}x*.json"
PLAN_NAME = re.compile(
    r"(?P<method>[a-z]+)-(?P<collective>[a-z]+)-(?P<spec>\S+?)-(?P<protocol>ll|simple|lamport)"
    r"-x(?P<instances>\d+)(?:-p(?P<pipeline>\d+))?(?:-t(?P<threads>\d+))?(?P<double>-2s)?"
    r"(?P<pull>-pull)?(?P<multipeer>-mp)?(?:-max(?P<max_mb>\d+)MB)?"
)


def features(plan: Plan, schedule: Schedule, topology: Topology) -> PlanFeatures:
    """What the calibrated model reads from ``plan`` (compiled from ``schedule``) on ``topology``."""
    per_chunk_byte = sum(
        max((per_byte for _, per_byte in step.links + step.groups), default=0.0)
        for step in loads(schedule, topology).steps
    )
    hops = max((_hops(tb.ops) for g in plan.gpus for tb in g.threadblocks), default=0)
    arrivals = max((sum(map(_op_arrivals, tb.ops)) for g in plan.gpus for tb in g.threadblocks), default=0)
    sources = max((sum(map(_op_sources, tb.ops)) for g in plan.gpus for tb in g.threadblocks), default=0)
    packet = 2 if plan.protocol == "LL" else 1  # an LL packet moves its flags beside its data; Lamport's, none
    work = [[sum(_op_chunks(op, packet) for op in tb.ops) for tb in g.threadblocks] for g in plan.gpus]
    n = plan.size_chunks
    return PlanFeatures(
        plan.protocol,
        plan.weft.instances,
        plan.num_threads_per_block,
        max(len(g.threadblocks) for g in plan.gpus),
        hops,
        max(arrivals, hops),
        max(sources, arrivals, hops),
        plan.size_chunks,
        per_chunk_byte / schedule.collective.size_chunks,
        max((w for gpu in work for w in gpu), default=0) / n,
        max(map(sum, work)) / n,
    )


def _hops(ops) -> int:
    """The round trips a thread block's ops wait through: a wait (on a channel, or for packets) starts a round
    trip where it comes first or after the block sent something since its last wait; the waits that follow one
    without a send between them wait for arrivals already on their way (a multi-peer block's packets from 3
    peers), within the same round trip."""
    hops, sent = 0, True
    for op in ops:
        spec = OPS[op.name]
        if spec.device == "wait" or spec.packet_src:
            hops, sent = hops + sent, False
        if spec.device == "signal" or spec.signals or any(ref.remote for ref in op.dst_buff):
            sent = True
    return hops


def _op_arrivals(op) -> int:
    """1 where an op waits for something to arrive: a peer's signal or packets (from one peer or, in a reduction,
    from each at once), or another thread block's semaphore."""
    spec = OPS[op.name]
    return int(spec.device in ("wait", "sem_acquire") or bool(spec.packet_src))


def _op_sources(op) -> int:
    """The peers (or semaphores) an op waits for at once: each packet source, each channel waited on."""
    spec = OPS[op.name]
    if spec.device == "wait":
        return max(len(op.channel_ids), 1)
    if spec.device == "sem_acquire":
        return len(op.semaphore_ids)
    return sum(spec.reads_packet(k) for k in range(len(op.src_buff)))


def _op_chunks(op, packet: int) -> int:
    """Chunks an op reads and writes, a packet ``packet`` times (an LL packet twice: its data and its flags)."""
    spec = OPS[op.name]
    reads = sum(ref.size * (packet if spec.reads_packet(k) else 1) for k, ref in enumerate(op.src_buff))
    writes = sum(ref.size * (packet if spec.writes_packet(ref.remote) else 1) for ref in op.dst_buff)
    return reads + writes


@lru_cache(maxsize=512)
def named_plan(name: str, fingerprint: str | None = None) -> tuple[Plan, Schedule, Topology] | None:
    """The plan a results file names, rebuilt (None where the name is not a baseline compiled by weft, is for
    another fabric than ``fingerprint``'s, or is larger than a measured plan: a results file is data, and the
    plans it names are rebuilt only within the bounds of ``rebuildable``)."""
    from codegen import compile_schedule
    from codegen.protocol import LAMPORT_MAX_BYTES, LL_MAX_BYTES, PROTOCOLS
    from topologies import resolve
    from weft.synthesis import synthesize

    m = PLAN_NAME.fullmatch(name)
    if m is None or len(name) > MAX_NAME or m["method"] not in BASELINES:
        return None
    try:
        topology = resolve(m["spec"])
        if (fingerprint is not None and topology.fingerprint != fingerprint) or not rebuildable(topology, m):
            return None
        schedule = synthesize(topology, m["collective"], m["method"])
        protocol = PROTOCOLS[m["protocol"]]  # as plans spell it
        limit = int(m["max_mb"]) << 20 if m["max_mb"] else None  # the packet protocol's, where its name says
        plan = compile_schedule(
            schedule,
            topology,
            instances=int(m["instances"]),
            protocol=protocol,
            threads=int(m["threads"] or 1024),
            pipeline=int(m["pipeline"] or 1),
            pull=bool(m["pull"]),
            multipeer=bool(m["multipeer"]),
            double_scratch=bool(m["double"]) if protocol == "Simple" else None,
            ll_max_bytes=limit if protocol == "LL" and limit else LL_MAX_BYTES,
            lamport_max_bytes=limit if protocol == "Lamport" and limit else LAMPORT_MAX_BYTES,
        )
    except Exception:  # noqa: BLE001 (a name weft no longer compiles the same way is left out, never a crash)
        return None
    return (plan, schedule, topology) if plan.name == name else None


def rebuildable(topology: Topology, m: re.Match) -> bool:
    """Whether the plan ``m`` names is small enough to rebuild within ``weft topo calibrate``'s bounds."""
    instances, pipeline = int(m["instances"]), int(m["pipeline"] or 1)
    if (
        len(m["instances"]) > 4
        or len(m["pipeline"] or "") > 4
        or len(m["threads"] or "") > 5
        or len(m["max_mb"] or "") > 5
    ):
        return False
    return topology.nranks**2 * instances * pipeline <= MAX_REBUILD_WORK


def observations(
    topology: Topology,
    paths: list[Path],
    progress: Callable[[str], None] | None = None,
    protocols: tuple[str, ...] = CALIBRATED_PROTOCOLS,
) -> tuple[list[Observation], list[str]]:
    """The measured (plan, size, µs) points of ``topology`` in these results files, its plans of ``protocols`` only,
    and the files they came from (named from ``RESULTS`` where they lie under it). ``progress`` hears of each file
    before its plans are rebuilt (a few seconds each)."""
    found: list[Observation] = []
    used: list[str] = []
    for path in paths:
        if progress:
            progress(f"calibrate: rebuilding the plans timed in {Path(path).name}")
        doc = decode_json(
            read_bytes(path, "results", CalibrationError, MAX_RESULTS_BYTES), "results", str(path), CalibrationError
        )
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise CalibrationError(f"results {path}: rows: missing; not a `weft bench` results file")
        rows = doc["rows"]
        if doc.get("nranks") != topology.nranks:
            continue
        before = len(found)
        for i, row in enumerate(rows):
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("size"), int)
                or row["size"] <= 0
                or not isinstance(row.get("median_us") or {}, dict)
            ):
                raise CalibrationError(f"results {path}: rows[{i}]: must hold a size in bytes and median_us")
            for key, us in sorted((row.get("median_us") or {}).items()):
                if (
                    not key.startswith("weft:")
                    or key.endswith("+ll128")
                    or not isinstance(us, (int, float))
                    or isinstance(us, bool)
                    or not 0 < us < 1e12
                ):
                    continue
                rebuilt = named_plan(key[5:], topology.fingerprint)
                if (
                    rebuilt is None
                    or rebuilt[2].fingerprint != topology.fingerprint
                    or rebuilt[0].protocol not in protocols
                ):
                    continue
                plan, schedule, _ = rebuilt
                found.append(
                    Observation(
                        plan.name, plan.collective, features(plan, schedule, topology), int(row["size"]), float(us)
                    )
                )
        if len(found) > before:
            used.append(_source_name(Path(path)))
    return found, used


def _source_name(path: Path) -> str:
    """A results file as a calibration names it: its path under ``RESULTS``, else its file name."""
    try:
        return path.resolve().relative_to(RESULTS.resolve()).as_posix()
    except ValueError:
        return path.name


def default_results(topology: Topology) -> list[Path]:
    """The committed GPU results files for this many GPUs: ``gpu_<collective>_<dtype>_<mode>_<n>x<gpu>.json``."""
    pattern = re.compile(rf"gpu_[a-z]+_[a-z0-9]+_graph_{topology.nranks}x[a-z0-9]+\.json")
    return sorted(p for p in RESULTS.glob("gpu_*.json") if pattern.fullmatch(p.name))


def lamport_results(topology: Topology) -> list[Path]:
    """The committed results of the Lamport jobs for this many GPUs (``LAMPORT_RESULTS``)."""
    return sorted(RESULTS.glob(LAMPORT_RESULTS.format(n=topology.nranks)))


def calibrate(
    topology: Topology, paths: list[Path] | None = None, progress: Callable[[str], None] | None = None
) -> Calibration:
    """Fit the cost model's terms to ``topology``'s measured plans (default: the committed results, and the Lamport
    plans of the Lamport jobs' results)."""
    if paths is not None:
        found, used = observations(topology, paths, progress)
    else:
        found, used = observations(topology, default_results(topology), progress, ("LL", "Simple"))
        lamport, lamport_used = observations(topology, lamport_results(topology), progress, ("Lamport",))
        found, used = found + lamport, used + lamport_used
    if not found:
        raise CalibrationError(
            f"topology {topology.name}: no measured plan of this fabric in the results files "
            f"({', '.join(str(p) for p in (paths or [])) or RESULTS})"
        )
    if progress:
        progress(f"calibrate: fitting the model to {len(found)} measurements")
    return fit(topology.fingerprint, topology.name, found, tuple(used))


def predictions(
    plan: Plan, schedule: Schedule | None, topology: Topology | None, sizes: tuple[int, ...]
) -> tuple[dict[int, float], str] | None:
    """The calibrated predictions of ``plan`` at ``sizes`` and what made them, or None where the fabric was never
    measured (or the schedule is unknown)."""
    if schedule is None or topology is None:
        return None
    calibration = load_calibration(topology.fingerprint)
    if calibration is None or plan.protocol not in calibration.protocols:  # a protocol this fabric never measured
        return None
    f = features(plan, schedule, topology)
    summary = calibration.residuals()
    return (
        {n: calibration.predict_us(f, n) for n in sizes},
        f"calibrated to {summary['points']} measurements on {calibration.topology_name} "
        f"(worst ratio {summary['worst_ratio']:.2f})",
    )


def schedule_predictions(
    schedule: Schedule, topology: Topology, sizes: tuple[int, ...], instances: int = 1, protocol: str = "auto"
) -> tuple[dict[int, float], str] | None:
    """The calibrated predictions of the plan that compiling ``schedule`` with these options makes (the plan
    `synth --compile/--commit` and `weft compile` make), or None where the fabric was never measured."""
    if load_calibration(topology.fingerprint) is None:
        return None
    from codegen import compile_schedule

    return predictions(
        compile_schedule(schedule, topology, instances=instances, protocol=protocol), schedule, topology, sizes
    )
