"""PNG plots from weft's JSON results: an SMT Pareto frontier, and a GPU collective benchmark."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

from codegen.protocol import PROTOCOLS
from schedules.collectives import NAMES, PLAN_ONLY, Collective
from weft.results import BenchResults, ResultsError, read_benches, read_frontier
from weft.units import format_bytes
from weftcore.jsonfile import write_text


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(out: str | Path) -> Path:
    """The output path, checked before anything is drawn: the plot is a PNG."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ResultsError(f"plot {out}: -o: must name a .png file")
    return out


def _save(fig, plt, out: Path) -> Path:
    """The figure as a PNG file, written whole or not at all (one line naming an unwritable path)."""
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_text(out, image.getvalue(), "plot", ResultsError)
    return out


def plot_frontier(path: str | Path, out: str | Path) -> Path:
    """Steps against rounds per chunk for each frontier point, with the LP bound as a line."""
    out = _png(out)
    frontier = read_frontier(path)
    xs = [p.rounds_per_chunk for p in frontier.points]
    ys = [p.steps for p in frontier.points]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(sorted(xs), [y for _, y in sorted(zip(xs, ys, strict=True))], where="post", color="tab:blue", alpha=0.4)
    ax.scatter(xs, ys, color="tab:blue", zorder=3, label="(steps, rounds, chunks) of each schedule")
    for p in frontier.points:
        ax.annotate(
            f"({p.steps},{p.rounds},{p.chunks})",
            (p.rounds_per_chunk, p.steps),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    if frontier.lp_bound is not None:
        ax.axvline(
            frontier.lp_bound,
            color="tab:red",
            linestyle="--",
            label=f"bandwidth bound {fraction(frontier.lp_bound)} rounds per chunk",
        )
    ax.legend(fontsize=8)
    ax.yaxis.set_major_locator(_integer_ticks())
    ax.set_xlabel("rounds per chunk (bandwidth cost)")
    ax.set_ylabel("steps (latency cost)")
    ax.set_title(f"{frontier.collective} on {frontier.topology}: Pareto frontier")
    fig.tight_layout()
    return _save(fig, plt, out)


def fraction(x: float) -> str:
    """A bound as the ratio it is: 1.1666666666666667 -> '7/6', 2.0 -> '2' (a float with no small ratio stays)."""
    f = Fraction(x).limit_denominator(1000)
    if abs(float(f) - x) > 1e-9 * max(1.0, abs(x)):
        return f"{x:g}"
    return str(f)


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def plot_bench(paths: str | Path | list, out: str | Path) -> Path:
    """busbw and latency against size for NCCL, symmetric memory, FlashInfer, the best peer of each size and weft
    (one benchmark: a file, or files of its sizes timed in separate jobs)."""
    out = _png(out)
    bench = _bench(paths)
    plt = _pyplot()
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = [int(r.size) for r in bench.rows]
    factor = _bus_factor(bench.collective, bench.nranks)
    for key, label, style in (
        ("nccl_us", "NCCL", "-"),
        ("symm_us", "torch symm-mem", "-"),
        ("flashinfer_us", "FlashInfer", "-"),
        ("best_peer_us", "best peer", "--"),
        ("weft_us", "weft", "-"),
    ):
        pts = [(r.size, getattr(r, key)) for r in bench.rows if getattr(r, key)]
        if not pts:
            continue
        xs, ts = zip(*pts, strict=True)
        lat.plot(xs, ts, style, marker="o", label=label)
        bw.plot(xs, [s / t / 1e3 * factor for s, t in pts], style, marker="o", label=label)
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ticks = size_ticks(sizes)
        ax.set_xticks(ticks, [format_bytes(s) for s in ticks], rotation=45, ha="right")
        ax.minorticks_off()
        ax.set_xlabel("message size")
        if ax.get_legend_handles_labels()[0]:  # a results file with no NCCL, symm-mem or weft times draws none
            ax.legend()
        ax.grid(alpha=0.3)
    lat.set_yscale("log")
    lat.set_ylabel("time (µs)")
    bw.set_ylabel("busbw (GB/s)")
    fig.suptitle(f"{bench.collective} {bench.dtype}, {bench.nranks} ranks, {bench.mode} ({bench.machine})")
    fig.tight_layout()
    return _save(fig, plt, out)


def size_ticks(sizes: list[int], most: int = 8) -> list[int]:
    """At most ``most`` of the sizes, evenly spaced and always ending with the largest, so labels never collide."""
    sizes = sorted(set(sizes))
    if len(sizes) <= most:
        return sizes
    step = -(-(len(sizes) - 1) // (most - 1))
    return sorted({*sizes[::-1][::step]})


def _cell(t: float | None, best: float | None) -> str:
    """One time in the table: 2 decimals below 100 µs, in bold where it is the row's best."""
    if not t:
        return "–"
    text = f"{t:.1f}" if t >= 100 else f"{t:.2f}"
    return f"**{text}**" if t == best else text


def _bench(paths: str | Path | list) -> BenchResults:
    """One benchmark file, or several of one benchmark merged (``weft.results.read_benches``)."""
    return read_benches(paths if isinstance(paths, list) else [paths])


def bench_table(paths: str | Path | list) -> str:
    """The README's performance table for one benchmark (markdown): every row, no number retyped by hand; several
    files of one benchmark (sizes timed in separate jobs) make one table."""
    bench = _bench(paths)
    factor = _bus_factor(bench.collective, bench.nranks)
    lines = [
        "| size | NCCL µs | symm-mem µs | FlashInfer µs | best peer µs | weft µs | weft / NCCL "
        "| weft / best peer | busbw GB/s (NCCL) | weft plan | #wrong weft / peers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bench.rows:
        nccl, symm, weft, fi = r.nccl_us, r.symm_us, r.weft_us, r.flashinfer_us
        peer, peer_us = best_peer(r)
        best = min((t for t in (nccl, symm, fi, peer_us, weft) if t), default=None)

        ratio = f"{weft / nccl:.2f}" if weft and nccl else "–"
        to_peer = f"{weft / peer_us:.2f}" if weft and peer_us else "–"
        busbw = f"{r.size / weft / 1e3 * factor:.0f} ({r.size / nccl / 1e3 * factor:.0f})" if weft and nccl else "–"
        peer_cell = f"{_cell(peer_us, best)} ({peer})" if peer_us else "–"
        wrong = f"{'–' if r.wrong is None else r.wrong} / {'–' if r.peers_wrong is None else r.peers_wrong}"
        lines.append(
            f"| {format_bytes(r.size)} | {_cell(nccl, best)} | {_cell(symm, best)} | {_cell(fi, best)} | {peer_cell} "
            f"| {_cell(weft, best)} | {ratio} | {to_peer} | {busbw} | {_short_plan(r.plan)} | {wrong} |"
        )
    return "\n".join(lines) + "\n"


PEER_LABELS = {"nccl": "NCCL", "symm": "symm-mem", "flashinfer": "FlashInfer", "vllm": "vLLM"}


def best_peer(row) -> tuple[str | None, float | None]:
    """The fastest implementation other than weft in a bench row, as ('FlashInfer oneshot', µs): the row's own
    ``best_peer`` where the job recorded one, else the faster of NCCL and symmetric memory."""
    if row.best_peer and row.best_peer_us:
        kind, _, variant = row.best_peer.partition(":")
        label = PEER_LABELS.get(kind, kind)
        return (f"{label} {variant.replace('_', '-')}" if variant and kind != "vllm" else label), row.best_peer_us
    timed = [(t, label) for t, label in ((row.nccl_us, "NCCL"), (row.symm_us, "symm-mem")) if t]
    return (min(timed)[1], min(timed)[0]) if timed else (None, None)


def _short_plan(name: str | None) -> str:
    """'direct-allreduce-hgx_h200:gpus=2-ll-x1-t256' -> 'direct ll-x1-t256' (Simple and Lamport plans alike)."""
    if not name:
        return "–"
    parts = name.split("-")
    protocol = next((i for i, p in enumerate(parts) if p in PROTOCOLS), None)
    return name if protocol is None else f"{parts[0]} {'-'.join(parts[protocol:])}"


def _bus_factor(collective: str, n: int) -> float:
    """nccl-tests' factor; a benchmark of several collectives (a kernel trace) counts as (n-1)/n."""
    return Collective(collective if collective in NAMES + PLAN_ONLY else "allgather", n).bus_factor
