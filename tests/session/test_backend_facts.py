"""A session's facts about its backend (``agentclaims.session.facts``): made once per
descriptor object a backend hands out, shared by every session on that backend, made anew
for another descriptor, and a bad descriptor refused each time it is read."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import agentclaims
from agentclaims.contract import ProtectionMode
from agentclaims.errors import BackendError
from agentclaims.lowering.check import honours
from agentclaims.session.facts import BackendFacts
from agentclaims.testing import FakeBackend, FakeKV, fake_descriptor


class Described:
    """A backend as ``BackendFacts`` reads one: a name, and the descriptor it keeps."""

    def __init__(self, name: str, descriptor: dict[str, Any]) -> None:
        self.name = name
        self.kept = descriptor
        self.reads = 0

    async def descriptor(self) -> dict[str, Any]:
        self.reads += 1
        return self.kept


async def test_sessions_on_one_backend_share_the_facts_its_descriptor_made() -> None:
    backend = agentclaims.EmbeddedBackend(64)
    try:
        first = await BackendFacts().of(backend)
        again = await BackendFacts().of(backend)  # another session's
        assert again is first
        assert again.rides
        assert again.events_ride
        assert set(again.lowering) == set(ProtectionMode)
    finally:
        await backend.aclose()


async def test_another_descriptor_makes_its_own_facts() -> None:
    """After ``forget`` (the backend reaches another instance) a new descriptor is read: its
    facts are its own, even under the same backend name, and the old one's stay its own."""
    approximated = fake_descriptor()
    approximated["modes"]["hard_protected"] = {
        **approximated["modes"]["hard_protected"],
        "primitive": {"kind": "timed_pin", "provider": "runtime", "name": "idle-timeout lock"},
    }
    docs = []
    for lowering in (fake_descriptor(), approximated):
        fake = FakeBackend(kv=FakeKV(lowering=lowering))
        docs.append(await fake.descriptor())
        await fake.aclose()
    backend = Described("fleet-member", docs[0])
    facts = BackendFacts()
    before = await facts.of(backend)
    backend.kept = docs[1]
    assert await facts.of(backend) is before  # read once until forgotten
    facts.forget("fleet-member")
    after = await facts.of(backend)
    assert after is not before
    assert backend.reads == 2
    hard = ProtectionMode.HARD_PROTECTED
    assert honours(before.lowering[hard].lowering_class)
    assert not honours(after.lowering[hard].lowering_class)  # a timed pin: approximated
    backend.kept = docs[0]
    assert await BackendFacts().of(backend) is before  # the first descriptor's, as made


async def test_a_bad_descriptor_is_refused_each_time_and_never_kept() -> None:
    fake = FakeBackend(kv=FakeKV())
    doc = copy.deepcopy(dict(await fake.descriptor()))
    await fake.aclose()
    doc["cache_identity"] = {"model": 7}
    backend = Described("bad", doc)
    for _ in range(2):
        with pytest.raises(BackendError, match="bad descriptor"):
            await BackendFacts().of(backend)
    assert backend.reads == 2
