"""Issue 34: no stage branches on a collective's name; it asks the Collective's facts.

An AST walk over every .py file of the project (tests excepted) finds each comparison (==, !=, in, not in, match
case) of something with a collective-name literal, and each table keyed by collective names that is looked up with
a name that is not itself a literal. ``schedules/collectives.py`` alone may do so: it is where the facts are
written. Strings that are not compared (CLI choices, JSON keys, file names) do not count, nor is ``"x" in doc``
(a key of a document), nor a table of measured numbers keyed by collective.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import schedules.collectives as collectives

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("synth", "topologies", "schedules", "codegen", "executor", "weft", "bench", "examples")  # at least
ALLOWED = "schedules/collectives.py"
NAMES = frozenset(collectives.NAMES + collectives.PLAN_ONLY)
# the whole list of collectives (a validity check, not a branch on one of them)
EVERY = {"NAMES", "PLAN_ONLY"}


def _names_in(node: ast.AST | None) -> set[str]:
    """The collective names a literal (a string, or a tuple, list, set or frozenset of them) holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        # every element a collective name: ("copy", "reduce") lists a send's ops
        each = [_names_in(e) for e in node.elts]
        return set().union(*each) if each and all(each) else set()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return _names_in(node.args[0]) if node.args else set()
    return set()


def _measured(node: ast.expr | None) -> bool:
    """Whether a table value is measured data (numbers, or tables of numbers), not code to dispatch to."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float))
    if isinstance(node, ast.Dict):
        return all(_measured(v) for v in node.values)
    return False


def _name_table(node: ast.AST | None) -> bool:
    """A dict literal keyed by collective names whose values are code or names (a dispatch table)."""
    return (
        isinstance(node, ast.Dict)
        and any(_names_in(k) for k in node.keys)
        and not all(_measured(v) for v in node.values)
    )


def _constants(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Module-level names bound to collective-name literals, and to dispatch tables keyed by them (imports of
    such constants from schedules.collectives included)."""
    literals, tables = set(), set()
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.ImportFrom) and node.module == "schedules.collectives":
            for alias in node.names:
                bound = getattr(collectives, alias.name, None)
                if alias.name in EVERY:
                    continue
                one = isinstance(bound, str) and bound in NAMES
                some = isinstance(bound, (tuple, frozenset, set)) and bool(bound) and set(bound) <= NAMES
                if one or some:
                    literals.add(alias.asname or alias.name)
                elif isinstance(bound, dict) and bound and set(bound) <= NAMES:
                    tables.add(alias.asname or alias.name)
        for target in targets:
            if isinstance(target, ast.Name) and _names_in(value):
                literals.add(target.id)
            elif isinstance(target, ast.Name) and _name_table(value):
                tables.add(target.id)
    return literals, tables


def _offences(tree: ast.Module, elsewhere: tuple[set[str], set[str]] = (set(), set())) -> Iterator[tuple[int, str]]:
    """Each comparison with a collective name, and each look-up in a table keyed by them, as (line, code);
    ``elsewhere``: other modules' such constants, met as ``module.NAME``."""
    literals, tables = _constants(tree)

    def bound(node: ast.expr, here: set[str], there: set[str]) -> bool:
        return (isinstance(node, ast.Name) and node.id in here) or (
            isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in there
        )

    def named(node: ast.expr) -> bool:
        return bool(_names_in(node)) or bound(node, literals, elsewhere[0])

    def send_op(node: ast.expr) -> bool:  # a send's op is copy or "reduce", which is no collective
        return (isinstance(node, ast.Attribute) and node.attr == "op") or (
            isinstance(node, ast.Name) and node.id == "op"
        )

    def table(node: ast.expr) -> bool:
        return _name_table(node) or bound(node, tables, elsewhere[1])

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
                if isinstance(op, (ast.In, ast.NotIn)):
                    # "allreduce" in doc asks for a key; x in ("allreduce", ...) or x in TABLE compares names
                    hit = named(right) or table(right)
                else:
                    hit = (named(left) or named(right)) and not (send_op(left) or send_op(right))
                if hit:
                    yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.match_case):
            if any(isinstance(p, ast.MatchValue) and named(p.value) for p in ast.walk(node.pattern)):
                yield node.pattern.lineno, f"case {ast.unparse(node.pattern)}"
        elif isinstance(node, (ast.Subscript, ast.Call)) and _looked_up(node, table):
            yield node.lineno, ast.unparse(node)


