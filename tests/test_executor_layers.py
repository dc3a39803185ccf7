"""executor/ is one subpackage per runtime, layered: reference < gpu < port < inference, with no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

EXECUTOR = Path(__file__).resolve().parents[1] / "executor"
# the base modules every runtime may use, then the runtimes from the bottom up; a module imports its own layer or
# the layers below it (executor/__init__.py, the lazy facade, is left out: it names every layer's exports)
LAYERS = ("base", "reference", "gpu", "port", "inference")
BASE = {"executor.errors", "executor.hosts"}


def _module(path: Path) -> str:
    parts = path.relative_to(EXECUTOR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    return "base" if module in BASE else module.split(".")[1]


def _import_graph() -> nx.DiGraph:
    """module -> the executor modules it imports, at module level or inside a function alike."""
    modules = {_module(p): p for p in EXECUTOR.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target.startswith("executor.") and target != name and target not in _packages_of(name):
                    graph.add_edge(name, target)
    return graph


def _packages_of(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts))}


def test_every_executor_module_sits_in_a_runtime_subpackage_or_the_base():
    loose = sorted(m for m in _import_graph() if m.count(".") == 1 and m not in BASE and _layer(m) not in LAYERS)
    assert loose == []
    assert {p.name for p in EXECUTOR.iterdir() if (p / "__init__.py").exists()} == set(LAYERS) - {"base"}


def test_executor_modules_import_no_cycle():
    assert list(nx.simple_cycles(_import_graph())) == []


def test_no_runtime_imports_a_layer_above_it():
    graph = _import_graph()
    upward = [
        (a, b) for a, b in graph.edges if "executor" not in (a, b) and LAYERS.index(_layer(b)) > LAYERS.index(_layer(a))
    ]
    assert upward == []


def test_the_norm_tables_cycle_is_gone_without_a_lazy_import():
    graph = _import_graph()
    assert graph.has_edge("executor.gpu.tables", "executor.reference.norm")
    assert not nx.has_path(graph, "executor.reference.norm", "executor.gpu.tables")


def test_executor_has_one_communicator_class_and_its_engines_are_engines():
    import executor

    classes = {
        node.name: path.relative_to(EXECUTOR.parent).as_posix()
        for path in EXECUTOR.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and "Communicator" in node.name
    }
    assert classes == {"Communicator": "executor/inference/communicator.py"}
    assert [name for name in executor.__all__ if "Communicator" in name] == ["Communicator"]
    assert {"InterpreterEngine", "PortEngine"} <= set(executor.__all__)
