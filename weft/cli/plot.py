"""``weft plot frontier FILE -o PNG`` and ``weft plot bench FILE -o PNG``."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw results as PNG")
    ps = p.add_subparsers(dest="plot_command", required=True, parser_class=type(p))
    q = ps.add_parser("frontier", help="an SMT Pareto frontier (frontier.json from `weft synth --method smt --pareto`)")
    q.add_argument("file")
    q.add_argument(
        "-o", "--output", help="PNG file (default: NAME.png in the current directory, never replacing a file there)"
    )
    q.set_defaults(func=_run, kind="frontier")
    q = ps.add_parser(
        "bench",
        help="a GPU benchmark (bench/results/*.json from `weft bench`; several files of one benchmark, its sizes "
        "timed in separate jobs, make one plot or table)",
    )
    q.add_argument("file", nargs="+")
    q.add_argument(
        "-o", "--output", help="PNG file (default: NAME.png in the current directory, never replacing a file there)"
    )
    q.add_argument("--markdown", action="store_true", help="print the README's markdown table instead of a PNG")
    q.set_defaults(func=_run, kind="bench")


def _run(args: argparse.Namespace) -> int:
    from weft import plots

    if getattr(args, "markdown", False):
        print(plots.bench_table(args.file), end="")
        return 0
    from weft.results import ResultsError
    from weftcore.jsonfile import check_output

    out = args.output or default_output(args.file[0] if args.kind == "bench" else args.file)
    check_output(out, "plot", ResultsError)
    draw = plots.plot_frontier if args.kind == "frontier" else plots.plot_bench
    print(f"wrote {draw(args.file, out)}")
    return 0


def default_output(file: str) -> str:
    """The input's name as a PNG in the current directory. Only ``-o`` replaces a file: by default a plot never
    overwrites one (a committed result's PNG beside its JSON stays as it was committed)."""
    from weft.results import ResultsError

    out = Path(Path(file).stem + ".png")
    if out.exists():
        raise ResultsError(f"plot {file}: {out} exists; name the PNG with -o to replace it")
    return str(out)
