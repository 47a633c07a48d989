"""ClaimSpec, CacheIdentity and ClaimEvent: validation and JSON round-trips."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from agentclaims.contract import (
    CacheIdentity,
    ClaimEvent,
    ClaimSpec,
    ContiguousRange,
    EventName,
    ProtectionMode,
    parse_mode,
)
from agentclaims.errors import UnknownNameError, UsageError

IDENT = CacheIdentity("domain", "model", "tok", "salt", 16, adapter_id="lora-1")


def _spec(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "claim_id": "c1",
        "owner_scope": "wf-1",
        "object_id": "pfx-1",
        "cache_identity": IDENT.to_dict(),
        "footprint_blocks": 4,
        "protection_mode": "expiring",
        "materialization_predicate": {"kind": "contiguous_range", "start": 1, "n": 2},
        "duration_steps": 5,
        "ttl_s": 2.5,
    }
    data.update(over)
    return data


def test_claim_spec_json_round_trip() -> None:
    """A full spec survives to_dict -> JSON -> from_dict unchanged."""
    spec = ClaimSpec.from_dict(_spec())
    assert spec.materialization_predicate == ContiguousRange(1, 2)
    assert ClaimSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_default_predicate_is_the_whole_footprint() -> None:
    """Without a predicate the claim means leading_prefix_at_least(footprint)."""
    spec = ClaimSpec.from_dict(_spec(materialization_predicate=None, protection_mode="best_effort"))
    assert spec.materialization_predicate.to_dict() == {"kind": "leading_prefix_at_least", "n": 4}


def test_unknown_mode_names_protection_mode() -> None:
    """An unknown mode is an UnknownNameError on protection_mode listing the six modes."""
    with pytest.raises(UnknownNameError) as info:
        ClaimSpec.from_dict(_spec(protection_mode="very_hard"))
    assert info.value.field == "protection_mode"
    assert set(info.value.known) == {m.value for m in ProtectionMode}
    with pytest.raises(UnknownNameError):
        parse_mode("soft")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("footprint_blocks", 0),
        ("footprint_blocks", -3),
        ("footprint_blocks", 2.0),
        ("footprint_blocks", True),
        ("duration_steps", 0),
        ("duration_steps", -1),
        ("duration_steps", 1.5),
        ("ttl_s", 0),
        ("ttl_s", -1.0),
        ("ttl_s", math.inf),
        ("ttl_s", math.nan),
        ("ttl_s", True),
        ("claim_id", ""),
        ("claim_id", "   "),
        ("owner_scope", ""),
        ("object_id", 7),
    ],
)
def test_bad_spec_values_name_their_field(field: str, value: object) -> None:
    """Non-positive sizes and durations, bad TTLs and empty ids are refused by name."""
    with pytest.raises(UsageError) as info:
        ClaimSpec.from_dict(_spec(**{field: value}))
    assert info.value.field == field


@pytest.mark.parametrize(
    "field",
    [
        "claim_id",
        "owner_scope",
        "object_id",
        "cache_identity",
        "footprint_blocks",
        "protection_mode",
    ],
)
def test_missing_spec_field_is_named(field: str) -> None:
    """Each required field, when missing, is named in the error."""
    data = _spec()
    del data[field]
    with pytest.raises(UsageError) as info:
        ClaimSpec.from_dict(data)
    assert info.value.field == field


def test_expiring_needs_a_duration_and_unknown_fields_are_refused() -> None:
    """An expiring claim without duration or TTL, or a spec with extra fields, is refused."""
    with pytest.raises(UsageError) as info:
        ClaimSpec.from_dict(_spec(duration_steps=None, ttl_s=None))
    assert info.value.field == "duration_steps"
    with pytest.raises(UsageError) as extra:
        ClaimSpec.from_dict(_spec(priority=3))
    assert extra.value.field == "claim"


def test_cache_identity_round_trip_and_validation() -> None:
    """CacheIdentity round-trips through JSON; bad sizes, empty names, gaps are named."""
    assert CacheIdentity.from_dict(json.loads(json.dumps(IDENT.to_dict()))) == IDENT
    bare = CacheIdentity("d", "m", "t", "s", 4)
    assert "adapter_id" not in bare.to_dict()
    for size in (0, -16, 16.0, True):
        with pytest.raises(UsageError) as info:
            CacheIdentity("d", "m", "t", "s", size)  # type: ignore[arg-type]
        assert info.value.field == "cache_identity.block_size"
    with pytest.raises(UsageError) as empty:
        CacheIdentity("d", "", "t", "s", 4)
    assert empty.value.field == "cache_identity.model_id"
    with pytest.raises(UsageError) as missing:
        CacheIdentity.from_dict({"cache_key_domain": "d", "model_id": "m"})
    assert missing.value.field == "cache_identity.tokenizer_id"
    assert "missing" in missing.value.message
    with pytest.raises(UsageError) as extra:
        CacheIdentity.from_dict({**bare.to_dict(), "seed": 1})
    assert extra.value.field == "cache_identity"


def _event() -> ClaimEvent:
    return ClaimEvent(
        event=EventName.RESIDENT_CLAIM_HARMED,
        seq=12,
        event_sequence=3,
        timestamp_ns=1_700_000_000_000_000_000,
        run_id="run",
        policy="lru",
        usable_blocks=80,
        request_id="req",
        claim_id="c1",
        prefix_id="pfx-1",
        data={"cause": "evicted", "predicate_before": True, "predicate_after": False},
    )


def test_claim_event_json_round_trip() -> None:
    """An event survives to_json -> from_json, data fields included."""
    ev = _event()
    back = ClaimEvent.from_json(ev.to_json())
    assert back == ev
    assert json.loads(ev.to_json())["event"] == "resident_claim_harmed"


@pytest.mark.parametrize(
    "field",
    [
        "schema_version",
        "timestamp_ns",
        "run_id",
        "event",
        "request_id",
        "claim_id",
        "prefix_id",
        "policy",
        "usable_blocks",
        "event_sequence",
    ],
)
def test_claim_event_missing_field_is_named(field: str) -> None:
    """Every field the contract requires on an event is named when missing."""
    data = _event().to_dict()
    del data[field]
    with pytest.raises(UsageError) as info:
        ClaimEvent.from_dict(data)
    assert info.value.field == f"event.{field}"


def test_claim_event_bad_values_are_named() -> None:
    """An unknown event name, a non-integer sequence, or non-JSON input is a UsageError."""
    with pytest.raises(UsageError) as name:
        ClaimEvent.from_dict({**_event().to_dict(), "event": "claim_exploded"})
    assert name.value.field == "event.event"
    for bad in ("3", 2.5, None, True):
        with pytest.raises(UsageError) as seq:
            ClaimEvent.from_dict({**_event().to_dict(), "event_sequence": bad})
        assert seq.value.field == "event.event_sequence"
    with pytest.raises(UsageError) as text:
        ClaimEvent.from_json("{not json")
    assert text.value.field == "event"
    with pytest.raises(UsageError):
        ClaimEvent.from_json("[1, 2]")
