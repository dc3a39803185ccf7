"""A plan proven on the reference executor before this machine first runs it, and remembered after.

A registry entry's hashes say only that its file is whole: an entry whose plan lost an op and whose hashes were
recomputed reads as well as a true one (issue 39). So a plan is run here on random data at a few sizes and in its
dtypes, and must give the collective's result, the first time this machine serves it; the proof is then kept by
the full sha256 of the plan's content, and a trusted plan costs nothing after its first use. Proofs live in a
local folder (``$WEFT_PROOFS``, otherwise the user cache dir's weft/proofs): a registry on a shared URL is
exactly what a proof must not take on trust.

Every path that serves registry plans asks ``proven``: ``weft.select`` and ``weft registry select`` (through
``weft.publish``) and the torch communicators' plan choice (``executor.inference.plans.PlanChoice``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from registry.store import RegistryError
from schedules.plan.types import Plan, PlanError
from weftcore.jsonfile import one_line, write_text

CHECK_SIZES_CHUNKS = (1, 3, 64)  # granules per chunk: the smallest size, a ragged one (12-byte chunks), a larger one
DTYPES = ("fp32", "fp16", "bf16")

Progress = Callable[[str], None]


def check_sizes(plan: Plan) -> list[int]:
    """Sizes the reference executor runs a plan at: inside its range, whole granules per chunk, one ragged."""
    from schedules.padding import CHUNK_GRANULE

    unit = plan.size_chunks * CHUNK_GRANULE
    sizes = []
    for k in CHECK_SIZES_CHUNKS:
        n = unit * max(k, -(-plan.min_message_size // unit) + k - 1)
        if plan.accepts(n):
            sizes.append(n)
    if not sizes:
        raise PlanError(
            f"plan {plan.name}: no size in its range {plan.min_message_size}..{plan.max_message_size} B "
            f"is a multiple of {unit} B, so it cannot be checked"
        )
    return sorted(set(sizes))


def check(
    plan: Plan,
    sizes: list[int] | None = None,
    dtypes: tuple[str, ...] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict:
    """Run ``plan`` on the reference executor; the verification record as JSON (raises on failure).

    Without ``sizes``, a plan whose range starts above the smallest sizes of its ops is run at those sizes: the
    range decides which messages the plan takes, never what its ops do, so a plan narrowed to large messages
    (a pareto point from 32 MB) is proven on the same ops at a few KB instead of at 32 MB (`synth allreduce -t
    hgx_h100:nodes=2 --method pareto --commit`: 125 s of CPU before, 16.5 s after). The record is this plan's: its
    hash, and the sizes that ran."""
    from executor.reference.prove import check_plan

    ran = plan if sizes or not plan.min_message_size else replace(plan, min_message_size=0)
    record = check_plan(ran, sizes or check_sizes(ran), dtypes or plan.weft.dtypes or DTYPES, seed, progress)
    return {**record.to_json(), "plan_hash": plan.content_hash}


def proof_dir() -> Path:
    """Where this machine keeps the plans it proved."""
    import platformdirs

    return Path(os.environ.get("WEFT_PROOFS") or Path(platformdirs.user_cache_dir("weft")) / "proofs")


def proof_path(plan: Plan) -> Path:
    """The proof's file, named by the full sha256 of the plan's content (the 16-digit content hash in entries is
    for people; a proof is keyed by all of it)."""
    content = json.dumps(plan.content(), sort_keys=True, separators=(",", ":")).encode()
    return proof_dir() / f"{hashlib.sha256(content).hexdigest()}.json"


def remember(plan: Plan, record: dict, **about: str) -> None:
    """Keep this machine's proof of ``plan`` (``about``: more fields for the file, such as the weft version)."""
    proof = {"plan": plan.name, "plan_hash": plan.content_hash, "ok": True, "checks": len(record.get("checks", []))}
    # an unwritable cache costs the next use a proof, nothing else
    with contextlib.suppress(RegistryError):
        write_text(
            proof_path(plan),
            json.dumps({**proof, **about}, sort_keys=True) + "\n",
            "proof",
            RegistryError,
            parents=True,
        )


def prove(plan: Plan, progress: Progress | None = None) -> dict:
    """``check`` at the plan's own sizes and dtypes, remembered once it passes."""
    if progress:
        progress(f"proving plan {plan.name} on the reference executor")
    record = check(plan, progress=progress)
    remember(plan, record)
    return record


def proven(plan: Plan, progress: Progress | None = None, prove: Callable[[Plan, Progress | None], dict] = prove) -> str:
    """'' where this machine proved ``plan`` (before, or now with ``prove``, which remembers it), else why the plan
    must not run."""
    if proof_path(plan).is_file():
        return ""
    try:
        prove(plan, progress)
    except Exception as e:  # noqa: BLE001 (a wrong result, a deadlock, a plan too large: each refuses the plan)
        return f"its plan failed on the reference executor: {one_line(str(e)) or type(e).__name__}"
    return ""
