"""The orchestration from a schedule to a proven plan: verify the schedule, compile it, run the plan on the
reference executor, and record what was proven in the plan's ``weft`` object.

Nothing is written unless it passed: ``save_plan`` refuses a plan without a passing verification record for
its own content hash.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from executor.reference.proofs import DTYPES, check
from executor.reference.proofs import check_sizes as check_sizes  # where tests and callers have found it
from schedules.plan.io import dumps_plan, load_plan, parse_plan
from schedules.plan.types import Plan, PlanError
from schedules.schedule import FORMATS as SCHEDULE_FORMATS
from schedules.schedule import Schedule, parse_schedule
from topologies import Topology
from weft.units import format_bytes
from weftcore.jsonfile import read_json, write_text


def compile_and_verify(
    schedule: Schedule,
    topology: Topology | str,
    instances: int = 1,
    protocol: str = "auto",
    inplace: bool = False,
    progress: Callable[[str], None] | None = None,
    **options,
) -> Plan:
    """A plan for ``schedule`` that passed the schedule verifier and the reference executor (3 sizes × 3 dtypes,
    the first of them as 2 or 3 launches back to back on the same buffers). ``options``: codegen's ``threads``,
    ``pipeline`` and ``double_scratch``; ``topology`` a Topology, catalog spec or file."""
    from codegen import MAX_INSTANCES, compile_schedule
    from schedules.verify import require_valid
    from weft.predictions import predictions

    if isinstance(topology, str):
        from topologies import resolve

        topology = resolve(topology)
    require_valid(schedule, topology)
    if progress:
        progress(f"compiling {schedule.name or schedule.collective.name} into a plan")
    copies = instances * options.get("pipeline", 1) if isinstance(instances, int) else 1
    if 1 < copies <= MAX_INSTANCES:  # before the compile, which itself grows with instances (it refuses the rest)
        one = compile_schedule(
            schedule, topology, instances=1, protocol=protocol, inplace=inplace, **{**options, "pipeline": 1}
        )
        _require_proof_memory(one, copies, instances)
    plan = compile_schedule(schedule, topology, instances=instances, protocol=protocol, inplace=inplace, **options)
    # the same table `synth --commit` stores, so a plan committed from its file selects the same (issue 38)
    table, made_by = predictions(plan, schedule, topology)
    plan = plan.with_meta(
        predicted_us={format_bytes(n): t for n, t in table.items()}, prediction=made_by, dtypes=DTYPES
    )
    if progress:
        progress(f"proving {plan.name} on the reference executor")
    return plan.with_meta(verification=check(plan, progress=progress))


def _require_proof_memory(one: Plan, copies: int, instances: int) -> None:
    """Refuse, from the one-instance plan ``one``, a plan of ``copies`` times its thread blocks and chunks whose
    reference proof would pass the memory budget (``executor.reference.machine.estimate_bytes``)."""
    from executor.reference.machine import estimate_bytes
    from executor.reference.prove import BACK_TO_BACK
    from schedules.budget import require

    launches = BACK_TO_BACK if one.use_double_scratch_buffer else 2
    need = estimate_bytes(one, min(check_sizes(one)) * copies, "fp16", launches, copies)
    require(need, f"plan {one.name.replace('-x1', f'-x{instances}')}: the reference proof with --instances {instances}")


def is_verified(plan: Plan) -> bool:
    record = plan.weft.verification or {}
    return bool(record.get("ok")) and record.get("plan_hash") == plan.content_hash


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write a verified plan as pretty, deterministic JSON."""
    if not is_verified(plan):
        raise PlanError(
            f"plan {plan.name}: no passing verification record for hash {plan.content_hash}; "
            "compile it with weft.compile (or run `weft verify`) first"
        )
    write_text(path, dumps_plan(plan), "plan", PlanError, parents=True)


def read_document(path: str | Path) -> tuple[str, Schedule | Plan]:
    """('schedule', Schedule) or ('plan', Plan) for a weft.schedule/1 or /2 file or an MSCCL++ plan file."""
    data = read_json(path, "file", PlanError)
    if isinstance(data, dict) and data.get("format") in SCHEDULE_FORMATS:
        return "schedule", parse_schedule(data, str(path))
    return "plan", parse_plan(data, str(path))


def verify_plan_file(
    path: str | Path,
    sizes: list[int] | None = None,
    dtypes: tuple[str, ...] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Load a plan file and run it on the reference executor; the verification record (raises on failure)."""
    return check(load_plan(path), sizes, dtypes, seed, progress)
