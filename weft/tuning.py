"""Plan variants for size-based selection: one schedule compiled many ways, each proven, for the registry.

No single compilation of a schedule is fastest at every size: small messages want LL packets and few, small
thread blocks; large ones want Simple transfers spread over many thread blocks. ``compile_variants`` compiles a
grid (protocol × instances × threads) of one schedule, drops what the GPU could not run (more thread blocks than
it holds at once), proves each plan on the reference executor, and ``weft tune`` commits them. ``weft bench
--record`` then measures every one at every size, and the registry's ``select`` (and an inference job) takes the
fastest measured plan for each size.

>>> [v.label for v in grid(TuneOptions(instances=(1, 8), threads=(1024,), protocols=("ll",)))]
['ll-x1', 'll-x8']
>>> [v.label for v in grid(TuneOptions(instances=(16,), threads=(512,), protocols=("simple",), pipelines=(1, 2)))]
['simple-x16-t512', 'simple-x16-p2-t512']
>>> resident_capacity(256, sms=132)
528
>>> [v.label for v in grid(TuneOptions(instances=(32,), threads=(1024,), protocols=("simple",)), peers=3)]
['simple-x32', 'simple-x32-mp']
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from codegen.protocol import LAMPORT_MAX_BYTES, LL_MAX_BYTES, CodegenError
from schedules.collectives import NAMES, facts_of
from schedules.compact import expand
from schedules.plan.types import Plan
from schedules.schedule import Schedule
from topologies import Topology
from weftcore.errors import CheckFailed, WeftError

PROTOCOLS = ("ll", "simple", "lamport")  # codegen.protocol.PROTOCOLS' names; the port engine runs no Lamport plan
DEFAULT_PROTOCOLS = PROTOCOLS
# The interpreter is built with __launch_bounds__(1024), so it uses at most 64 registers a thread: an SM's 64K
# registers hold 1024 threads, in blocks of any size.
THREADS_PER_SM = 1024


# Lamport variants whose scratch holds at most LAMPORT_WIDE_SCRATCH times the message per copy (each rank receives at
# most twice its message: a two-shot, a ring, a one-shot on 2 ranks) accept messages to LAMPORT_WIDE_MAX_BYTES by
# default; the others (a one-shot on N > 3 ranks receives N - 1 times it) to codegen's LAMPORT_MAX_BYTES. The Lamport
# two-shot measured ahead of every peer to 8 MB on 2xH200 (bench/results/lamport_s13_2xh200/), and the traffic
# model puts it ahead to 16 MB on 4 GPUs (bench/results/traffic_predictions_midsize_4xh200.json).
LAMPORT_WIDE_SCRATCH = 2
LAMPORT_WIDE_MAX_BYTES = 16 << 20

DEFAULT_METHODS = ("direct",)  # and twoshot where the collective is reducescatter + allgather (allreduce)
FALLBACK_METHOD = "ring"


class TuneError(WeftError):
    """A tuning request that cannot be carried out."""


def default_protocols(topology: Topology) -> tuple[str, ...]:
    """The protocols ``weft tune`` compiles when none are named: all of them on one host; Simple alone for a topology
    of several hosts, where a plan moves data over port channels, which carry plain puts (codegen refuses the
    packet protocols there)."""
    return DEFAULT_PROTOCOLS if topology.nhosts <= 1 else ("simple",)


def default_schedules(topology: Topology, collective: str) -> tuple[list[Schedule], list[str]]:
    """The default baselines that ``topology`` can run (direct and two-shot need a link between every pair, as
    NVSwitch machines have), else a ring; and a note for each default left out."""
    from synth.errors import NotApplicable
    from weft.synthesis import synthesize

    schedules, notes = [], []
    two_phases = collective in NAMES and bool(facts_of(collective).phases)
    for method in DEFAULT_METHODS + (("twoshot",) if two_phases else ()):
        try:
            schedules.append(synthesize(topology, collective, method))
        except NotApplicable as e:
            notes.append(f"left out {e}")
    if not schedules:
        schedules.append(synthesize(topology, collective, FALLBACK_METHOD))
        notes.append(f"tuning {FALLBACK_METHOD} instead")
    return schedules, notes


@dataclass(frozen=True)
class TuneOptions:
    """The grid: every protocol × instances × threads (Simple plans pick their scratch layout themselves)."""

    instances: tuple[int, ...] = (1, 4, 16, 32, 64, 128)
    threads: tuple[int, ...] = (256, 1024)
    protocols: tuple[str, ...] = DEFAULT_PROTOCOLS
    sms: int = 132  # H100 and H200 (SXM)
    pull: bool = False  # also Simple variants that read peers' inputs (``codegen.lower``)
    ll_max_bytes: int = LL_MAX_BYTES  # the largest message LL variants accept (higher for LL128 lines)
    # the largest message Lamport variants accept; None: by the variant's scratch (``lamport_limit``)
    lamport_max_bytes: int | None = None
    pipelines: tuple[int, ...] = (1,)  # Simple variants' pipeline depths (``codegen.replicate.pipeline``)
    # also multi-peer variants (one thread block per instance serves every peer, ``codegen.peers``): None makes them
    # for schedules in which a rank sends to several peers, where per-peer thread blocks multiply
    multipeer: bool | None = None
    # also duplex variants (one thread block per peer both writes it and waits for it, ``codegen.threadblocks``):
    # per-peer Simple and LL shapes of schedules whose receive roles forward nothing (a direct all-to-all)
    duplex: bool = False

    def __post_init__(self) -> None:
        if not self.instances or any(not isinstance(i, int) or i < 1 for i in self.instances):
            raise TuneError(f"--instances: positive integers, got {list(self.instances)}")
        if not self.threads or any(not isinstance(t, int) or t % 32 or not 32 <= t <= 1024 for t in self.threads):
            raise TuneError(f"--threads: multiples of 32 from 32 to 1024, got {list(self.threads)}")
        if not self.pipelines or any(not isinstance(d, int) or d < 1 for d in self.pipelines):
            raise TuneError(f"--pipeline: positive integers, got {list(self.pipelines)}")
        bad = [p for p in self.protocols if p not in PROTOCOLS]
        if not self.protocols or bad:
            raise TuneError(f"--protocols: choose from {', '.join(PROTOCOLS)}, got {list(self.protocols)}")
        if not isinstance(self.sms, int) or self.sms < 1:
            raise TuneError(f"--sms: a positive integer, got {self.sms!r}")
        if not isinstance(self.ll_max_bytes, int) or self.ll_max_bytes <= 0 or self.ll_max_bytes % (1 << 20):
            raise TuneError(f"--ll-max-bytes: a whole number of MB, got {self.ll_max_bytes!r} B")
        if self.lamport_max_bytes is not None and (
            not isinstance(self.lamport_max_bytes, int)
            or self.lamport_max_bytes <= 0
            or self.lamport_max_bytes % (1 << 20)
        ):
            raise TuneError(f"--lamport-max-bytes: a whole number of MB, got {self.lamport_max_bytes!r} B")


@dataclass(frozen=True)
class Variant:
    protocol: str
    instances: int
    threads: int
    pull: bool = False
    pipeline: int = 1
    multipeer: bool = False
    duplex: bool = False

    @property
    def label(self) -> str:
        return (
            f"{self.protocol}-x{self.instances}"
            + (f"-p{self.pipeline}" if self.pipeline > 1 else "")
            + (f"-t{self.threads}" if self.threads != 1024 else "")
            + ("-pull" if self.pull else "")
            + ("-mp" if self.multipeer else "")
            + ("-dx" if self.duplex else "")
        )


@dataclass(frozen=True)
class Outcome:
    """One variant: its proven plan, or why there is none."""

    variant: Variant
    plan: Plan | None
    skipped: str = ""

    @property
    def threadblocks(self) -> int:
        return max(len(g.threadblocks) for g in self.plan.gpus) if self.plan else 0

    @property
    def powers_of_two(self) -> bool:
        """Whether the plan accepts any power-of-two size from 1 KB to 1 GB (an instance count with an odd factor,
        such as 24, splits messages into chunks that only odd multiples fill)."""
        return self.plan is not None and any(self.plan.accepts(1 << k) for k in range(10, 31))


def grid(options: TuneOptions, peers: int = 1) -> list[Variant]:
    """The variants to compile for a schedule in which a rank sends to at most ``peers`` peers."""
    pulls = {"ll": (False,), "lamport": (False,), "simple": (False, True) if options.pull else (False,)}
    # packets (LL's, Lamport's) already flow behind their own flags, so sub-pieces are for Simple transfers only
    depths = {"ll": (1,), "lamport": (1,), "simple": tuple(sorted(set(options.pipelines)))}
    multi = options.multipeer if options.multipeer is not None else peers > 1
    shapes = (False, True) if multi else (False,)
    # a multi-peer block already serves every peer in both directions; pulls are lowered to one block per instance
    duplexes = {
        (mp, pull): (False, True) if options.duplex and not mp and not pull else (False,)
        for mp in shapes
        for pull in (False, True)
    }
    return [
        Variant(p, i, t, pull, d, mp, dx)
        for p in options.protocols
        for pull in pulls[p]
        for d in depths[p]
        for i in sorted(set(options.instances))
        for t in sorted(set(options.threads))
        for mp in shapes
        for dx in duplexes[(mp, pull)]
    ]


def send_peers(schedule: Schedule) -> int:
    """The most peers one rank of ``schedule`` sends to (a ring: 1; a two-shot on N ranks: N - 1)."""
    peers: dict[int, set[int]] = {}
    for step in expand(schedule).steps:
        for send in step.sends:
            peers.setdefault(send.src, set()).add(send.dst)
    return max((len(p) for p in peers.values()), default=0)


def resident_capacity(threads: int, sms: int) -> int:
    """Thread blocks of ``threads`` threads that ``sms`` SMs run at once: every block of a plan must be resident,
    since blocks wait on each other (the executor refuses a launch that does not fit)."""
    return sms * max(1, THREADS_PER_SM // threads)


def compile_variants(
    schedule: Schedule, topology: Topology, options: TuneOptions, each: Callable[[Outcome], None] | None = None
) -> list[Outcome]:
    """Every variant of the grid for ``schedule``: compiled and proven, or skipped with the reason.

    ``each`` is called with every outcome as soon as it is decided (the CLI commits and prints it then)."""
    from weft import pipeline

    outcomes = []
    for v in grid(options, send_peers(schedule)):
        try:
            # thread blocks first (compiling is cheap, proving is not): a plan the GPU cannot hold is not proven
            compiled = _compiled(schedule, topology, v, options)
            blocks = max(len(g.threadblocks) for g in compiled.gpus)
            capacity = resident_capacity(v.threads, options.sms)
            chosen = options
            if v.protocol == "lamport" and options.lamport_max_bytes is None:
                chosen = replace(options, lamport_max_bytes=lamport_limit(compiled))
            plan = (
                None if blocks > capacity else _best_scratch(schedule, topology, v, pipeline.compile_and_verify, chosen)
            )
        except (CodegenError, CheckFailed) as e:
            if isinstance(e, CheckFailed) and not v.duplex:
                raise  # a grid shape of every schedule must prove; a duplex one only where the order allows it
            outcomes.append(Outcome(v, None, f"not proven: {e}" if isinstance(e, CheckFailed) else str(e)))
            if each:
                each(outcomes[-1])
            continue
        if plan is None:
            outcomes.append(
                Outcome(
                    v,
                    None,
                    f"{blocks} thread blocks of {v.threads} threads, but {options.sms} SMs hold {capacity} at once",
                )
            )
        else:
            outcomes.append(Outcome(v, plan))
        if each:
            each(outcomes[-1])
    return outcomes


def _packet_limit(v: Variant, options: TuneOptions) -> dict[str, int]:
    """The codegen option that bounds a packet variant's message size (none for Simple ones, nor for a Lamport one
    at codegen's default)."""
    if v.protocol == "ll":
        return {"ll_max_bytes": options.ll_max_bytes}
    if v.protocol == "lamport" and options.lamport_max_bytes not in (None, LAMPORT_MAX_BYTES):
        return {"lamport_max_bytes": options.lamport_max_bytes}
    return {}


