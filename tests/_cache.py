"""One reference-executor proof per plan per test run.

Committing, importing and ``registry verify`` prove every plan again on the CPU reference executor
(``weft.publish.verify``), and several test modules do that to the same committed plans (bench/registry_h200x*):
the same proof, seconds each, many times over. ``prove_once`` keeps each proof for the rest of the run, keyed by
what the proof reads: the plan's content hash and the dtypes it is checked in. A plan whose proof fails is never
kept, so it fails again wherever it is proven; a changed plan has another hash, so it is proven afresh.

Use it by naming the fixture (``@pytest.mark.usefixtures("prove_once")``, or as an argument of a module-scoped
fixture); tests/conftest.py makes it visible in every test module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

Proofs = dict[tuple[str, tuple[str, ...]], dict[str, Any]]


def proven_once(prove: Callable[..., dict[str, Any]], proofs: Proofs) -> Callable[..., dict[str, Any]]:
    """``prove`` with its successful results kept in ``proofs``; each caller gets its own copy of the record.

    Other arguments (publish.verify's ``progress``) go to ``prove`` where it runs; they do not change the proof."""

    def verify(plan: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        key = (plan.content_hash, tuple(plan.weft.dtypes or ()))
        if key not in proofs:
            proofs[key] = prove(plan, *args, **kwargs)  # raises for a plan that fails: nothing kept
        return copy.deepcopy(proofs[key])

    verify.__wrapped__ = prove  # type: ignore[attr-defined]  # the proof itself, for tests that count proofs
    return verify


@pytest.fixture(scope="session")
def prove_once() -> Iterator[Proofs]:
    """weft.publish.verify proves each plan once in this run; yields the kept proofs."""
    from weft import publish

    proofs: Proofs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(publish, "verify", proven_once(publish.verify, proofs))
        yield proofs
