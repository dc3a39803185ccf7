"""The README stays short (install, the two commands, the CLI tour, the API, the formats in brief, performance) and
points into docs/, where the guide lives; every link of either resolves, down to the heading it names."""

from __future__ import annotations

import re
from pathlib import Path

from _docs import DOCS, ROOT

README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)  # no code-block "#"
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def local_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_under_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300


def test_the_readme_links_every_page_of_docs():
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 5
    linked = {t.split("#", 1)[0] for t in local_links(README)}
    assert [p for p in pages if p not in linked] == []


def test_every_local_link_resolves_to_a_file_and_heading():
    broken = []
    for page in DOCS:
        for target in local_links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or ROOT not in (file, *file.parents):
                broken.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_keeps_the_sections_the_brief_asks_for():
    headings = re.findall(r"^## (.+)$", README.read_text(encoding="utf-8"), re.M)
    for wanted in ("Install and the two commands", "CLI tour", "File formats", "Performance"):
        assert wanted in headings, wanted
