"""`weft --help` everywhere shows each option's default, and `weft --version` names the version."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from weft.cli import build_parser, main
from weft.cli.version import version

ROOT = Path(__file__).resolve().parents[1]


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("weft",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def _options_with_defaults():
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            default = action.default
            if action.option_strings and default not in (None, argparse.SUPPRESS) and not isinstance(default, bool):
                yield " ".join(path), parser, action


def test_every_option_with_a_default_shows_it_in_help():
    seen = 0
    for command, parser, action in _options_with_defaults():
        text = " ".join(parser._get_formatter()._format_action(action).split())
        default = action.default
        shown = [str(d) for d in default] or ["none"] if isinstance(default, (list, tuple)) else [str(default)]
        assert "default" in text and all(s in text for s in shown), f"{command} {action.option_strings[0]}: {text!r}"
        seen += 1
    assert seen >= 25  # every command's numeric and string options, not a handful


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["synth", "--help"], "--time-limit TIME_LIMIT"),
        (["bench", "--help"], "(default: 30)"),  # --samples
        (["bench", "--help"], "(default: 20)"),  # --calls
        (["bench", "--help"], "(default: 30.0)"),  # --timeout
        (["bench", "--help"], "--eager eager launches (default: --graph)"),
    ],
)
def test_the_options_a_user_asked_about_show_their_defaults(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert expected in " ".join(capsys.readouterr().out.split())


def test_the_time_limit_default_is_shown(capsys):
    # the default depends on the method (a whole SMT frontier gets longer), so the help says both
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    assert "(default 60; smt --pareto: 300, the whole frontier's)" in " ".join(capsys.readouterr().out.split())


def test_weft_version_prints_the_projects_version(capsys):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"weft {project['version']}") and out.count("\n") == 1
    assert version().startswith(f"weft {project['version']}")
