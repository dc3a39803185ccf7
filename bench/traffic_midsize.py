"""The NVLink traffic model (schedules/traffic.py) fitted to the 4×H200 all-reduce measurements at 256 KB–256 MB,
and its predictions for the mid sizes (1–16 MB) of every shape ``weft tune`` can make and of those it could,
written before a GPU runs them (issue 33).

    python bench/traffic_midsize.py bench/results/traffic_predictions_midsize_4xh200.json [--markdown]

The fit: least squares on log time (scipy) over every plan of `results/gpu_allreduce_bf16_graph_4xh200.json` (graph
replay, bf16; LL plans with and without LL128 lines), each plan compiled again from its name. Only measured data;
the residuals go in the output. Then each candidate shape is predicted at 1, 2, 4, 8 and 16 MB against the peers'
measured times (vLLM's two-shot and torch symmetric memory, 4×H200 in issue 33's tables, 4×H100 in the bench file).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen import compile_schedule  # noqa: E402
from codegen.protocol import CodegenError  # noqa: E402
from schedules.plan.types import Plan  # noqa: E402
from schedules.traffic import MIDSIZE_H200X4, PortModel, predict_us  # noqa: E402
from topologies import resolve  # noqa: E402
from weft.synthesis import synthesize  # noqa: E402

MB = 1 << 20
MEASURED = ROOT / "bench" / "results" / "gpu_allreduce_bf16_graph_4xh200.json"
FIT_SIZES = (64 << 10, 256 << 10, MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB)
SIZES = (MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB)
# each fitted parameter with the range that keeps it physical (a least-squares fit left free drifts into a 440 GB/s
# block whose sums run at a fifth of its writes and an 8 µs launch: no better a fit, and no model of a GPU)
BOUNDS = {
    "port_gbps": (250.0, 480.0),  # an H200's NVLink port: 450 GB/s a direction on paper, 368 measured writing
    "block_gbps": (8.0, 160.0),
    "local_factor": (0.5, 8.0),
    "signal_us": (0.5, 6.0),
    "launch_us": (1.0, 5.0),  # v10's trace: 1.0-1.4 µs from launch to first op, graph replay's launch on top
    "op_us": (0.0, 3.0),
    "packet_us": (0.05, 4.0),
    "packet_rate": (0.2, 2.0),
}
FITTED = tuple(BOUNDS)
# the peers' measured times (µs, bf16, graph replay, 4 GPUs): issue 33's 4×H200 table (vLLM and symmetric memory at
# 1, 4, 16 MB) and the 4×H100 bench file with both in one job (gpu_allreduce_bf16_graph_4xh100.json)
PEERS_H200 = {"vllm": {MB: 12.58, 4 * MB: 30.16, 16 * MB: 95.91}, "symm": {MB: 14.32, 4 * MB: 31.92, 16 * MB: 98.44}}
NAME = re.compile(
    r"^(?P<method>\w+)-allreduce-hgx_h200:gpus=4-(?P<protocol>ll|simple|lamport)-x(?P<instances>\d+)"
    r"(-p(?P<pipeline>\d+))?(-t(?P<threads>\d+))?(?P<double>-2s)?(?P<pull>-pull)?(?P<mp>-mp)?(-max(?P<max>\d+)MB)?$"
)


def options_of(name: str) -> tuple[str, dict[str, Any]]:
    """(method, compile options) of a 4-rank all-reduce plan name as codegen writes it."""
    m = NAME.match(name)
    if m is None:
        raise ValueError(f"{name}: not a plan name this script reads")
    options: dict[str, Any] = {
        "protocol": m["protocol"],
        "instances": int(m["instances"]),
        "pipeline": int(m["pipeline"] or 1),
        "threads": int(m["threads"] or 1024),
        "multipeer": bool(m["mp"]),
    }
    if m["protocol"] == "simple":
        options.update(pull=bool(m["pull"]), double_scratch=bool(m["double"]))
    if m["max"]:
        options["lamport_max_bytes" if m["protocol"] == "lamport" else "ll_max_bytes"] = int(m["max"]) * MB
    return m["method"], options


def compiled(method: str, options: dict[str, Any]) -> Plan:
    topology = resolve("hgx_h200:gpus=4")
    return compile_schedule(synthesize(topology, "allreduce", method), topology, **options)


def measurements(path: Path = MEASURED) -> list[tuple[Plan, int, bool, float]]:
    """(plan, size, LL128 lines, measured µs) for every plan of the bench file at the fit's sizes."""
    rows = json.loads(path.read_text())["rows"]
    plans: dict[str, Plan] = {}
    out = []
    for row in rows:
        if row["size"] not in FIT_SIZES:
            continue
        for key, us in row["median_us"].items():
            if not key.startswith("weft:"):
                continue
            name = key[len("weft:") :]
            lines = name.endswith("+ll128")
            name = name.removesuffix("+ll128")
            if name not in plans:
                plans[name] = compiled(*options_of(name))
            out.append((plans[name], row["size"], lines, us))
    return out


