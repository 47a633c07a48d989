"""``parse_body``: a body is accepted exactly when it is a JSON object within every limit
(depth, list length, string length), checked against a plain recursive measure of the same."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.errors import UsageError
from agentclaims.gateway.limits import Limits, parse_body

LIMITS = Limits(max_depth=4, max_list_items=5, max_string_chars=6)

scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=9)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=40,
)


def _measure(value: Any, depth: int = 1) -> tuple[int, int, int]:
    """(deepest container, longest list, longest string or key), by plain recursion."""
    if isinstance(value, str):
        return 0, 0, len(value)
    if isinstance(value, list):
        parts = [_measure(v, depth + 1) for v in value]
        own = (depth, len(value), 0)
    elif isinstance(value, dict):
        parts = [_measure(v, depth + 1) for v in value.values()]
        parts += [(0, 0, len(k)) for k in value]
        own = (depth, 0, 0)
    else:
        return 0, 0, 0
    deepest, longest_list, longest_string = (max(x) for x in zip(own, *parts, strict=False))
    return deepest, longest_list, longest_string


@given(st.dictionaries(st.text(max_size=8), values, max_size=4))
def test_a_body_is_accepted_exactly_when_within_every_limit(body: dict[str, Any]) -> None:
    deepest, longest_list, longest_string = _measure(body)
    within = (
        deepest <= LIMITS.max_depth
        and longest_list <= LIMITS.max_list_items
        and longest_string <= LIMITS.max_string_chars
    )
    raw = json.dumps(body).encode()
    if within:
        assert parse_body(raw, LIMITS) == body
    else:
        with pytest.raises(UsageError):
            parse_body(raw, LIMITS)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"a": [[[["x"]]]]}', "body.depth"),
        (b"[" * 50_000 + b"]" * 50_000, "body.depth"),  # past what the parser itself nests
        (b'{"a": {"b": [1, 2, 3, 4, 5, 6]}}', "body.a.b"),
        (b'{"a": [0, {"b": "seven!!"}]}', "body.a[1].b"),
        (b'{"seven!!": 1}', "body"),
    ],
)
def test_what_is_over_a_limit_is_named(raw: bytes, field: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_body(raw, LIMITS)
    assert caught.value.field == field
