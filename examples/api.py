"""weft from Python: synthesize, prove, compile, commit and select, with the CLI's sizes and defaults.

    python examples/api.py [REGISTRY]      # default: a fresh temporary folder

Each call matches a CLI line (tests/test_api_example.py runs this file and checks that it does).
"""

from __future__ import annotations

import sys
import tempfile

import weft


def main(registry: str) -> None:
    # weft synth allgather -t hgx_h100:nodes=2 --method trees --size 1GB
    h100 = weft.catalog("hgx_h100:nodes=2")
    trees = weft.synthesize(h100, "allgather", "trees", size="1GB")
    print(trees)
    print(
        f"  {weft.predict_us(trees, h100, weft.parse_bytes('1GB')):.1f} µs at 1GB, "
        f"bound {weft.lower_bound_us(h100, trees.collective, weft.parse_bytes('1GB')):.1f} µs"
    )

    # weft synth allreduce -t dgx1 --method ring -o ring.json; weft verify ring.json -t dgx1
    dgx1 = weft.catalog("dgx1")
    ring = weft.synthesize(dgx1, "allreduce", "ring")
    assert weft.verify(ring, dgx1).ok

    # weft compile ring.json -t dgx1 -o ring.plan.json --instances 4; weft registry commit ring.plan.json
    plan = weft.compile(ring, dgx1, instances=4)
    print(plan)
    print(weft.commit(plan, dgx1, registry))  # proves the plan on the reference executor again, then commits it

    # weft registry select -t dgx1 allreduce --size 4MB
    print(weft.select("dgx1", "allreduce", "4MB", registry))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="weft-registry-"))
