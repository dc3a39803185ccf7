"""The folders are the layers: no import runs up the layer order, and no package or module imports itself round.

The graph is every import statement of the tree's Python files, read with ``ast``: at module level and inside
functions alike (a lazy import that breaks a cycle at run time is still a cycle), except those under
``if TYPE_CHECKING:``, which never run (annotations only). ``from pkg import mod`` is an import of ``pkg.mod``;
``from pkg import name`` one of ``pkg/__init__.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The layer order, bottom first. A package may import the packages of lower layers and its own, nothing else:
# not one above it, and not another package of its own layer (synth/ and codegen/ know nothing of each other).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("weftcore",),  # the base: WeftError and the JSON file helpers
    ("topologies",),  # the fabric model
    ("schedules",),  # the formats that cross stages (Collective, Schedule, Plan), their checks and costs
    ("synth", "codegen"),  # Schedule makers and Schedule -> Plan
    ("registry",),  # verified plans by topology, collective and size
    ("executor",),  # the CPU reference and the GPU runtimes
    ("weft",),  # the front door: the facade, the orchestration across stages, the CLI
    ("bench", "examples"),  # programs that use weft
)
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}

# Cycles another change removes; each entry must still be a cycle while its modules exist (delete it when not).
KNOWN_CYCLES: tuple[tuple[str, ...], ...] = ()


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the layer packages (``pkg.__init__`` for a package's own file)."""
    found = {}
    for package in RANK:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            if "results" in rel.parts or any(part.startswith(("registry_", ".")) for part in rel.parts[1:]):
                continue  # bench/results and bench/registry_*: recorded output, not code
            found[".".join(rel.parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import statements under ``if TYPE_CHECKING:`` (they never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``module`` imports anywhere in its file."""

    def node(name: str) -> str | None:
        return name if name in modules else (f"{name}.__init__" if f"{name}.__init__" in modules else None)

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    package = module.split(".")[:-1]
    out = set()
    for n in ast.walk(tree):
        if id(n) in skipped:
            continue
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = package[: len(package) - n.level + 1] if n.level else []
            parent = ".".join(base + ([n.module] if n.module else []))
            subs = [f"{parent}.{a.name}" for a in n.names if node(f"{parent}.{a.name}")]
            names = subs + ([parent] if len(subs) < len(n.names) else [])
        else:
            continue
        out |= {target for name in names if (target := node(name)) and target != module}
    return out


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    modules = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for module, path in modules.items():
        g.add_edges_from((module, target) for target in _imports(module, path, modules))
    return g


def _cycles(g: nx.DiGraph) -> list[list[str]]:
    """Every strongly connected part of more than one node, as its sorted members (one per part, not every cycle)."""
    return sorted(sorted(part) for part in nx.strongly_connected_components(g) if len(part) > 1)


def _siblings(g: nx.DiGraph, depth: int) -> nx.DiGraph:
    """The graph among siblings at ``depth``: an import from a.b.x to a.c.y is an edge a.b -> a.c at depth 2."""
    s = nx.DiGraph()
    for a, b in g.edges:
        pa, pb = a.split("."), b.split(".")
        if (
            len(pa) >= depth
            and len(pb) >= depth
            and pa[: depth - 1] == pb[: depth - 1]
            and pa[depth - 1] != pb[depth - 1]
        ):
            s.add_edge(".".join(pa[:depth]), ".".join(pb[:depth]))
    return s


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} | {"bench", "examples"}
    assert packages - {"tests"} == set(RANK), "a new top-level package needs its place in LAYERS"


def test_no_import_runs_up_the_layers(graph):
    upward = sorted(
        f"{a} imports {b}"
        for a, b in graph.edges
        if (pa := a.split(".")[0]) != (pb := b.split(".")[0]) and RANK[pb] >= RANK[pa]
    )
    assert upward == [], upward


def test_no_package_imports_itself_round(graph):
    """Packages at every depth: the layers, then the subpackages and modules side by side inside one package. A
    part made of modules alone is a module cycle (the next test's)."""
    packages = {".".join(m.split(".")[:d]) for m in graph for d in range(1, len(m.split(".")))}
    depth = max(len(m.split(".")) for m in graph)
    found = [part for d in range(1, depth + 1) for part in _cycles(_siblings(graph, d)) if packages & set(part)]
    assert found == [], found


def _known(graph: nx.DiGraph) -> set[str]:
    """The modules of the known cycles that still exist, and whose cycle still does (else: delete the entry)."""
    kept = set()
    for members in KNOWN_CYCLES:
        if not set(members) <= set(graph):
            continue  # moved or gone: the entry no longer applies
        assert any(set(members) <= set(part) for part in _cycles(graph)), f"{members} is no longer a cycle: delete it"
        kept |= set(members)
    return kept


def test_no_module_imports_itself_round(graph):
    known = _known(graph)
    assert [part for part in _cycles(graph) if not set(part) <= known] == []


def _folder_block() -> list[str]:
    """The layer list of the README (or of docs/, where its text moved): the code block that starts with weftcore/."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if not doc.is_file():
            continue
        for block in re.findall(r"^```\n(weftcore/.*?)^```$", doc.read_text(encoding="utf-8"), re.S | re.M):
            return block.splitlines()
    return []


def test_the_readme_lists_the_layers_as_they_are():
    """Each line of the README's folder list names one layer's folders, bottom first, as LAYERS does."""
    listed = [tuple(re.findall(r"(\w+)/", re.match(r"(?:\w+/\s+)*", line)[0])) for line in _folder_block()]
    assert listed == list(LAYERS)
