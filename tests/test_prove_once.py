"""The run's proof cache (tests/_cache.py): one proof per plan content and dtypes, failures never kept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from _cache import proven_once


def _plan(content_hash: str, dtypes: tuple[str, ...] = ("fp32",)) -> SimpleNamespace:
    return SimpleNamespace(content_hash=content_hash, weft=SimpleNamespace(dtypes=dtypes))


def test_a_plan_is_proven_once_and_each_caller_gets_its_own_record():
    calls = []
    verify = proven_once(lambda plan: calls.append(plan.content_hash) or {"sizes": [1]}, {})
    first = verify(_plan("a"))
    first["sizes"].append(2)  # a caller that edits its record leaves the kept one alone
    assert verify(_plan("a")) == {"sizes": [1]} and calls == ["a"]


def test_other_content_or_dtypes_are_proven_afresh():
    calls = []
    verify = proven_once(lambda plan: calls.append(plan.content_hash) or {}, {})
    verify(_plan("a"))
    verify(_plan("b"))
    verify(_plan("a", ("bf16",)))
    assert calls == ["a", "b", "a"]


def test_a_failed_proof_is_not_kept():
    calls = []

    def prove(plan):
        calls.append(plan.content_hash)
        raise ValueError("wrong result")

    verify = proven_once(prove, {})
    for _ in range(2):
        with pytest.raises(ValueError, match="wrong result"):
            verify(_plan("a"))
    assert calls == ["a", "a"]
