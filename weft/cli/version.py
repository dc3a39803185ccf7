"""``weft --version``: the installed distribution's version, or the source tree's when weft runs uninstalled."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path


def version() -> str:
    """``weft X.Y.Z``, from the package metadata; a source checkout run without installing reads pyproject.toml."""
    try:
        dist = importlib.metadata.distribution("weft")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    # another project could own the name "weft" on PyPI: trust the metadata only if it installs our console script
    if dist is not None and any(ep.value == "weft.cli:run" for ep in dist.entry_points):
        return f"weft {dist.version}"
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    if project.get("name") == "weft" and isinstance(project.get("version"), str):
        return f"weft {project['version']} (not installed: {pyproject})"
    return "weft (version unknown: not installed, and no pyproject.toml beside the source)"