def fit(
    points: list[tuple[Plan, int, bool, float]], start: PortModel, evaluations: int = 8, verbose: int = 0
) -> tuple[PortModel, list[float]]:
    """The model whose log times are nearest the points' (least squares over FITTED, in log space)."""

    def model_of(x: np.ndarray) -> PortModel:
        return replace(start, **{k: float(math.exp(v)) for k, v in zip(FITTED, x, strict=True)})

    def residuals(x: np.ndarray) -> np.ndarray:
        model = model_of(x)
        return np.array([math.log(predict_us(p, s, model, lines) / us) for p, s, lines, us in points])

    lo = np.array([math.log(max(BOUNDS[k][0], 1e-3)) for k in FITTED])
    hi = np.array([math.log(BOUNDS[k][1]) for k in FITTED])
    x0 = np.clip(np.array([math.log(max(getattr(start, k), 1e-3)) for k in FITTED]), lo + 1e-6, hi - 1e-6)
    result = least_squares(residuals, x0, bounds=(lo, hi), diff_step=0.05, max_nfev=evaluations, verbose=verbose)
    return model_of(result.x), list(result.fun)


def fit_points(points: list[tuple[Plan, int, bool, float]]) -> list[tuple[Plan, int, bool, float]]:
    """The points the fit uses: 64 KB, 1, 4, 16 and 256 MB, plans within 1.5× the fastest at their size (the
    shapes that contend; the rest, and 256 KB and 64 MB, are checked, not fitted)."""
    best: dict[int, float] = {}
    for _, s, _, us in points:
        best[s] = min(best.get(s, math.inf), us)
    sizes = (64 << 10, MB, 4 * MB, 16 * MB, 256 * MB)
    return [x for x in points if x[1] in sizes and x[3] <= 1.5 * best[x[1]]]


# (label, method, compile options, LL128 lines, how `weft tune` makes it, or why it cannot)
Candidate = tuple[str, str, dict[str, Any], bool, str]
WIDE = 16 * MB  # packet variants' limit for these predictions (tune: --ll-max-bytes / --lamport-max-bytes 16MB)


def tune_flags(method: str, options: dict[str, Any]) -> str:
    """The `weft tune allreduce -t hgx_h200:gpus=4` flags that make this shape (and `weft bench --ll128` for lines)."""
    flags = [
        f"--method {method}",
        f"--protocols {options['protocol']}",
        f"--instances {options['instances']}",
        f"--threads {options['threads']}",
    ]
    flags += [f"--pipeline {options['pipeline']}"] if options.get("pipeline", 1) > 1 else []
    flags += ["--pull"] if options.get("pull") else []
    flags += [] if options.get("multipeer") else ["--no-multipeer"]
    flags += ["--ll-max-bytes 16MB"] if options.get("ll_max_bytes") else []
    flags += ["--lamport-max-bytes 16MB"] if options.get("lamport_max_bytes") else []
    return " ".join(flags)


