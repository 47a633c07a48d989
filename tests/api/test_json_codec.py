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


@given(
    st.integers(min_value=-(2**66), max_value=2**66)
    | st.sampled_from([2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18, 10**19, -(10**18)])
)
def test_integers_near_64_bits_read_back_as_the_same_integers(value: int) -> None:
    for raw in (json.dumps({"n": value, "t": [value, 1.5]}), json.dumps(f"id-{value}")):
        got = _json.loads(raw.encode())
        assert got == json.loads(raw)
        if isinstance(got, dict):
            assert type(got["n"]) is int
            assert got["n"] == value


def test_events_with_nanosecond_timestamps_are_read_by_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page of events (19-digit ``timestamp_ns``, 20-digit block hashes within 64 bits)
    takes orjson's way, not the standard library's."""
    page = {
        "events": [{"seq": i, "timestamp_ns": 1_796_489_291_000_000_000 + i} for i in range(3)],
        "block_hashes": [2**64 - 1, 12_345_678_901_234_567_890],
    }
    raw = json.dumps(page).encode()

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the standard library read it")

    monkeypatch.setattr(_json.json, "loads", refuse)
    assert _json.loads(raw) == page
    with pytest.raises(AssertionError, match="standard library"):
        _json.loads(b"[18446744073709551616]")  # past 64 bits: the standard library's


def test_what_orjson_refuses_the_standard_library_decides() -> None:
    """Integers past 64 bits and NaN parse as before; non-string keys are written as before."""
    assert _json.loads(b'{"h": 18446744073709551616}') == {"h": 2**64}
    assert _json.loads(b"[-9223372036854775809]") == [-(2**63) - 1]  # orjson: a float
    assert _json.loads("[-9223372036854775809]") == [-(2**63) - 1]
    assert math.isnan(_json.loads(b"[NaN]")[0])
    assert json.loads(_json.dumps({1: "a", 2**65: "b"})) == {"1": "a", str(2**65): "b"}


_LOW_HALF = st.characters(min_codepoint=0xDC00, max_codepoint=0xDFFF)  # pairs with nothing before


@given(st.lists(st.text() | _LOW_HALF, min_size=1, max_size=4))
def test_a_lone_surrogate_read_from_an_escape_is_written_escaped(parts: list[str]) -> None:
    """JSON may escape half of a surrogate pair (``"\\udc80"``), which reads as a lone
    surrogate: no UTF-8 writes it, so it goes out escaped again, and reads back the same."""
    value = {"content": "".join(parts)}
    written = _json.dumps(value)
    assert json.loads(written) == value
    assert _json.loads(written) == value


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": }', b"\xff\xfe"])
def test_what_is_not_json_raises_the_standard_librarys_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        _json.loads(raw)
