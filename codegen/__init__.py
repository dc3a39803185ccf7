"""codegen: lowers a Schedule into an execution Plan (MSCCL++ plan JSON) and exports MSCCL XML.

One pass per module, run in this order by ``compile_schedule``:
``buffers`` (placement) -> ``lower`` (actions) -> ``replicate`` (instances) -> ``threadblocks`` ->
``merge`` (ranges) -> ``sync`` (signal/wait, semaphores, the entry handshake that ``launches`` asks for) ->
``fuse`` -> ``protocol`` (size range) -> ``assemble``. ``msccl_xml`` exports a Plan for the MSCCL/RCCL runtimes.

>>> from schedules.collectives import Collective
>>> from schedules.schedule import Schedule, Send, Step
>>> s = Schedule(Collective("allgather", 2), "t", (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),))
>>> compile_schedule(s, protocol="simple").protocol
'Simple'
"""

from __future__ import annotations

from dataclasses import replace

from codegen.assemble import assemble
from codegen.buffers import place_buffers
from codegen.fuse import fuse
from codegen.limits import fit_mscclpp_limits
from codegen.lower import lower
from codegen.merge import merge_ranges
from codegen.peers import gather_peers
from codegen.ports import crosses_hosts, port_channels
from codegen.protocol import LAMPORT_MAX_BYTES, LL_MAX_BYTES, CodegenError, choose_protocol, size_range
from codegen.replicate import pipeline as split_pipeline
from codegen.sync import insert_sync
from codegen.threadblocks import assign_threadblocks
from schedules.compact import expand
from schedules.lamport import PROTOCOL as LAMPORT
from schedules.lamport import LamportBuffers
from schedules.plan.types import MAX_THREADS_PER_BLOCK, PACKET_PROTOCOLS, Plan, PlanMeta
from schedules.schedule import Schedule

MAX_INSTANCES = 256
MAX_THREADS = MAX_THREADS_PER_BLOCK  # the plan reader refuses more: one range for both

__all__ = ["CodegenError", "compile_schedule"]


