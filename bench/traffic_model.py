"""The NVLink traffic model (schedules/traffic.py) against the 2- and 4-GPU measurements, and its predictions for
4×H200 and 8×H200 at 16–256 MB, written before those machines run them.

    python bench/traffic_model.py bench/results/traffic_model.json [--markdown]

The model's parameters are fitted here (a grid, least squares on log time) to every Simple all-reduce,
reduce-scatter and all-gather measurement from 16 MB up in bench/results (2×H200 v1–v6, 4×H200), then each shape
weft tune makes for 4 and 8 ranks is predicted with them, next to NCCL's 4-GPU times from the same job.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen import compile_schedule  # noqa: E402
from schedules.collectives import Collective  # noqa: E402
from schedules.traffic import PortModel, port_bytes, predict_us  # noqa: E402
from topologies import resolve  # noqa: E402
from weft.synthesis import synthesize  # noqa: E402

MB = 1 << 20
SIZES = (16, 64, 256)
# (ranks, method, collective, codegen options, {MB: measured µs}): the measurements from 16 MB up (bench/NOTES.md)
MEASURED = [
    (2, "twoshot", "allreduce", dict(protocol="simple", instances=16), {256: 1148.0}),
    (2, "twoshot", "allreduce", dict(protocol="simple", instances=32), {256: 880.0}),
    (2, "twoshot", "allreduce", dict(protocol="simple", instances=128), {16: 58.43, 64: 201.58, 256: 749.59}),
    (4, "twoshot", "allreduce", dict(protocol="simple", instances=16), {16: 126.68}),
    (4, "twoshot", "allreduce", dict(protocol="simple", instances=32, threads=512), {64: 450.35, 256: 1721.28}),
    (
        4,
        "direct",
        "reducescatter",
        dict(protocol="simple", instances=16, double_scratch=True),
        {16: 79.91, 64: 316.86, 256: 1200.47},
    ),
    (4, "direct", "allgather", dict(protocol="simple", instances=4), {16: 51.73, 64: 168.01}),
    (4, "direct", "allgather", dict(protocol="simple", instances=16), {256: 629.98}),
]
NCCL_4 = {
    "allreduce": {16: 105.14, 64: 328.27, 256: 1191.31},
    "reducescatter": {16: 68.19, 64: 197.84, 256: 675.67},
    "allgather": {16: 69.40, 64: 193.69, 256: 663.99},
    "alltoall": {16: 68.9, 64: 193.3, 256: 662.7},  # 2026-11-27's bench/moe_run.sh (issue 36)
}  # gpu_*_bf16_graph_4xh200.json
# (label, method, collective, options) predicted at 4 and 8 ranks: today's widest that fits (a dict: by ranks), and
# the new shapes
# (label, method, collective, compile options, or options per rank count)
PREDICTED: list[tuple[str, str, str, dict[Any, Any]]] = [
    (
        "today: two-shot, widest that fits",
        "twoshot",
        "allreduce",
        {4: dict(protocol="simple", instances=32, threads=512), 8: dict(protocol="simple", instances=16, threads=512)},
    ),
    ("two-shot x64-mp", "twoshot", "allreduce", dict(protocol="simple", instances=64, multipeer=True)),
    ("two-shot x128-mp", "twoshot", "allreduce", dict(protocol="simple", instances=128, multipeer=True)),
    (
        "two-shot x64-p2-mp (pipelined)",
        "twoshot",
        "allreduce",
        dict(protocol="simple", instances=64, pipeline=2, multipeer=True),
    ),
    (
        "one-shot x128-2s-mp",
        "direct",
        "allreduce",
        dict(protocol="simple", instances=128, double_scratch=True, multipeer=True),
    ),
    (
        "today: reduce-scatter, widest that fits",
        "direct",
        "reducescatter",
        {
            4: dict(protocol="simple", instances=16, double_scratch=True),
            8: dict(protocol="simple", instances=8, double_scratch=True),
        },
    ),
    (
        "reduce-scatter x128-2s-mp",
        "direct",
        "reducescatter",
        dict(protocol="simple", instances=128, double_scratch=True, multipeer=True),
    ),
    (
        "today: all-gather, widest that fits",
        "direct",
        "allgather",
        {4: dict(protocol="simple", instances=16), 8: dict(protocol="simple", instances=8)},
    ),
    ("all-gather x128-mp", "direct", "allgather", dict(protocol="simple", instances=128, multipeer=True)),
    # issue 36: simple-x16 measured 53.8, 173.2, 651.1 µs at 16, 64, 256 MB on 4×H200 (its receive blocks only wait)
    ("all-to-all x16 (today's best)", "direct", "alltoall", dict(protocol="simple", instances=16)),
    ("all-to-all x32-dx", "direct", "alltoall", dict(protocol="simple", instances=32, duplex=True)),
    ("all-to-all x64-t512-dx", "direct", "alltoall", dict(protocol="simple", instances=64, threads=512, duplex=True)),
]


def plan_for(nranks: int, method: str, collective: str, options: dict):
    topology = resolve(f"hgx_h200:gpus={nranks}")
    return compile_schedule(synthesize(topology, collective, method), topology, **options)


def fit(plans) -> tuple[PortModel, float]:
    best = None
    for port, block, signal, local in itertools.product(
        (368.0, 400.0), (40.0, 64.0, 96.0), (2.0, 4.0, 8.0), (1.0, 2.0, 4.0)
    ):
        model = PortModel(port_gbps=port, block_gbps=block, signal_us=signal, local_factor=local)
        errors = [math.log(predict_us(p, s * MB, model) / t) for p, meas in plans for s, t in meas.items()]
        rms = math.sqrt(sum(e * e for e in errors) / len(errors))
        if best is None or rms < best[1]:
            best = (model, rms)
    assert best is not None  # the grid above is never empty
    return best


def busbw(collective: str, nranks: int, mb: int, us: float) -> float:
    factor = Collective(collective, nranks).bus_factor
    return mb * MB / us / 1e3 * factor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    measured = [(plan_for(n, m, c, o), meas) for n, m, c, o, meas in MEASURED]
    model, rms = fit(measured)
    checked = [
        {"plan": p.name, "size_mb": s, "measured_us": t, "predicted_us": round(predict_us(p, s * MB, model), 1)}
        for p, meas in measured
        for s, t in meas.items()
    ]
    rows = []
    for nranks in (4, 8):
        for label, method, collective, options in PREDICTED:
            plan = plan_for(nranks, method, collective, options.get(nranks, options))
            blocks = max(len(g.threadblocks) for g in plan.gpus)
            for mb in SIZES:
                us = predict_us(plan, mb * MB, model)
                egress, ingress = port_bytes(plan, mb * MB)[0]
                nccl = NCCL_4[collective][mb] if nranks == 4 else None
                rows.append(
                    {
                        "nranks": nranks,
                        "shape": label,
                        "plan": plan.name,
                        "threadblocks": blocks,
                        "size_mb": mb,
                        "predicted_us": round(us, 1),
                        "busbw": round(busbw(collective, nranks, mb, us), 1),
                        "egress_mb": round(egress / MB, 1),
                        "ingress_mb": round(ingress / MB, 1),
                        "nccl_4gpu_us": nccl,
                        "vs_nccl": round(us / nccl, 2) if nccl else None,
                    }
                )
    doc = {
        "model": {k: getattr(model, k) for k in model.__dataclass_fields__},
        "fit_rms_log_error": round(rms, 3),
        "checked": checked,
        "predictions": rows,
    }
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        print(f"model {doc['model']}, RMS log error {rms:.2f}")
        print("| plan | MB | measured µs | predicted µs |\n|---|---|---|---|")
        for c in checked:
            print(f"| {c['plan']} | {c['size_mb']} | {c['measured_us']} | {c['predicted_us']} |")
        print("\n| ranks | shape | blocks | MB | port out/in MB | predicted µs | busbw | × NCCL (4 GPUs) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['nranks']} | {r['shape']} | {r['threadblocks']} | {r['size_mb']} | {r['egress_mb']}/"
                f"{r['ingress_mb']} | {r['predicted_us']} | {r['busbw']} | {r['vs_nccl'] or '-'} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
