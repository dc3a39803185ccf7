"""The GPU test cases, shared by the worker (which runs them on every rank) and the pytest files (which assert)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from executor.gpu.tables import lines_possible
from executor.reference.norm import residual_refusal
from schedules.plan.io import load_plan
from schedules.plan.types import Plan
from weft.units import parse_bytes

HERE = Path(__file__).parent
PLANS = HERE / "plans"
FIXTURES = HERE.parent / "fixtures" / "plans"
SIZES = ("1KB", "64KB", "1MB", "3MB+48", "16MB", "256MB")
DTYPES = ("fp32", "fp16", "bf16")
GRAPH_PLANS = ("allreduce-direct-ll-x1.json", "allreduce-twoshot-simple-x8.json", "allgather-direct-ll-x1.json")


@dataclass(frozen=True)
class Case:
    plan: str  # path relative to tests/
    size: str
    dtype: str

    @property
    def id(self) -> str:
        return f"{Path(self.plan).stem}-{self.size}-{self.dtype}"


def plans_dir(nranks: int) -> Path:
    """The compiled test plans for this many ranks (each directory holds the GRAPH_PLANS and the x1 baselines)."""
    return PLANS if nranks == 2 else HERE / f"plans{nranks}"


def plan_files(nranks: int) -> list[Path]:
    files = sorted(plans_dir(nranks).glob("*.json"))
    if nranks == 2:
        files += sorted(FIXTURES.glob("allpairs_*.json"))
    return files


@cache
def _plan(path: Path) -> Plan:
    """Each test plan parsed once per process: collection asks for the cases three ways, on every rank too."""
    return load_plan(path)


def correctness_cases(nranks: int = 2) -> list[Case]:
    """Every plan × size × dtype that the plan accepts; 256 MB runs in bf16 only to keep the job short."""
    cases = []
    for path in plan_files(nranks):
        plan = _plan(path)
        for size in SIZES:
            nbytes = parse_bytes(size)
            if not plan.accepts(nbytes):
                continue
            for dtype in DTYPES if nbytes < (256 << 20) else ("bf16",):
                if plan.chunk_bytes(nbytes) % (4 if dtype == "fp32" else 2) == 0:
                    cases.append(Case(str(path.relative_to(HERE.parent)), size, dtype))
    return cases


def line_cases(nranks: int = 2) -> list[Case]:
    """The correctness cases whose LL plan can move its packets as LL128 lines at that size."""
    return [c for c in correctness_cases(nranks) if lines_possible(_plan(HERE.parent / c.plan), parse_bytes(c.size))]


LINE_GRAPH_PLANS = tuple(name for name in GRAPH_PLANS if "-ll-" in name)


RESIDUAL_SIZES = ("64KB", "1MB", "3MB+48")


def residual_cases(nranks: int = 2) -> list[tuple[str, Case, bool]]:
    """(id, case, lines): all-reduce cases whose plan adds a residual in its launch, in bf16 and fp32 at a few
    sizes, each with LL16 packets (or plain data) and, where the plan can, with LL128 lines too."""
    runs = []
    for c in correctness_cases(nranks):
        if c.size in RESIDUAL_SIZES and c.dtype in ("bf16", "fp32"):
            plan = _plan(HERE.parent / c.plan)
            if not residual_refusal(plan):
                runs.append((c.id, c, False))
                if lines_possible(plan, parse_bytes(c.size)):
                    runs.append((c.id + "+ll128", c, True))
    return runs