def candidates() -> list[Candidate]:
    """Every mid-size shape: tune's grid at 4 ranks (two-shot, one-shot, ring; Simple with pipelines, pull and
    multi-peer blocks; LL with and without lines; Lamport), and vLLM's own two-shot shape (36 blocks of 512
    threads that pull), which no power-of-two size fills."""
    out: list[Candidate] = []
    for i in (4, 8, 16, 32, 64, 128):
        for t in (512, 1024):
            suffix = f"x{i}" + ("-t512" if t == 512 else "")
            for mp in (False, True):
                mps = "-mp" if mp else ""
                base = dict(instances=i, threads=t, multipeer=mp)
                shapes: list[tuple[str, str, dict[str, Any], bool]] = [
                    (
                        f"two-shot simple {suffix}{f'-p{d}' if d > 1 else ''}{mps}",
                        "twoshot",
                        dict(base, protocol="simple", pipeline=d),
                        False,
                    )
                    for d in (1, 2, 4)
                ]
                shapes.append(
                    (f"two-shot simple {suffix}-pull{mps}", "twoshot", dict(base, protocol="simple", pull=True), False)
                )
                shapes.append(
                    (
                        f"one-shot simple {suffix}-2s{mps}",
                        "direct",
                        dict(base, protocol="simple", double_scratch=True),
                        False,
                    )
                )
                for method, what in (("twoshot", "two-shot"), ("direct", "one-shot")):
                    ll = dict(base, protocol="ll", ll_max_bytes=WIDE)
                    shapes.append((f"{what} LL16 {suffix}{mps}", method, ll, False))
                    shapes.append((f"{what} LL128 {suffix}{mps}", method, ll, True))
                    lamport = dict(base, protocol="lamport", lamport_max_bytes=WIDE)
                    shapes.append((f"{what} Lamport {suffix}{mps}", method, lamport, False))
                out += [(label, m, o, lines, tune_flags(m, o)) for label, m, o, lines in shapes]
            ring = dict(instances=i, threads=t, protocol="simple")
            out.append((f"ring simple {suffix}", "ring", ring, False, tune_flags("ring", ring)))
    vllm = dict(instances=36, threads=512, multipeer=True, protocol="simple", pull=True)
    why = "cannot: 36 instances fill no power-of-two size (the bench skips it)"
    out.append(("vLLM's shape: two-shot simple x36-t512-pull", "twoshot", vllm, False, why))
    return out


def predictions(model: PortModel, measured: dict[tuple[str, bool, int], float]) -> list[dict[str, Any]]:
    """Each candidate that the GPU can hold, predicted at every mid size (and its measured time where one exists)."""
    from weft.tuning import resident_capacity

    rows = []
    for label, method, options, lines, _ in candidates():
        try:
            plan = compiled(method, options)
        except CodegenError:
            continue  # a shape codegen refuses (pull on a one-shot, ...)
        blocks = max(len(g.threadblocks) for g in plan.gpus)
        if blocks > resident_capacity(options["threads"], 132):
            continue
        for size in SIZES:
            rows.append(
                {
                    "shape": label,
                    "plan": plan.name + ("+ll128" if lines else ""),
                    "threadblocks": blocks,
                    "threads": options["threads"],
                    "size": size,
                    "predicted_us": round(predict_us(plan, size, model, lines), 2),
                    # what-if: a plan compiled to its own kernel, without the interpreter's ~1 µs prologue (v10)
                    "predicted_us_no_prologue": round(
                        predict_us(plan, size, replace(model, launch_us=model.launch_us - 1.0), lines), 2
                    ),
                    "measured_us": measured.get((_unbounded(plan.name), lines, size)),
                }
            )
    return rows


def residual_rows(points: list[tuple[Plan, int, bool, float]], model: PortModel) -> list[dict[str, Any]]:
    return [
        {
            "plan": p.name + ("+ll128" if lines else ""),
            "size": s,
            "measured_us": round(us, 2),
            "predicted_us": round(t := predict_us(p, s, model, lines), 2),
            "log_error": round(math.log(t / us), 3),
        }
        for p, s, lines, us in points
    ]


def rms_by_size(rows: list[dict[str, Any]]) -> dict[str, float]:
    sizes = sorted({r["size"] for r in rows})
    return {
        f"{s >> 10}KB" if s < MB else f"{s >> 20}MB": round(
            math.sqrt(sum(r["log_error"] ** 2 for r in rows if r["size"] == s) / sum(r["size"] == s for r in rows)),
            3,
        )
        for s in sizes
    }


def peers_h100(path: Path = ROOT / "bench" / "results" / "gpu_allreduce_bf16_graph_4xh100.json") -> dict[str, dict]:
    rows = json.loads(path.read_text())["rows"]
    out: dict[str, dict[int, float]] = {"vllm": {}, "symm": {}, "weft": {}}
    for row in rows:
        if MB <= row["size"] <= 16 * MB:
            for key, field in (("vllm", "vllm_us"), ("symm", "symm_us"), ("weft", "weft_us")):
                if row.get(field):
                    out[key][row["size"]] = round(row[field], 2)
    return out


