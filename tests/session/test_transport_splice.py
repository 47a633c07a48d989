"""The claims transport sends the client's request bytes as they are, with the ``agentclaims``
object spliced in: the body the gateway reads is exactly the client's plus the extension,
whatever the client's JSON looks like (spacing, nesting, escapes)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentclaims._json import may_stream
from agentclaims.session.transport import _glance, _spliced

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
OBJECTS = st.dictionaries(st.text().filter(lambda k: k != "agentclaims"), JSON, max_size=6)


@given(body=OBJECTS, ext=st.dictionaries(st.text(), JSON, max_size=4), pretty=st.booleans())
def test_the_spliced_body_is_the_clients_plus_the_extension(
    body: dict[str, object], ext: dict[str, object], pretty: bool
) -> None:
    raw = json.dumps(body, indent=2 if pretty else None).encode() + (b"\n" if pretty else b"")
    assert json.loads(_spliced(raw, ext)) == {**body, "agentclaims": ext}


KEYS = st.sampled_from(["stream", "model", "messages", "user", "agentclaims"]) | st.text()
NESTED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=16,
)
BODIES = st.dictionaries(KEYS, NESTED, max_size=6)


@given(body=BODIES, pretty=st.booleans())
def test_a_glanced_body_asks_for_no_stream_and_names_its_model(
    body: dict[str, object], pretty: bool
) -> None:
    """``_glance`` reads a body's model without parsing it only where that is certain: a body
    it answers for never asks for a stream, has no ``agentclaims`` key of its own, and its
    model, where it has one at the top, is the one read."""
    raw = json.dumps(body, indent=2 if pretty else None).encode()
    model = _glance(raw)
    if model is None:
        return
    assert body.get("stream") is not True
    assert "agentclaims" not in body
    if isinstance(body.get("model"), str):
        assert model == body["model"]


def test_what_a_chat_client_sends_is_glanced_and_what_streams_is_parsed() -> None:
    """The common bodies: a chat call without ``stream`` or with ``"stream": false`` is read
    without a parse; one asking for a stream, carrying its own ``agentclaims`` object, or
    quoting the keys in its messages (escaped there) is parsed or glanced as it must be."""
    call = {"messages": [{"role": "user", "content": 'say "stream": true'}], "model": "m"}
    assert _glance(json.dumps(call).encode()) == "m"
    assert _glance(json.dumps({**call, "stream": False}).encode()) == "m"
    assert _glance(json.dumps({**call, "stream": True}).encode()) is None
    assert _glance(json.dumps({**call, "agentclaims": {}}).encode()) is None
    assert _glance(json.dumps({"messages": []}).encode()) is None  # no model: parsed
    assert _glance(b"[1, 2]") is None


@given(body=BODIES, pretty=st.booleans())
def test_a_body_read_as_asking_for_no_stream_never_asks_for_one(
    body: dict[str, object], pretty: bool
) -> None:
    """``may_stream`` (the in-process transport's and the claims transport's one reading of a
    body's ``stream``) says no only where the body, parsed, asks for no stream."""
    raw = json.dumps(body, indent=2 if pretty else None).encode()
    if not may_stream(raw):
        assert body.get("stream") is not True
    if body.get("stream") is True:
        assert may_stream(raw)
