"""The JSON codec of the gateway's per-request path (``agentclaims._json``): orjson's speed
with what the standard library accepts and answers, so no request is parsed, refused or
written differently than before."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims import _json

_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_VALUES)
def test_what_it_writes_the_standard_library_reads_back_unchanged(value: Any) -> None:
    assert json.loads(_json.dumps(value)) == value


@given(_VALUES)
def test_it_reads_what_the_standard_library_writes(value: Any) -> None:
    assert _json.loads(json.dumps(value)) == value
    assert _json.loads(json.dumps(value).encode()) == value


def test_what_orjson_refuses_the_standard_library_decides() -> None:
    """Integers past 64 bits and NaN parse as before; non-string keys are written as before."""
    assert _json.loads(b'{"h": 18446744073709551616}') == {"h": 2**64}
    assert _json.loads(b"[-9223372036854775809]") == [-(2**63) - 1]  # orjson: a float
    assert _json.loads("[-9223372036854775809]") == [-(2**63) - 1]
    assert math.isnan(_json.loads(b"[NaN]")[0])
    assert json.loads(_json.dumps({1: "a", 2**65: "b"})) == {"1": "a", str(2**65): "b"}


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": }', b"\xff\xfe"])
def test_what_is_not_json_raises_the_standard_librarys_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        _json.loads(raw)
