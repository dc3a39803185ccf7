"""Commit row-owning all-reduce plans (``codegen.rows.own_rows``) to a registry, for the fused RMSNorm.

Each is a registry plan with its final reductions regrouped into G thread blocks (G = 1, 2, 4, ... 16), so that
a decode batch of B rows has a plan whose blocks each own B / G whole rows. Every plan is proven on the
reference executor before it is written (``weft.publish.commit``).

    PYTHONPATH=. python bench/row_plans.py bench/registry_h200x2 direct-allreduce-hgx_h200:gpus=2-ll-x32-t512-max8MB
"""

from __future__ import annotations

import argparse

from codegen.rows import own_rows
from executor.reference.norm import fused_refusal
from registry.store import Registry
from weft import publish


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("registry")
    p.add_argument("base", help="the name of the registry plan to regroup")
    p.add_argument("--groups", default="1,2,4,8,16")
    args = p.parse_args()
    base = [e for e in Registry(args.registry).entries() if e.plan.name == args.base]
    if len(base) != 1:
        raise SystemExit(f"{args.registry}: {len(base)} plans named {args.base!r}, expected 1")
    for groups in (int(g) for g in args.groups.split(",")):
        plan = own_rows(base[0].plan, groups)
        why = fused_refusal(plan)
        if why:
            raise SystemExit(why)
        entry = publish.commit(plan, base[0].key.topology, args.registry)
        print(f"{entry.id}: {plan.name} ({plan.content_hash})")


if __name__ == "__main__":
    main()
