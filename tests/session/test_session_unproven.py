"""Fail closed at connect time: a session never submits a claim in a mode its backend's
checked lowering descriptor does not honour, and never reports one as accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import agentclaims
from agentclaims.contract import ProtectionMode
from agentclaims.errors import UnknownNameError
from agentclaims.gateway import Reply
from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext
from agentclaims.protocol import Descriptor
from agentclaims.session import ClaimedSession, ReactionPolicy
from agentclaims.testing import FakeBackend, FakeKV, OutcomeLog, fake_descriptor

QUESTION = [{"role": "user", "content": "q " * 100}]
HARD = ProtectionMode.HARD_PROTECTED


class Pinning(ClaimPlanner):
    """Plans one hard claim (TTL 5 s) on every prefix."""

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        return ClaimPlan(HARD, 5.0, "test: pin every prefix")


def hard_approximated() -> dict[str, Any]:
    """The fake's descriptor but hard_protected lowered to a timed pin: an approximation."""
    doc = fake_descriptor()
    doc["modes"]["hard_protected"] = {
        **doc["modes"]["hard_protected"],
        "primitive": {"kind": "timed_pin", "provider": "runtime", "name": "idle-timeout lock"},
    }
    return doc


def backend_with(lowering: Any) -> FakeBackend:
    return FakeBackend(kv=FakeKV(lowering=lowering), script=lambda r: Reply.tool("search"))


@pytest.fixture
async def approximating() -> AsyncIterator[FakeBackend]:
    backend = backend_with(hard_approximated())
    yield backend
    await backend.aclose()


async def one_call(backend: FakeBackend, log: OutcomeLog, **options: Any) -> ClaimedSession:
    """A session planning hard claims makes one LLM call; the session, still open."""
    session = ClaimedSession(backend, planner=Pinning(), log_stream=log, **options)
    await session.__aenter__()
    client = agentclaims.openai_client(backend)
    with session.node("agent"):
        await client.chat.completions.create(model="scripted", messages=QUESTION)
    await session.settle()
    return session


def submitted_modes(backend: FakeBackend) -> list[str]:
    return [call.args["protection_mode"].value for call in backend.kv.calls_of("submit_claim")]


async def test_a_hard_claim_is_never_accepted_where_hard_is_only_approximated(
    approximating: FakeBackend,
) -> None:
    """Hard is refused locally, with the reason logged, and relaxed to expiring, which the
    backend honours: no hard claim is ever submitted, let alone accepted."""
    log = OutcomeLog()
    session = await one_call(approximating, log)
    assert session.claims["agent"].plan.mode is ProtectionMode.EXPIRING
    assert submitted_modes(approximating) == ["expiring"]
    [relax] = log.reactions("relax")
    assert relax["outcome"] == "refuse_residency_claim"
    assert (relax["from_mode"], relax["to_mode"]) == ("hard_protected", "expiring")
    assert relax["lowering_class"] == "approximation_substrate"
    assert relax["reason"].startswith("hard_protected is approximation_substrate on backend")
    assert "at best an approximation of hard_protected" in relax["reason"]
    assert (session.stats.claims_refused, session.stats.claims_accepted) == (1, 1)
    assert session.stats.modes == {"expiring": 1}
    await session.__aexit__(None, None, None)


async def test_on_unproven_refuse_makes_no_claim(approximating: FakeBackend) -> None:
    """Under ``on_unproven="refuse"`` the hard claim is refused locally and nothing else is
    tried: no submission, a ``reaction_refuse`` line with the reason."""
    log = OutcomeLog()
    policy = ReactionPolicy(on_unproven="refuse")
    session = await one_call(approximating, log, reaction=policy)
    assert session.claims == {}
    assert submitted_modes(approximating) == []
    [refuse] = log.reactions("refuse")
    assert (refuse["outcome"], refuse["mode"]) == ("refuse_residency_claim", "hard_protected")
    assert "approximation_substrate" in refuse["reason"]
    assert session.stats.claims_refused == 1
    await session.__aexit__(None, None, None)


async def test_a_backend_that_honours_nothing_gets_no_claim() -> None:
    """A descriptor that does not check (here: empty) leaves every mode unknown: the claim
    is relaxed down to nothing, and the reason names the problem."""
    backend = backend_with({})
    log = OutcomeLog()
    session = await one_call(backend, log)
    assert submitted_modes(backend) == []
    [relax] = log.reactions("relax")
    assert relax["to_mode"] is None
    assert "did not check: kv_side:fake: descriptor_version: missing" in relax["reason"]
    await session.__aexit__(None, None, None)
    await backend.aclose()


class Understating(FakeBackend):
    """States hard_protected as rejected, whatever its descriptor checks to."""

    async def descriptor(self) -> Descriptor:
        desc = dict(await super().descriptor())
        desc["modes"] = {**desc["modes"], "hard_protected": {"lowering_class": "rejected"}}
        return desc


async def test_a_backend_is_trusted_no_more_than_it_states() -> None:
    """The served descriptor checks to native for hard, but the backend states rejected: the
    session trusts the lesser, and submits no hard claim."""
    backend = Understating(script=lambda r: Reply.tool("search"))
    log = OutcomeLog()
    session = await one_call(backend, log)
    assert submitted_modes(backend) == ["expiring"]
    [relax] = log.reactions("relax")
    assert "the backend states rejected for hard_protected" in relax["reason"]
    await session.__aexit__(None, None, None)
    await backend.aclose()


async def test_the_descriptor_is_read_once_per_backend(approximating: FakeBackend) -> None:
    """Two calls and their claims, one descriptor read from the KV side."""
    log = OutcomeLog()
    session = await one_call(approximating, log)
    client = agentclaims.openai_client(approximating)
    with session.node("worker"):
        await client.chat.completions.create(model="scripted", messages=QUESTION)
    await session.settle()
    assert len(approximating.kv.calls_of("descriptor")) == 1
    await session.__aexit__(None, None, None)


def test_an_unknown_on_unproven_names_the_field() -> None:
    """``on_unproven`` is ``relax`` or ``refuse``."""
    with pytest.raises(UnknownNameError, match=r"reaction.on_unproven.*relax, refuse"):
        ReactionPolicy(on_unproven="pin")  # type: ignore[arg-type]
