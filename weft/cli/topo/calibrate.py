"""``weft topo calibrate TOPO [RESULTS ...] [--write] [--json]``: fit the cost model to a fabric's measured plans
and report the fit's residuals."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from weft.cli.words import counted
from weft.units import format_bytes


def register(topo_sub: argparse._SubParsersAction) -> None:
    q = topo_sub.add_parser(
        "calibrate",
        help="fit the cost model's launch, hop and protocol terms to a fabric's GPU results",
        description="Fit the calibrated cost model (schedules.calibration) to the plans measured on TOPO in GPU "
        "bench results (default: the committed bench/results/gpu_*_graph_<N>x*.json), and report "
        "the fit's residuals: predicted over measured time at every plan and size. With --write, "
        "weft prices plans on this fabric with the fit from then on (registry commits and `weft tune`).",
    )
    q.add_argument("topology", metavar="TOPO", help="catalog spec or topology file of the measured machine")
    q.add_argument("results", nargs="*", type=Path, help="bench results files (JSON written by `weft bench`)")
    q.add_argument("--write", action="store_true", help="store the calibration with weft's calibrations")
    q.add_argument("--json", action="store_true", help="print the calibration (terms, residuals) as JSON")
    q.set_defaults(func=run)


def report(calibration) -> list[str]:
    """The lines `weft topo calibrate` prints: terms, residuals overall and per collective, and every point
    outside the tolerance."""
    from schedules.calibration import PROTOCOLS, TOLERANCE

    r = calibration.residuals()
    t = calibration.terms
    fitted = [p for p in PROTOCOLS if p in calibration.protocols]  # the others keep their defaults: not shown

    def each(term: str, show) -> str:
        """A per-protocol term of every fitted protocol, each ``show(protocol, value)``: 'LL 1.06 µs, Simple 4.5 µs'."""
        return ", ".join(show(p, t[f"{term}.{p}"]) for p in fitted)

    lines = [
        f"calibration of {calibration.topology_name} ({calibration.topology}) from "
        f"{counted(r['points'], 'measurement', 'measurements')} in "
        f"{', '.join(calibration.sources) or 'the given observations'}",
        f"  launch {t['launch_us']:.2f} µs + {t['warps_us'] * 1e3:.3f} ns per warp; hop "
        + each("hop_us", lambda p, v: f"{p} {v:.2f} µs")
        + "; link efficiency "
        + each("efficiency", lambda p, v: f"{p} {v:.2f}"),
        "  a 1024-thread block moves "
        + each("threadblock_us_per_byte", lambda p, v: f"{1e-3 / v:.1f} GB/s of {p}")
        + f"; GPU memory {1e-3 / t['memory_us_per_byte']:.0f} GB/s",
        "  a further wait in a hop "
        + each("arrival_us", lambda p, v: f"{p} {v:.2f} µs")
        + "; a further source of one wait "
        + each("source_us", lambda p, v: f"{p} {v:.2f} µs")
        + f"; chunks off 16-byte boundaries {1 + t['misaligned_slowdown']:.2f}x slower",
        f"residuals (predicted / measured): {r['within_tolerance']} of {r['points']} within {TOLERANCE}x, worst "
        f"{r['worst_ratio']:.2f}x, rms of log ratio {r['rms_log_ratio']:.3f}",
    ]
    ratios = calibration.ratios()
    by_collective: dict[str, list[float]] = {}
    for o, ratio in zip(calibration.observations, ratios, strict=True):
        by_collective.setdefault(o.collective, []).append(max(ratio, 1 / ratio))
    for name, worst in sorted(by_collective.items()):
        lines.append(f"  {name:<14} {counted(len(worst), 'point', 'points'):>11}, worst {max(worst):.2f}x")
    outside = [
        (o, ratio)
        for o, ratio in zip(calibration.observations, ratios, strict=True)
        if not 1 / TOLERANCE <= ratio <= TOLERANCE
    ]
    if outside:
        lines.append(f"outside {TOLERANCE}x:")
        for o, ratio in sorted(outside, key=lambda p: -max(p[1], 1 / p[1])):
            lines.append(
                f"  {o.plan} at {format_bytes(o.nbytes)}: predicted {o.measured_us * ratio:.1f} µs, "
                f"measured {o.measured_us:.1f} µs ({ratio:.2f}x)"
            )
    return lines


def run(args: argparse.Namespace) -> int:
    from schedules.calibration import calibration_path
    from topologies import resolve
    from weft.calibrate import calibrate
    from weft.cli import progress_after
    from weftcore.jsonfile import write_text

    topology = resolve(args.topology)
    calibration = calibrate(topology, list(args.results) or None, progress_after())
    if args.json:
        doc = calibration.to_json()
        print(json.dumps({k: v for k, v in doc.items() if k != "observations"}, indent=2))
    else:
        print("\n".join(report(calibration)))
    if args.write:
        from schedules.calibration import CalibrationError, dumps

        path = calibration_path(topology.name)
        write_text(path, dumps(calibration), "calibration", CalibrationError, parents=True)
        print(f"wrote {path}")
    return 0
