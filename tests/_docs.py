"""The project's documentation: README.md and the guide under docs/, which tests hold to the code and results.

Claims and generated tables moved from the README into docs/*.md; a test that checks what the documentation says
reads all of it, so a paragraph can move between pages without its check being lost.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def docs_text() -> str:
    """Every page, README first, joined by blank lines."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in DOCS)