def lamport_limit(plan: Plan) -> int:
    """The largest message a Lamport variant accepts where ``--lamport-max-bytes`` is not given, read from its plan
    compiled at codegen's default: wide where each copy of its scratch holds at most ``LAMPORT_WIDE_SCRATCH`` times
    the message (the memory a rank gives the rotation grows with it), else codegen's ``LAMPORT_MAX_BYTES``."""
    per_message = max((g.scratch_chunks / g.input_chunks for g in plan.gpus if g.input_chunks), default=math.inf)
    return LAMPORT_WIDE_MAX_BYTES if per_message <= LAMPORT_WIDE_SCRATCH else LAMPORT_MAX_BYTES


def _compiled(schedule: Schedule, topology: Topology, v: Variant, options: TuneOptions) -> Plan:
    """The variant compiled, unproven (its thread blocks and scratch are read before it is proven)."""
    from codegen import compile_schedule

    extra = _packet_limit(v, options) if v.protocol != "simple" else {"pull": v.pull}
    return compile_schedule(
        schedule,
        topology,
        instances=v.instances,
        protocol=v.protocol,
        threads=v.threads,
        pipeline=v.pipeline,
        multipeer=v.multipeer,
        duplex=v.duplex,
        **extra,
    )


def _best_scratch(
    schedule: Schedule, topology: Topology, v: Variant, compile_and_verify, tune: TuneOptions | None = None
) -> Plan:
    """The variant's plan; a Simple plan alternates scratch halves where that spares waits (an entry handshake)."""
    options = {
        "instances": v.instances,
        "protocol": v.protocol,
        "threads": v.threads,
        "pipeline": v.pipeline,
        "multipeer": v.multipeer,
        "duplex": v.duplex,
    }
    if v.protocol in ("ll", "lamport"):  # LL: halves always; Lamport: three rotating scratch buffers, never halves
        return compile_and_verify(schedule, topology, **_packet_limit(v, tune or TuneOptions()), **options)
    if v.pull:  # reads peers' inputs: no scratch to alternate
        return compile_and_verify(schedule, topology, pull=True, **options)
    single = compile_and_verify(schedule, topology, double_scratch=False, **options)
    if not any(g.scratch_chunks for g in single.gpus):
        return single  # no scratch to alternate
    double = compile_and_verify(schedule, topology, double_scratch=True, **options)
    return double if _waits(double) < _waits(single) else single


def _waits(plan: Plan) -> int:
    return sum(op.name == "wait" for g in plan.gpus for tb in g.threadblocks for op in tb.ops)