def winners(rows: list[dict[str, Any]], top: int = 5) -> dict[int, list[dict[str, Any]]]:
    """The ``top`` predicted fastest shapes at each size (one row per plan)."""
    out = {}
    for size in SIZES:
        ranked = sorted((r for r in rows if r["size"] == size), key=lambda r: r["predicted_us"])
        out[size] = ranked[:top]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--refit", type=int, default=0, help="fit again from MIDSIZE_H200X4 with this many evaluations")
    args = parser.parse_args()
    points = measurements()
    model = MIDSIZE_H200X4
    if args.refit:
        model, _ = fit(fit_points(points), model, args.refit)
    checked = residual_rows(points, model)
    fitted = {(r["plan"], r["size"]) for r in residual_rows(fit_points(points), model)}
    before = residual_rows(
        [x for x in points if x[1] >= 16 * MB],
        PortModel(port_gbps=400.0, block_gbps=64.0, local_factor=1.0, signal_us=2.0, launch_us=4.0),
    )
    measured = {(_unbounded(p.name), lines, s): round(us, 2) for p, s, lines, us in points if MB <= s <= 16 * MB}
    rows = predictions(model, measured)
    flags = {label: how for label, _, _, _, how in candidates()}
    doc = {
        "model": "schedules.traffic.predict_us, traffic/2 (packets' wire bytes, packet arrival, op issue)",
        "parameters": asdict(model),
        "fitted_on": str(MEASURED.relative_to(ROOT)),
        "fit": "least squares on log time over the points marked fitted (64 KB, 1, 4, 16, 256 MB; plans within "
        "1.5x the fastest at their size), each parameter within BOUNDS",
        "rms_log_error": {
            "fitted": _rms([r for r in checked if (r["plan"], r["size"]) in fitted]),
            "all": _rms(checked),
        },
        "rms_log_error_by_size": rms_by_size(checked),
        "rms_log_error_16mb_up": {
            "traffic/1 (results/traffic_model.json's fit)": _rms(before),
            "traffic/2": _rms([r for r in checked if r["size"] >= 16 * MB]),
        },
        "peers_4xh200_issue33_us": {k: {str(s): v for s, v in d.items()} for k, d in PEERS_H200.items()},
        "peers_4xh100_us": {k: {str(s): v for s, v in d.items()} for k, d in peers_h100().items()},
        "checked": [dict(r, fitted=(r["plan"], r["size"]) in fitted) for r in checked],
        "predictions": rows,
        "tune": flags,
        "winners": {str(s): [r["plan"] for r in w] for s, w in winners(rows).items()},
    }
    args.output.write_text(dump(doc))
    if args.markdown:
        print(f"parameters {doc['parameters']}\nRMS log error {doc['rms_log_error']}")
        print(f"by size {doc['rms_log_error_by_size']}")
        print(f"16 MB up: {doc['rms_log_error_16mb_up']}")
        print("| size | shape (blocks x threads) | predicted µs | measured µs | vLLM / symm (4xH200) | tune |")
        print("|---|---|---|---|---|---|")
        for size, ranked in winners(rows).items():
            peers = " / ".join(str(PEERS_H200[k].get(size, "-")) for k in ("vllm", "symm"))
            for r in ranked:
                print(
                    f"| {size >> 20} MB | {r['shape']} ({r['threadblocks']}x{r['threads']}) | {r['predicted_us']} | "
                    f"{r['measured_us'] or '-'} | {peers} | {flags[r['shape']]} |"
                )
    return 0


def dump(doc: dict[str, Any]) -> str:
    """The document as JSON, one line per row of its lists (a file that reviews well in git)."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list):
            rows = ",\n  ".join(json.dumps(v) for v in value)
            parts.append(f"{json.dumps(key)}: [\n  {rows}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def _unbounded(name: str) -> str:
    """A plan's name without its packet size limit (``-max8MB``): the same shape, measured under either name."""
    return re.sub(r"-max\d+MB$", "", name)


def _rms(rows: list[dict[str, Any]]) -> float:
    return round(math.sqrt(sum(r["log_error"] ** 2 for r in rows) / max(len(rows), 1)), 3)


if __name__ == "__main__":
    sys.exit(main())
