"""Whether two trees compile the interpreter's kernels to the same PTX: every kernel entry of the base tree, compared
instruction by instruction with the same entry of this tree, after renaming what compilation numbers or mangles
(local depots, basic-block labels, call-sequence comments, the mangled names of shared variables).

    python bench/ptx_ab.py BASE_TREE [--json OUT.json]

BASE_TREE is an unpacked snapshot (git archive) of the base commit. Each tree's interpreter.cu is compiled with
nvcc -ptx for sm_90 and the build's flags. Identical PTX for an entry means its graph-replay time cannot differ
between the trees beyond run-to-run noise; entries only this tree has (new kernels) are listed apart.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import tempfile
from pathlib import Path

from executor.gpu import build

ENTRY = re.compile(r"\.visible \.entry (\w+)\(.*?\n\}\n", re.S)
RENAMES = (
    (re.compile(r"_ZZN4weft9interpretI\w+?EEvRKNS_7ContextEE"), "SHARED_"),  # template arguments in the names
    (re.compile(r"__local_depot\d+"), "DEPOT"),
    (re.compile(r"\$L__BB\d+_"), "$L__BB_"),
    (re.compile(r"callseq \d+"), "callseq"),
)


def interpreter_source(tree: Path) -> Path:
    """The interpreter's kernel source in ``tree``, where either layout keeps it."""
    for candidate in ("executor/gpu/cuda/interpreter.cu", "executor/cuda/interpreter.cu"):
        if (tree / candidate).is_file():
            return tree / candidate
    raise SystemExit(f"{tree}: no interpreter.cu under executor/gpu/cuda/ or executor/cuda/")


def renamed_entries(ptx: str) -> dict[str, str]:
    """Each kernel entry of ``ptx``, with what compilation numbers or mangles renamed."""
    found = {}
    for match in ENTRY.finditer(ptx):
        body = match.group(0)
        for pattern, name in RENAMES:
            body = pattern.sub(name, body)
        found[match.group(1)] = body
    return found


def entries(source: Path, arch: str = "sm_90") -> dict[str, str]:
    """Each kernel entry's PTX of ``source``, renamed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.ptx"
        subprocess.run(["nvcc", "-ptx", f"-arch={arch}", *build.FLAGS, "-o", str(out), str(source)], check=True)
        return renamed_entries(out.read_text())


def compare(base: dict[str, str], new: dict[str, str]) -> dict:
    rows = []
    for name, body in base.items():
        other = new.get(name)
        changed = (
            None
            if other is None
            else sum(
                1
                for line in difflib.unified_diff(body.splitlines(), other.splitlines(), lineterm="", n=0)
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            )
        )
        rows.append({"entry": name, "lines": len(body.splitlines()), "changed_lines": changed})
    return {
        "entries": rows,
        "identical": sum(1 for r in rows if r["changed_lines"] == 0),
        "new_only": sorted(set(new) - set(base)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    here = Path(__file__).resolve().parents[1]
    result = compare(entries(interpreter_source(args.base)), entries(interpreter_source(here)))
    for r in result["entries"]:
        print(f"{r['entry']:<36} {r['lines']:>6} lines  {r['changed_lines']} changed")
    print(f"{result['identical']} of {len(result['entries'])} entries identical; new here: {len(result['new_only'])}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
