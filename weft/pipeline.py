"""The orchestration from a schedule to a proven plan: verify the schedule, compile it, run the plan on the
reference executor, and record what was proven in the plan's ``weft`` object.

Nothing is written unless it passed: ``save_plan`` refuses a plan without a passing verification record for
its own content hash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from schedules.plan import Plan, PlanError, dumps_plan, load_plan, parse_plan
from schedules.schedule import FORMATS as SCHEDULE_FORMATS
from schedules.schedule import Schedule, parse_schedule
from topologies import Topology
from topologies.jsonfile import read_json, write_text
from weft.units import format_bytes

PREDICTION_SIZES = (1 << 10, 1 << 20, 1 << 30)
CHECK_SIZES_CHUNKS = (1, 3, 64)  # granules per chunk: the smallest size, a ragged one (12-byte chunks), a larger one
DTYPES = ("fp32", "fp16", "bf16")


def check_sizes(plan: Plan) -> list[int]:
    """Sizes the reference executor runs a plan at: inside its range, whole granules per chunk, one ragged."""
    from schedules.plan import CHUNK_GRANULE

    unit = plan.size_chunks * CHUNK_GRANULE
    sizes = []
    for k in CHECK_SIZES_CHUNKS:
        n = unit * max(k, -(-plan.min_message_size // unit) + k - 1)
        if plan.accepts(n):
            sizes.append(n)
    if not sizes:
        raise PlanError(f"plan {plan.name}: no size in its range {plan.min_message_size}..{plan.max_message_size} B "
                        f"is a multiple of {unit} B, so it cannot be checked")
    return sorted(set(sizes))


def check(plan: Plan, sizes: list[int] | None = None, dtypes: tuple[str, ...] | None = None, seed: int = 0,
          progress: Callable[[str], None] | None = None) -> dict:
    """Run ``plan`` on the reference executor; the verification record as JSON (raises on failure)."""
    from executor.reference import check_plan

    record = check_plan(plan, sizes or check_sizes(plan), dtypes or plan.weft.dtypes or DTYPES, seed, progress)
    return record.to_json()


def compile_and_verify(schedule: Schedule, topology: Topology, instances: int = 1, protocol: str = "auto",
                       inplace: bool = False, progress: Callable[[str], None] | None = None, **options) -> Plan:
    """A plan for ``schedule`` that passed the schedule verifier and the reference executor (3 sizes × 3 dtypes,
    the first of them as 2 or 3 launches back to back on the same buffers). ``options``: codegen's ``threads``,
    ``pipeline`` and ``double_scratch``."""
    from codegen import compile_schedule
    from schedules.cost import predict_us
    from schedules.verify import require_valid

    require_valid(schedule, topology)
    plan = compile_schedule(schedule, topology, instances=instances, protocol=protocol, inplace=inplace, **options)
    predicted = {format_bytes(n): predict_us(schedule, topology, n) for n in PREDICTION_SIZES}
    plan = plan.with_meta(predicted_us=predicted, dtypes=DTYPES)
    return plan.with_meta(verification=check(plan, progress=progress))


def is_verified(plan: Plan) -> bool:
    record = plan.weft.verification or {}
    return bool(record.get("ok")) and record.get("plan_hash") == plan.content_hash


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write a verified plan as pretty, deterministic JSON."""
    if not is_verified(plan):
        raise PlanError(f"plan {plan.name}: no passing verification record for hash {plan.content_hash}; "
                        "compile it with weft.compile (or run `weft verify`) first")
    write_text(path, dumps_plan(plan), "plan", PlanError, parents=True)


def read_document(path: str | Path) -> tuple[str, Schedule | Plan]:
    """('schedule', Schedule) or ('plan', Plan) for a weft.schedule/1 or /2 file or an MSCCL++ plan file."""
    data = read_json(path, "file", PlanError)
    if isinstance(data, dict) and data.get("format") in SCHEDULE_FORMATS:
        return "schedule", parse_schedule(data, str(path))
    return "plan", parse_plan(data, str(path))


def verify_plan_file(path: str | Path, sizes: list[int] | None = None, dtypes: tuple[str, ...] | None = None,
                     seed: int = 0, progress: Callable[[str], None] | None = None) -> dict:
    """Load a plan file and run it on the reference executor; the verification record (raises on failure)."""
    return check(load_plan(path), sizes, dtypes, seed, progress)
