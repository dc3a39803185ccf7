"""Row-owning all-reduce plans: the final reductions regrouped so that each thread block owns whole rows.

A fused all-reduce + residual add + RMSNorm (``executor.reference.norm``) normalizes whole rows (a token's hidden state)
in the launch, after their sums: the thread block that completes a row's sum must hold the whole row, since a
row's norm needs every one of its elements. One-shot plans spread the final reductions over many thread blocks
(two chunks each in ``direct ... -ll-x32``), so a row of 8192 bf16 is summed by several blocks. ``own_rows``
rewrites such a plan so that ``groups`` thread blocks each complete one contiguous ``1/groups`` of the output in
a single reduction, leaving every other op (the sends, with their spread over thread blocks) as it was. The
rows then fit a size ``nbytes`` when ``nbytes / groups`` is a whole number of rows, or an aligned, equal fraction
of one, whose blocks then exchange their sums of squares (``executor.reference.norm.row_spans`` checks it per call, from
the plan alone; plain one-shot plans, with one reduction per block, fit that way too).

>>> from schedules.plan import load_plan
>>> plan = own_rows(load_plan("tests/fixtures/plans/direct_ll_x4_2.json"), 1)
>>> plan.name.endswith("-rows1"), [len(tb.ops) for tb in plan.gpus[0].threadblocks]
(True, [1, 1, 1, 1, 1])
"""

from __future__ import annotations

from dataclasses import replace

from codegen.protocol import CodegenError
from schedules.plan.types import BufferRef, Gpu, Op, Plan, Threadblock


def own_rows(plan: Plan, groups: int) -> Plan:
    """``plan`` with its output-completing reductions merged into ``groups`` thread blocks of contiguous chunks.

    Only local reductions whose every entry is the same chunk range of its buffer (``re``/``repkt`` of
    ``i[k..]`` and ``s[k..]`` into ``o[k..]``, as one-shot plans end) are regrouped; a plan with any other kind
    of output write is refused. The result is unverified: commit it through ``weft.publish`` (reference
    executor) like any plan."""
    if plan.facts is None or not plan.facts.sums_everywhere:
        raise CodegenError(f"plan {plan.name}: only an all-reduce's rows can be owned (it runs {plan.collective})")
    gpus = tuple(_regroup(plan, g, groups) for g in plan.gpus)
    return replace(plan, name=f"{plan.name}-rows{groups}", gpus=gpus).with_meta(verification=None)


def _regroup(plan: Plan, gpu: Gpu, groups: int) -> Gpu:
    where = f"plan {plan.name}: gpus[{gpu.id}]"
    chunks = gpu.output_chunks
    if groups < 1 or chunks % groups:
        raise CodegenError(f"{where}: {chunks} output chunks do not split into {groups} row groups")
    reducing = [tb for tb in gpu.threadblocks if any(_writes_output(op) for op in tb.ops)]
    pieces: list[tuple[int, int, Op]] = []
    for tb in reducing:
        for k, op in enumerate(tb.ops):
            if not _plain_reduction(op):
                raise CodegenError(
                    f"{where}.threadblocks[{tb.id}].ops[{k}]: op {op.name!r} shares a thread block "
                    "with output writes but is not a local reduction of one chunk range into the "
                    "output; the block's rows cannot be regrouped"
                )
            pieces.append((op.dst_buff[0].index, op.dst_buff[0].size, op))
    pieces.sort(key=lambda p: p[0])
    covered = [c for first, size, _ in pieces for c in range(first, first + size)]
    if covered != list(range(chunks)):
        raise CodegenError(f"{where}: the reductions do not write every output chunk exactly once")
    if len({(op.name, tuple(b.type for b in op.src_buff)) for _, _, op in pieces}) != 1:
        raise CodegenError(f"{where}: the reductions differ in kind; their rows cannot be merged")
    span = chunks // groups
    template = pieces[0][2]
    merged = [
        replace(
            template,
            src_buff=tuple(BufferRef(g * span, span, b.type) for b in template.src_buff),
            dst_buff=(BufferRef(g * span, span, "o"),),
        )
        for g in range(groups)
    ]
    first = {tb.id for tb in reducing[:groups]}
    if len(reducing) < groups:
        raise CodegenError(f"{where}: {len(reducing)} reducing thread blocks, fewer than {groups} row groups")
    kept: list[Threadblock] = []
    g = 0
    for tb in gpu.threadblocks:
        if tb in reducing and tb.id not in first:
            continue
        if tb.id in first:
            tb = Threadblock(tb.id, (merged[g],))
            g += 1
        kept.append(replace(tb, id=len(kept)))
    return replace(gpu, threadblocks=tuple(kept))


def _writes_output(op: Op) -> bool:
    return any(not b.remote and b.type == "o" for b in op.dst_buff)


def _plain_reduction(op: Op) -> bool:
    """A local reduction whose entries all name the same chunk range (one per buffer), written to the output."""
    spec = op.spec
    if not (spec.reduces and spec.local_only and len(op.dst_buff) == 1 and op.dst_buff[0].type == "o"):
        return False
    ranges = {(b.index, b.size) for b in (*op.src_buff, *op.dst_buff)}
    types = [b.type for b in op.src_buff]
    return len(ranges) == 1 and len(set(types)) == len(types) and "o" not in types
