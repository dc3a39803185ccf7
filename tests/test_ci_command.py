"""CI runs the README's test command word for word (the brief: a claim is a test)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    after = (ROOT / "README.md").read_text(encoding="utf-8").split("**The tests**", 1)[1]
    return after.split("```sh\n", 1)[1].split("\n```", 1)[0].strip()


def test_ci_runs_the_readmes_test_command():
    command = _readme_test_command()
    assert "python -m pytest" in command
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_test_command_runs_the_static_checks_before_the_tests():
    command = _readme_test_command()
    checks = ["ruff check .", "ruff format --check .", "mypy", "clang-format"]
    assert all(c in command for c in checks)
    assert max(command.index(c) for c in checks) < command.index("python -m pytest")