def compile_schedule(
    schedule: Schedule,
    topology: object = None,
    instances: int = 1,
    protocol: str = "auto",
    inplace: bool = False,
    threads: int = 1024,
    double_scratch: bool | None = None,
    pipeline: int = 1,
    pull: bool = False,
    ll_max_bytes: int = LL_MAX_BYTES,
    multipeer: bool = False,
    duplex: bool = False,
    lamport_max_bytes: int = LAMPORT_MAX_BYTES,
) -> Plan:
    """The execution Plan for ``schedule`` (``topology``: its fingerprint is recorded, and on a topology of several
    hosts every hop between hosts goes on a port channel, ``codegen.ports``; such plans are Simple).

    ``threads`` is the thread-block size. ``double_scratch`` alternates scratch halves between launches (default:
    LL plans only); for a Simple plan it doubles scratch but can drop the entry handshake (``codegen.launches``).
    ``protocol`` lamport: the packet ops move the data alone, as its own flag, in three scratch buffers that rotate
    and are reset off the critical path (``schedules.lamport``, ``codegen.lamport``).
    ``pipeline`` cuts each instance's piece into that many sub-pieces that overlap transfer and combining.
    ``pull``: a receiver reads a chunk straight from its peer's input (``get``/``rre``) instead of the peer
    writing it into the receiver's scratch (``codegen.lower``); Simple, out-of-place plans only.
    ``ll_max_bytes``: the largest message an LL plan accepts, a whole number of MB (default ``LL_MAX_BYTES``;
    otherwise the plan's name ends in ``-max`` and the size).
    ``multipeer``: one thread block per instance serves every peer, each phase one op over all its channels
    (``codegen.peers``); the plan's name ends in ``-mp``.
    ``duplex``: a receive role that forwards nothing shares the send role's thread block for the same peer
    (``codegen.threadblocks``); the plan's name ends in ``-dx``.
    ``lamport_max_bytes``: the largest message a Lamport plan accepts, a whole number of MB (default
    ``LAMPORT_MAX_BYTES``; otherwise the plan's name ends in ``-max`` and the size).
    """
    if not isinstance(instances, int) or not 1 <= instances <= MAX_INSTANCES:
        raise CodegenError(f"--instances: must be an integer from 1 to {MAX_INSTANCES}, got {instances!r}")
    source_hash = schedule.content_hash  # the file the user holds, compact or not
    schedule = expand(schedule)  # a plan names every send; a compact schedule is written out first
    if not isinstance(threads, int) or threads % 32 or not 32 <= threads <= MAX_THREADS:
        raise CodegenError(f"--threads: must be a multiple of 32 from 32 to {MAX_THREADS}, got {threads!r}")
    if not isinstance(pipeline, int) or not 1 <= pipeline <= MAX_INSTANCES // instances:
        raise CodegenError(
            f"--pipeline: must be an integer from 1 to {MAX_INSTANCES // instances} with "
            f"{instances} instance(s) (instances x pipeline <= {MAX_INSTANCES}), got {pipeline!r}"
        )
    hosts = tuple(getattr(topology, "hosts", ()) or ())
    multi_host = crosses_hosts(hosts)
    if multi_host and (protocol.lower() in ("ll", "lamport") or pull):
        raise CodegenError(
            f"--protocol {protocol.lower()} / --pull: a plan across hosts moves data over port channels, which "
            "carry plain puts only (use the Simple protocol, without --pull)"
        )
    chosen = "Simple" if multi_host else choose_protocol(schedule, protocol)
    packets = chosen in PACKET_PROTOCOLS
    if pull and (packets or inplace):
        raise CodegenError(
            "--pull: only Simple, out-of-place plans read their peers' inputs (LL and Lamport packets are "
            "written by their sender; an in-place input is overwritten)"
        )
    if ll_max_bytes != LL_MAX_BYTES and (
        chosen != "LL" or not isinstance(ll_max_bytes, int) or ll_max_bytes <= 0 or ll_max_bytes % (1 << 20)
    ):
        raise CodegenError(
            f"--ll-max-bytes: a whole number of MB, for LL plans only; got {ll_max_bytes!r} B for a {chosen} plan"
        )
    if lamport_max_bytes != LAMPORT_MAX_BYTES and (
        chosen != LAMPORT
        or not isinstance(lamport_max_bytes, int)
        or lamport_max_bytes <= 0
        or lamport_max_bytes % (1 << 20)
    ):
        raise CodegenError(
            f"--lamport-max-bytes: a whole number of MB, for Lamport plans only; got {lamport_max_bytes!r} B for a "
            f"{chosen} plan"
        )
    double = chosen == "LL" if double_scratch is None else bool(double_scratch)
    if chosen == "LL" and not double:
        raise CodegenError("--double-scratch: LL plans always alternate scratch halves (packet flags need it)")
    if chosen == LAMPORT and double:
        raise CodegenError("--double-scratch: Lamport plans rotate three scratch buffers instead (schedules.lamport)")
    collective = schedule.collective
    placement = place_buffers(collective, inplace)
    lowered = lower(schedule, placement, packets, pull)
    if multipeer or (pull and collective.nranks > 2):
        # One thread block per instance: a pull from several peers at once and the notices and sends around it
        # would otherwise put signals (or waits) of one channel in two thread blocks, out of program order.
        lowered = [replace(a, via=("all", -1)) for a in lowered]
    actions = split_pipeline(lowered, instances, pipeline, placement)
    copies = instances * pipeline
    assign_threadblocks(actions, duplex)
    programs = insert_sync(merge_ranges(actions), double_scratch=double, lamport=chosen == LAMPORT)
    gather = gather_peers if multipeer else (lambda ops: ops)
    programs = {r: {t: fuse(gather(ops)) for t, ops in tbs.items()} for r, tbs in programs.items()}
    lo, hi = size_range(chosen, ll_max_bytes, lamport_max_bytes)
    fingerprint = getattr(topology, "fingerprint", schedule.topology)
    meta = PlanMeta(
        topology=fingerprint,
        schedule_hash=source_hash,
        solver=schedule.meta.solver,
        chunks=collective.chunks,
        root=collective.root,
        instances=instances,
        predicted_us=dict(schedule.meta.predicted_us),
    )
    name = f"{schedule.name or collective.name}-{chosen.lower()}-x{instances}"
    name += (f"-p{pipeline}" if pipeline > 1 else "") + (f"-t{threads}" if threads != MAX_THREADS else "")
    name += ("-2s" if double and chosen != "LL" else "") + ("-pull" if pull else "") + ("-mp" if multipeer else "")
    name += "-dx" if duplex else ""
    name += f"-max{ll_max_bytes >> 20}MB" if ll_max_bytes != LL_MAX_BYTES else ""
    name += f"-max{lamport_max_bytes >> 20}MB" if lamport_max_bytes != LAMPORT_MAX_BYTES else ""
    plan = assemble(
        programs,
        name=name,
        collective=collective.name,
        protocol=chosen,
        inplace=inplace,
        nranks=collective.nranks,
        input_chunks=placement.input_chunks * copies,
        output_chunks=placement.output_chunks * copies,
        scratch=[s * copies for s in placement.scratch],
        meta=meta,
    )
    plan = replace(
        plan,
        min_message_size=lo,
        max_message_size=hi,
        num_threads_per_block=threads,
        use_double_scratch_buffer=double,
        lamport=LamportBuffers() if chosen == LAMPORT else None,
    )
    return fit_mscclpp_limits(port_channels(plan, hosts) if multi_host else plan)
