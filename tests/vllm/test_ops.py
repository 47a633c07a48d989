"""The connector's claim operations (``agentclaims_vllm.ops``), typed once for the gateway and
the connector: what the gateway writes the connector reads back as the same operation, and
what it cannot read is refused naming why."""

from __future__ import annotations

from typing import Any

import pytest
from agentclaims_vllm.ops import (
    EXTENSION_KEY,
    Answer,
    Hold,
    MalformedOp,
    Release,
    Renew,
    Reply,
    RevokeAll,
    parse,
    to_wire,
)
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.protocol import EXTENSION_KEY as API_EXTENSION_KEY

_IDS = st.text(min_size=1, max_size=12)
_TENANTS = st.none() | _IDS
_SECONDS = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)
_OPS = st.one_of(
    st.builds(
        Hold,
        _IDS,
        st.sampled_from(["hard_protected", "expiring", "demotable", "soft_priority"]),
        st.none() | st.just("all") | st.integers(min_value=0, max_value=10_000),
        _SECONDS,
        _SECONDS,
        _TENANTS,
    ),
    st.builds(Release, _IDS, _TENANTS),
    st.builds(Renew, _IDS, _SECONDS, _TENANTS),
    st.builds(RevokeAll, _IDS),
    st.builds(Answer, _IDS),
)


@given(_OPS)
def test_every_operation_reads_back_as_itself(op: Any) -> None:
    wire = to_wire(op)
    assert wire["op"] == op.op
    assert None not in wire.values()  # unset fields stay off the wire
    assert parse(wire) == op


@pytest.mark.parametrize(
    ("raw", "kind", "says"),
    [
        ({"op": "evict_everything"}, "evict_everything", "unknown operation"),
        ({"claim_id": "c1"}, None, "unknown operation"),
        (["release", "c1"], None, "a JSON object"),
        ({"op": "hold", "claim_id": "c1", "mode": "demotable", "blocks": True}, "hold", "blocks"),
        ({"op": "hold", "claim_id": "c1", "mode": "demotable", "blocks": "6"}, "hold", "blocks"),
        ({"op": "release", "claim_id": "c1", "tenant": 7}, "release", "tenant"),
    ],
)
def test_what_cannot_be_read_is_refused_naming_why(raw: Any, kind: Any, says: str) -> None:
    with pytest.raises(MalformedOp) as caught:
        parse(raw)
    assert caught.value.kind == kind
    assert says in caught.value.reason


def test_a_malformed_hold_names_its_claim() -> None:
    with pytest.raises(MalformedOp) as caught:
        parse({"op": "hold", "claim_id": "c9", "mode": "demotable", "blocks": 2.5})
    assert caught.value.claim_id == "c9"


def test_the_envelope_sits_under_the_key_the_claims_api_uses() -> None:
    """One name for the extension in both distributions (the connector's runs in vLLM's
    environment, without agentclaims): the gateway's answers and vLLM's agree."""
    assert EXTENSION_KEY == API_EXTENSION_KEY


_JSON_OBJECTS = st.dictionaries(
    st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3
)
_REPLIES = st.builds(
    Reply,
    results=st.tuples(_JSON_OBJECTS),
    events=st.lists(_JSON_OBJECTS, max_size=3).map(tuple),
    last_seq=st.integers(0, 2**40),
    held_blocks=st.integers(0, 10_000),
    cap_blocks=st.none() | st.integers(0, 10_000),
    soft_cap_blocks=st.none() | st.integers(0, 10_000),
    max_ttl_s=_SECONDS,
    max_defer_s=_SECONDS,
    instance=st.none() | _IDS,
    channel=st.none() | _IDS,
    pool=st.none() | _JSON_OBJECTS,
    deferred_s=_SECONDS,
    refused=st.none() | _JSON_OBJECTS,
    scheduling=st.none() | st.sampled_from(("fcfs", "priority")),
)


@given(_REPLIES)
def test_a_reply_the_connector_writes_reads_back_as_itself(reply: Reply) -> None:
    """What the connector writes into ``kv_transfer_params`` the gateway reads back whole."""
    assert Reply.from_wire(reply.to_wire()) == reply


@given(st.dictionaries(st.sampled_from(Reply.__slots__), st.none() | st.booleans() | st.text()))
def test_a_reply_with_fields_of_the_wrong_type_reads_them_as_absent(raw: dict[str, Any]) -> None:
    """Fields of the wrong type are absent (no crash, no wrong figure taken for a limit)."""
    reply = Reply.from_wire(raw)
    assert reply.cap_blocks is None
    assert reply.max_ttl_s is None
    assert reply.results == ()
    assert reply.last_seq == 0
    assert Reply.from_wire("not an object") == Reply()
