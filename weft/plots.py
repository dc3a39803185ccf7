"""PNG plots from weft's JSON results: an SMT Pareto frontier, and a GPU collective benchmark."""

from __future__ import annotations

from pathlib import Path

from topologies.errors import WeftError
from topologies.jsonfile import read_json
from weft.units import format_bytes


class PlotError(WeftError):
    """A results file that cannot be plotted."""


def _load(path: str | Path, expected: str | None) -> dict:
    doc = read_json(path, "results", PlotError)
    if not isinstance(doc, dict):
        raise PlotError(f"{path}: (top level): must be a JSON object")
    if expected and doc.get("format") != expected:
        raise PlotError(f"{path}: format: must be {expected!r}, got {doc.get('format')!r}")
    return doc


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_frontier(path: str | Path, out: str | Path) -> Path:
    """Steps against rounds per chunk for each frontier point, with the LP bound as a line."""
    doc = _load(path, "weft.frontier/1")
    points = doc.get("points")
    if not isinstance(points, list) or not points:
        raise PlotError(f"{path}: points: must be a non-empty list")
    try:
        xs = [float(p["rounds_per_chunk"]) for p in points]
        ys = [int(p["steps"]) for p in points]
    except (KeyError, TypeError, ValueError) as e:
        raise PlotError(f"{path}: points: each point needs steps and rounds_per_chunk ({e})") from None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(sorted(xs), [y for _, y in sorted(zip(xs, ys))], where="post", color="tab:blue", alpha=0.4)
    ax.scatter(xs, ys, color="tab:blue", zorder=3)
    for p, x, y in zip(points, xs, ys):
        ax.annotate(f"({p.get('steps')},{p.get('rounds')},{p.get('chunks')})", (x, y), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
    if doc.get("lp_bound") is not None:
        ax.axvline(float(doc["lp_bound"]), color="tab:red", linestyle="--", label=f"bandwidth bound {doc['lp_bound']}")
        ax.legend()
    ax.set_xlabel("rounds per chunk (bandwidth cost)")
    ax.set_ylabel("steps (latency cost)")
    ax.set_title(f"{doc.get('collective', '')} on {doc.get('topology', '')}: Pareto frontier")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_bench(path: str | Path, out: str | Path) -> Path:
    """busbw and latency against size for NCCL, symmetric memory and weft (one benchmark file)."""
    doc = _load(path, None)
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise PlotError(f"{path}: rows: must be a non-empty list")
    plt = _pyplot()
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = [r["size"] for r in rows]
    factor = _bus_factor(doc.get("collective", ""), int(doc.get("nranks", 2)))
    for key, label in (("nccl_us", "NCCL"), ("symm_us", "torch symm-mem"), ("weft_us", "weft")):
        pts = [(r["size"], r[key]) for r in rows if r.get(key)]
        if not pts:
            continue
        xs, ts = zip(*pts)
        lat.plot(xs, ts, marker="o", label=label)
        bw.plot(xs, [s / t / 1e3 * factor for s, t in pts], marker="o", label=label)
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes[:: max(1, len(sizes) // 8)], [format_bytes(s) for s in sizes[:: max(1, len(sizes) // 8)]])
        ax.set_xlabel("message size")
        ax.legend()
        ax.grid(alpha=0.3)
    lat.set_yscale("log")
    lat.set_ylabel("time (µs)")
    bw.set_ylabel("busbw (GB/s)")
    fig.suptitle(f"{doc.get('collective', '')} {doc.get('dtype', '')}, {doc.get('nranks', '')} ranks, "
                 f"{doc.get('mode', '')} ({doc.get('machine', {}).get('gpu', '') if isinstance(doc.get('machine'), dict) else doc.get('machine', '')})")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def bench_table(path: str | Path) -> str:
    """The README's performance table for one benchmark file (markdown): every row, no number retyped by hand."""
    doc = _load(path, None)
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise PlotError(f"{path}: rows: must be a non-empty list")
    factor = _bus_factor(doc.get("collective", ""), int(doc.get("nranks", 2)))
    lines = ["| size | NCCL µs | symm-mem µs | weft µs | weft / NCCL | busbw GB/s (NCCL) | weft plan | #wrong |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nccl, symm, weft = r.get("nccl_us"), r.get("symm_us"), r.get("weft_us")
        best = min((t for t in (nccl, symm, weft) if t), default=None)

        def cell(t: float | None) -> str:
            if not t:
                return "–"
            text = f"{t:.1f}" if t >= 100 else f"{t:.2f}"
            return f"**{text}**" if t == best else text

        ratio = f"{weft / nccl:.2f}" if weft and nccl else "–"
        busbw = (f"{r['size'] / weft / 1e3 * factor:.0f} ({r['size'] / nccl / 1e3 * factor:.0f})"
                 if weft and nccl else "–")
        lines.append(f"| {format_bytes(r['size'])} | {cell(nccl)} | {cell(symm)} | {cell(weft)} | {ratio} | {busbw} "
                     f"| {_short_plan(r.get('plan'))} | {r.get('wrong', '–')} |")
    return "\n".join(lines) + "\n"


def _short_plan(name: str | None) -> str:
    """'direct-allreduce-hgx_h200:gpus=2-ll-x1-t256' -> 'direct ll-x1-t256'."""
    if not name:
        return "–"
    parts = name.split("-")
    protocol = next((i for i, p in enumerate(parts) if p in ("ll", "simple")), None)
    return name if protocol is None else f"{parts[0]} {'-'.join(parts[protocol:])}"


def _bus_factor(collective: str, n: int) -> float:
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n