def _looked_up(node: ast.Subscript | ast.Call, table: Callable[[ast.expr], bool]) -> bool:
    """``TABLE[name]`` or ``TABLE.get(name)``: a look-up of a name that is not a literal."""
    if isinstance(node, ast.Subscript):
        return table(node.value) and not isinstance(node.slice, ast.Constant)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and table(node.func.value)
    )


def project_files(root: Path) -> list[str]:
    """Every .py file of the project (any package, so new ones count too), tests and hidden folders left out."""
    return sorted(
        rel
        for path in root.rglob("*.py")
        for rel in [path.relative_to(root).as_posix()]
        if not rel.startswith("tests/") and not any(part.startswith((".", "build", "dist")) for part in rel.split("/"))
    )


def scan(root: Path) -> list[str]:
    """Every offence under root's packages, as 'file:line: code'."""
    trees = {rel: ast.parse((root / rel).read_text(), rel) for rel in project_files(root)}
    elsewhere: tuple[set[str], set[str]] = (set(), set())
    for tree in trees.values():
        literals, tables = _constants(tree)
        elsewhere[0].update(literals)
        elsewhere[1].update(tables)
    found = [
        f"{rel}:{line}: {code[:120]}"
        for rel, tree in trees.items()
        if rel != ALLOWED
        for line, code in _offences(tree, elsewhere)
    ]
    return sorted(set(found))


def test_no_stage_compares_a_collective_name() -> None:
    scanned = {rel.split("/")[0] for rel in project_files(ROOT)}
    assert scanned >= set(PACKAGES), scanned
    found = scan(ROOT)
    assert not found, f"{len(found)} comparisons with a collective name outside {ALLOWED}:\n" + "\n".join(found)


def _offences_of(source: str, elsewhere: tuple[set[str], set[str]] = (set(), set())) -> list[str]:
    return [code for _, code in _offences(ast.parse(source), elsewhere)]


def test_the_scan_finds_each_form() -> None:
    source = """
from schedules.collectives import SHIFT
ROTATING = ("allgather", "reducescatter")
ALGORITHMS = {"allgather": f, "reduce": g}
if c.name == "allreduce": pass
if c.name not in ("broadcast", "scatter"): pass
if name in ROTATING: pass
if plan.collective == SHIFT: pass
ALGORITHMS[c.name](c)
{"alltoall": h}.get(c.name)
match c.name:
    case "gather": pass
"""
    assert len(_offences_of(source)) == 7
    elsewhere = ({"ROOTED_ONES"}, {"DUAL"})  # constants of other modules
    assert len(_offences_of("if c.name in dual.DUAL: pass\nif c.name in other.ROOTED_ONES: pass", elsewhere)) == 2


def test_the_scan_passes_keys_choices_and_measurements() -> None:
    source = """
from schedules.collectives import NAMES
NCCL_US = {"allreduce": {16: 105.1}, "allgather": {16: 69.4}}
us = NCCL_US[collective][16]
report = {"allreduce": {"doc": 1}}
if "allreduce" in report: pass
if name not in NAMES: pass
parser.add_argument("collective", choices=("allreduce", "allgather"))
path = "allreduce.json"
if send.op == "reduce": pass
OPS = ("copy", "reduce")
if s[3] not in OPS: pass
reductions = [x for op, x in group if op == "reduce"]
"""
    assert _offences_of(source) == []
