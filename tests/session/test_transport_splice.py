"""The claims transport sends the client's request bytes as they are, with the ``agentclaims``
object spliced in: the body the gateway reads is exactly the client's plus the extension,
whatever the client's JSON looks like (spacing, nesting, escapes)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentclaims.session.transport import _spliced

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
