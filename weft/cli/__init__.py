"""The ``weft`` console script: the only place in weft that prints, prompts or exits.

Each sub-command lives in its own module here with ``register(subparsers)``; a handler takes the parsed
arguments and returns an exit code (0 ok, 1 a check failed, 2 bad input). Library errors (WeftError) become
one line on stderr with the error's exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from topologies.errors import WeftError
from topologies.jsonfile import one_line

COMMANDS = ("topo", "synth", "compile", "tune", "verify", "registry", "gpu", "plot")


class ArgumentError(WeftError):
    """A bad command line."""


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The file where one of ``path``'s folders should be, else None. Asked before long work, so that a bad
    output path fails at once, not after the proofs."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


def progress(line: str) -> None:
    """A progress line of a long wait, on stderr (the library's ``progress`` callbacks end here)."""
    print(line, file=sys.stderr, flush=True)


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already names it or there is none to name."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or default is None or default is argparse.SUPPRESS or isinstance(default, bool):
            return text  # a flag's off state, or an option whose absence the help already explains
        if default in ("", [], ()) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class VersionAction(argparse.Action):
    """``--version``, looked up only when asked for (package metadata is a scan of sys.path)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        from weft.cli.version import version

        print(version())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2, like every other bad input, and help shows
    defaults."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ArgumentError(f"{self.prog}: {message}")


def build_parser() -> Parser:
    parser = Parser(prog="weft", description="Synthesize, verify, compile and run GPU collectives.")
    parser.add_argument("--version", action=VersionAction, help="print weft's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"weft.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"weft.cli.{name}":
                raise
            continue  # a command whose module is not part of this build
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except WeftError as e:
        print(f"weft: error: {one_line(str(e))}", file=sys.stderr)  # names read from a file cannot split it
        return e.exit_code
    except KeyboardInterrupt as e:
        print(f"weft: interrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    sys.exit(main())
