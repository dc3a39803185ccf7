"""The ``weft`` console script: the only place in weft that prints, prompts or exits.

Each sub-command lives in its own module here with ``register(subparsers)``; a handler takes the parsed
arguments and returns an exit code (0 ok, 1 a check failed, 2 bad input). Library errors (WeftError) become
one line on stderr with the error's exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from weftcore.errors import WeftError
from weftcore.jsonfile import one_line

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


PROGRESS_AFTER_S = 2.0  # a command that ends sooner says nothing of its progress


def progress_after(seconds: float | None = None) -> Callable[[str], None]:
    """A progress callback for one command that prints its lines (on stderr) once the command has run
    ``seconds`` (default ``PROGRESS_AFTER_S``): short commands stay quiet, long ones say what they are doing."""
    import time

    start, wait = time.monotonic(), PROGRESS_AFTER_S if seconds is None else seconds

    def say(line: str) -> None:
        if time.monotonic() - start >= wait:
            print(f"weft: {line}", file=sys.stderr, flush=True)

    return say


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

    def __call__(self, parser, namespace, values, option_string=None) -> None:
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
    from weft.units import SIZE_HELP

    parser = Parser(
        prog="weft",
        description="Synthesize, verify, compile and run GPU collectives.",
        epilog=SIZE_HELP[0].upper() + SIZE_HELP[1:] + ".",
    )
    parser.add_argument("--version", action=VersionAction, help="print weft's version and exit")
    parser.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="memory budget for work that grows with its input (proofs, verification, baselines): "
        "work estimated past it is refused before it allocates (default: $WEFT_MEMORY_LIMIT, "
        "else half of this machine's memory, within ulimit -v), e.g. --memory-limit 64GB",
    )
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
    from weft.cli.stop import Stop

    stop = Stop()
    try:
        with stop:
            return _command(argv)
    except KeyboardInterrupt as e:
        stop.close()  # acted on: no more deliveries (a stop raised inside the context's own exit lands here)
        word = "terminated" if stop.received[:1] == [signal.SIGTERM] else "interrupted"
        print(f"weft: {word}{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        return 128 + stop.received[0] if stop.received else 130


def _command(argv: list[str] | None) -> int:
    """The command's exit code; a library error is one line on stderr. SIGTERM takes Ctrl-C's path (every solver
    stops, pools are terminated, nothing is written: ``main``) with the exit code 143."""
    try:
        args = build_parser().parse_args(argv)
        with _memory_limit(args.memory_limit):
            return int(args.func(args) or 0)
    except WeftError as e:
        text = one_line(str(e))  # names read from a file cannot split it
        print(f"weft: error: {text.removeprefix('weft: ')}", file=sys.stderr)  # never "weft: error: weft: ..."
        return e.exit_code
    except BrokenPipeError:
        return 0


@contextlib.contextmanager
def _memory_limit(text: str | None):
    """``--memory-limit`` for one command: ``$WEFT_MEMORY_LIMIT`` (what ``schedules.budget`` reads, and what
    worker processes inherit) while it runs."""
    if text is None:
        yield
        return
    from schedules.budget import ENV
    from weft.units import parse_bytes

    previous = os.environ.get(ENV)
    os.environ[ENV] = str(parse_bytes(text, "--memory-limit"))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous


def run() -> None:
    code = main()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        # Stopped: every pool is terminated and every file closed or removed already. Leave without the
        # interpreter's teardown, which takes seconds once OR-Tools or z3 is loaded (3 s measured on a busy
        # 2-core machine), so that the process is gone as soon as it has said why.
        if "multiprocessing" in sys.modules:  # a pool caught mid-start by the signal: its workers go too
            for child in sys.modules["multiprocessing"].active_children():
                child.kill()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
