"""``BackendPool`` speaks the claims protocol: a claim goes to its owner's member, later
operations to the member holding it, and the members' events come as one ordered stream."""

from __future__ import annotations

from typing import Any

import pytest

from agentclaims.backends import EmbeddedBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.contract import ClaimSpec, ClaimState, OwnerScope, ProtectionMode
from agentclaims.errors import UnknownClaim, UsageError
from agentclaims.protocol import ClaimsProtocol, Renewal, collect_events


async def _served_prefix(backend: EmbeddedBackend) -> str:
    body = (
        await backend.http_client().post("/v1/completions", json={"prompt": list(range(32))})
    ).json()
    return str(body["agentclaims"]["prefix_ids"]["prompt"])


async def test_a_pool_routes_claims_to_their_members_and_merges_events() -> None:
    """Each owner's claim lands on its own member; get, renew and release follow the claim;
    the pool's stream holds both members' events in their order, resumable by cursor."""
    a, b = EmbeddedBackend(16, 16, name="a"), EmbeddedBackend(16, 16, name="b")
    pool = BackendPool([a, b])
    assert isinstance(pool, ClaimsProtocol)
    specs = []
    for owner, member in (("wf-1", a), ("wf-2", b)):
        pool.assign(owner)
        pid = await _served_prefix(member)
        ident = await member.cache_identity()
        specs.append(ClaimSpec(f"{owner}-c", owner, pid, ident, 2, ProtectionMode.SOFT_PRIORITY))
    for spec in specs:
        assert (await pool.submit_claim(spec)).accepted
    assert [v.claim_id for v in a.engine.claims_of("wf-1")] == ["wf-1-c"]
    assert [v.claim_id for v in b.engine.claims_of("wf-2")] == ["wf-2-c"]
    renewed = await pool.renew_claim("wf-2-c", OwnerScope("wf-2"), Renewal(ttl_s=30))
    assert renewed.expires_at_ns is not None
    assert (await pool.release_claim("wf-1-c", OwnerScope("wf-1"))).state is ClaimState.EXPIRED
    events = await collect_events(pool)
    mine = [e.claim_id for e in events if e.claim_id]
    assert set(mine) == {"wf-1-c", "wf-2-c"}
    first = await pool.events(0, limit=2)
    rest = await collect_events(pool, first.next_since)
    assert [e.seq for e in (*first.events, *rest)] == [e.seq for e in events]
    with pytest.raises(UnknownClaim):
        await pool.get_claim("nobody", OwnerScope("wf-1"))
    desc = await pool.descriptor()
    assert set(desc["members"]) == {"a", "b"}
    assert desc["modes"]["hard_protected"]["lowering_class"] == "native_conformance"
    await pool.aclose()


class Stating(EmbeddedBackend):
    """A member whose descriptor states the given classes (and nothing of other modes)."""

    def __init__(self, name: str, **classes: str) -> None:
        super().__init__(16, 16, name=name)
        self.classes = classes

    async def descriptor(self) -> dict[str, Any]:
        desc = dict(await super().descriptor())
        desc["modes"] = {mode: {"lowering_class": cls} for mode, cls in self.classes.items()}
        return desc


async def test_a_pool_states_per_mode_the_weakest_class_of_its_members() -> None:
    """Per mode the lowest rank among the members; a mode a member does not state is
    unknown, below even rejected."""
    a = Stating("a", hard_protected="native_conformance", expiring="rejected")
    b = Stating("b", hard_protected="adapter_policy", best_effort="native_conformance")
    pool = BackendPool([a, b])
    modes = {m: v["lowering_class"] for m, v in (await pool.descriptor())["modes"].items()}
    assert modes["hard_protected"] == "adapter_policy"
    assert modes["expiring"] == "unknown"
    assert modes["best_effort"] == "unknown"
    assert set(modes) == {m.value for m in ProtectionMode}
    await pool.aclose()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 16), "num_blocks"),
        ((16, 0), "block_size"),
        ((16, 1.5), "block_size"),
        ((True,), "num_blocks"),
    ],
)
def test_an_embedded_backend_of_a_bad_size_names_the_argument(args: tuple, field: str) -> None:
    """The sizes a user gives are named as the user gave them, not as the cache identity
    built from them names its fields."""
    with pytest.raises(UsageError) as info:
        EmbeddedBackend(*args)
    assert info.value.field == field
