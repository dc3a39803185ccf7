"""A small registry of some of another's entries, for a device job that times only those plans.

    PYTHONPATH=. python bench/sub_registry.py bench/registry_h200x4 bench/exp_oneshots \
        direct-allreduce-hgx_h200:gpus=4-lamport-x64-t256-mp direct-allreduce-hgx_h200:gpus=4-ll-x64-t512-max8MB

Each NAME is a plan name of SOURCE (exactly one entry each); their entry files are copied as they are (already
proven where they were committed, their measured times kept), with SOURCE's NCCL times (baselines.json), and the
index is built afresh. `weft bench allreduce --plans registry --registry DEST --record` then times those plans
alone, and `weft registry record --registry SOURCE FILE` stores the times back. DEST must not exist yet. A bad name
or an existing DEST ends it in one line, exit 2, with nothing written.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry.store import Registry  # noqa: E402


def copy_entries(source: Path, dest: Path, names: list[str]) -> list[str]:
    """Copy the entries of ``source`` whose plans are ``names`` into a new registry at ``dest``; their ids.
    ValueError (one line) where a name matches no entry or several, or ``dest`` exists."""
    if dest.exists():
        raise ValueError(f"{dest}: already exists; the sub-registry is made in a new folder")
    by_name: dict[str, list[str]] = {}
    for entry in Registry(str(source)).entries():
        by_name.setdefault(entry.plan.name, []).append(entry.id)
    ids = []
    for name in names:
        found = by_name.get(name, [])
        if len(found) != 1:
            raise ValueError(f"{source}: {len(found)} entries hold plan {name!r}, expected 1")
        ids.append(found[0])
    (dest / "entries").mkdir(parents=True)
    for id in ids:
        shutil.copy(source / "entries" / f"{id}.json", dest / "entries" / f"{id}.json")
    if (source / "baselines.json").exists():
        shutil.copy(source / "baselines.json", dest / "baselines.json")
    Registry(str(dest)).rebuild_index()
    return ids


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("names", nargs="+", help="plan names of SOURCE's entries")
    args = p.parse_args()
    try:
        ids = copy_entries(args.source, args.dest, args.names)
    except ValueError as e:
        print(f"sub_registry: {e}", file=sys.stderr)
        return 2
    print(f"{args.dest}: {len(ids)} entries of {args.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
