"""Materialization predicates: edges, validation and the JSON form."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.contract import (
    CacheIdentity,
    ClaimSpec,
    ContiguousRange,
    LeadingPrefixAtLeast,
    leading_run,
    predicate_from_dict,
)
from agentclaims.errors import UnknownNameError, UsageError

IDENT = CacheIdentity("d", "m", "t", "s", 4)


def test_leading_prefix_n1_needs_only_block_zero() -> None:
    """n=1 holds iff position 0 survives, whatever happens after it."""
    pred = LeadingPrefixAtLeast(1)
    assert pred.holds([True, False, False])
    assert not pred.holds([False, True, True])
    assert not pred.holds([])


def test_leading_prefix_n_equal_footprint_needs_every_block() -> None:
    """n=footprint fails when the last position is lost; block 0 lost fails all (L6)."""
    pred = LeadingPrefixAtLeast(60)
    assert pred.holds([True] * 60)
    assert not pred.holds([True] * 59 + [False])
    assert not pred.holds([False] + [True] * 59)
    assert leading_run([False] + [True] * 59) == 0


def test_contiguous_range_ignores_positions_outside() -> None:
    """Only [start, start+n) matters; a range ending at the last position works."""
    pred = ContiguousRange(start=2, n=2)
    assert pred.span == 4
    assert pred.holds([False, False, True, True])
    assert not pred.holds([True, True, True, False])
    assert not pred.holds([True, True, True])  # shorter than the span


def test_contiguous_range_starting_at_the_last_position() -> None:
    """start = footprint-1 with n=1 fits a footprint; start = footprint does not."""
    ClaimSpec("c", "o", "p", IDENT, 4, "hard_protected", ContiguousRange(start=3, n=1))
    with pytest.raises(UsageError) as info:
        ClaimSpec("c", "o", "p", IDENT, 4, "hard_protected", ContiguousRange(start=4, n=1))
    assert info.value.field == "materialization_predicate"


def test_predicate_longer_than_footprint_is_rejected() -> None:
    """A leading predicate wider than the claimed object cannot be accepted."""
    with pytest.raises(UsageError) as info:
        ClaimSpec("c", "o", "p", IDENT, 3, "soft_priority", LeadingPrefixAtLeast(4))
    assert info.value.field == "materialization_predicate"


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.0, 2.5, "3", None])
def test_bad_counts_are_rejected(bad: object) -> None:
    """n must be an integer >= 1: bools, floats, strings, zero and negatives are refused."""
    with pytest.raises(UsageError) as info:
        LeadingPrefixAtLeast(bad)  # type: ignore[arg-type]
    assert info.value.field == "materialization_predicate.n"
    with pytest.raises(UsageError) as info:
        ContiguousRange(start=0, n=bad)  # type: ignore[arg-type]
    assert info.value.field == "materialization_predicate.n"


@pytest.mark.parametrize("bad", [-1, True, 0.0, "0"])
def test_bad_start_is_rejected(bad: object) -> None:
    """start must be an integer >= 0."""
    with pytest.raises(UsageError) as info:
        ContiguousRange(start=bad, n=1)  # type: ignore[arg-type]
    assert info.value.field == "materialization_predicate.start"


@given(
    st.one_of(
        st.builds(LeadingPrefixAtLeast, st.integers(1, 10_000)),
        st.builds(ContiguousRange, st.integers(0, 10_000), st.integers(1, 10_000)),
    )
)
def test_json_round_trip(pred: LeadingPrefixAtLeast | ContiguousRange) -> None:
    """to_dict -> JSON -> predicate_from_dict gives an equal predicate."""
    assert predicate_from_dict(json.loads(json.dumps(pred.to_dict()))) == pred


@given(st.lists(st.booleans(), max_size=30), st.integers(1, 30))
def test_leading_prefix_agrees_with_leading_run(survived: list[bool], n: int) -> None:
    """leading_prefix_at_least(n) holds exactly when the leading run is at least n."""
    assert LeadingPrefixAtLeast(n).holds(survived) == (leading_run(survived) >= n)


def test_from_dict_names_the_problem() -> None:
    """Unknown kinds, missing fields and non-objects are typed errors naming the field."""
    with pytest.raises(UnknownNameError) as kind:
        predicate_from_dict({"kind": "trailing", "n": 1})
    assert kind.value.field == "materialization_predicate.kind"
    with pytest.raises(UsageError) as missing:
        predicate_from_dict({"kind": "contiguous_range", "n": 1})
    assert missing.value.field == "materialization_predicate.start"
    with pytest.raises(UsageError) as shape:
        predicate_from_dict([1])  # type: ignore[arg-type]
    assert shape.value.field == "materialization_predicate"
