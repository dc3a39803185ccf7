"""``weft plot frontier FILE -o PNG`` and ``weft plot bench FILE -o PNG``."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw results as PNG")
    ps = p.add_subparsers(dest="plot_command", required=True, parser_class=type(p))
    q = ps.add_parser("frontier", help="an SMT Pareto frontier (frontier.json from `weft synth --method smt --pareto`)")
    q.add_argument("file")
    q.add_argument("-o", "--output", help="PNG file (default: beside the input)")
    q.set_defaults(func=_run, kind="frontier")
    q = ps.add_parser("bench", help="a GPU benchmark (bench/results/*.json from `weft bench`)")
    q.add_argument("file")
    q.add_argument("-o", "--output", help="PNG file (default: beside the input)")
    q.add_argument("--markdown", action="store_true", help="print the README's markdown table instead of a PNG")
    q.set_defaults(func=_run, kind="bench")


def _run(args: argparse.Namespace) -> int:
    from weft import plots

    if getattr(args, "markdown", False):
        print(plots.bench_table(args.file), end="")
        return 0
    out = args.output or str(Path(args.file).with_suffix(".png"))
    draw = plots.plot_frontier if args.kind == "frontier" else plots.plot_bench
    print(f"wrote {draw(args.file, out)}")
    return 0
