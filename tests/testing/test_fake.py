"""The test double: a real ClaimedSession and the real OpenAI client against a FakeBackend."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentclaims
from agentclaims.contract import (
    ArbiterAction,
    ClaimId,
    ClaimSpec,
    ClaimState,
    Decision,
    EventName,
    Feasibility,
    OwnerScope,
    ProtectionMode,
    rebuild_claims,
)
from agentclaims.engine import ReferenceKV, ServiceTimes
from agentclaims.errors import (
    ClaimHarmed,
    ClaimRefused,
    IllegalTransition,
    ScopeViolation,
    UnknownClaim,
)
from agentclaims.gateway import Reply
from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext
from agentclaims.protocol import (
    ActiveRequest,
    ActiveServing,
    ClaimDecision,
    ClaimsProtocol,
    InstanceControl,
    collect_events,
    supports,
)
from agentclaims.session import ClaimedSession, HeldClaim
from agentclaims.testing import FakeBackend, FakeKV, OutcomeLog

QUESTION = [{"role": "user", "content": "q " * 100}]  # 6 full blocks of 16 words


class Pinning(ClaimPlanner):
    """Plans one hard claim (TTL 5 s) on every prefix, so each call leaves a known claim."""

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        return ClaimPlan(ProtectionMode.HARD_PROTECTED, 5.0, "test: pin every prefix")


class Sleeps:
    """An injected sleep that records what it was asked to wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
async def backend() -> AsyncIterator[FakeBackend]:
    b = FakeBackend(script=lambda request: Reply.tool("search"))
    yield b
    await b.aclose()


def session_on(backend: FakeBackend, log: OutcomeLog, **options: Any) -> ClaimedSession:
    options.setdefault("planner", Pinning())
    return ClaimedSession(backend, log_stream=log, **options)


async def ask(backend: FakeBackend, node: str = "agent") -> Any:
    """One LLM call through the OpenAI client, made by ``node`` of the current session."""
    session = agentclaims.current_session()
    assert session is not None
    client = agentclaims.openai_client(backend)
    with session.node(node):
        return await client.chat.completions.create(model="scripted", messages=QUESTION)


async def held_after_call(backend: FakeBackend, node: str = "agent") -> HeldClaim:
    """``node`` calls; the claim the session then holds for it (planned after the answer)."""
    await ask(backend, node)
    session = agentclaims.current_session()
    assert session is not None
    await session.settle()
    return session.claims[node]


async def between_calls(backend: FakeBackend, act: Callable[[str], object]) -> str:
    """Node ``planner`` calls, ``act`` is done to its claim, node ``worker`` calls; the claim."""
    claim_id = (await held_after_call(backend, "planner")).claim_id
    act(claim_id)
    await held_after_call(backend, "worker")
    return claim_id


async def test_refused_claim_under_fail_raises_with_its_decision(backend):
    """A refused claim under `fail` raises ClaimRefused whose outcome is the ClaimDecision."""
    backend.kv.refuse_claims(reason="no_room")
    log = OutcomeLog()
    session = session_on(backend, log, reaction="fail")

    async def workflow() -> None:
        async with session:
            await ask(backend)
            await session.settle()  # the claim is planned and submitted after the answer

    with pytest.raises(ClaimRefused) as info:
        await workflow()
    decision = info.value.outcome
    assert isinstance(decision, ClaimDecision)
    assert (decision.decision, decision.state) == (Decision.REJECTED, ClaimState.REFUSED)
    assert decision.reason == "no_room"
    assert decision.action is ArbiterAction.REFUSE_RESIDENCY_CLAIM
    [rejected] = log.of(EventName.RESIDENT_CLAIM_REJECTED)
    assert rejected["claim_id"] == decision.claim_id == info.value.claim_id
    assert session.claims == {}


async def test_refusal_of_one_mode_is_relaxed_to_the_next(backend):
    """Refusing only hard claims makes the session relax to expiring, which is accepted."""
    backend.kv.refuse_claims(mode="hard_protected", reason="no_pins")
    log = OutcomeLog()
    async with session_on(backend, log):
        held = await held_after_call(backend)
        assert held.plan.mode is ProtectionMode.EXPIRING
    [relax] = log.reactions("relax")
    assert (relax["from_mode"], relax["to_mode"], relax["outcome"]) == (
        "hard_protected",
        "expiring",
        "no_pins",
    )


async def test_deferred_request_is_waited_out_then_served(backend):
    """Two deferrals are waited out for exactly their retry_after_s, then the call is served."""
    backend.kv.defer_requests(n=2, retry_after_s=0.25)
    sleep, log = Sleeps(), OutcomeLog()
    async with session_on(backend, log, sleep=sleep) as session:
        reply = await ask(backend)
    assert reply.choices[0].message.tool_calls[0].function.name == "search"
    assert sleep.waits == [0.25, 0.25]
    assert session.stats.deferrals == 2
    assert session.stats.llm_calls == 1
    assert [d["outcome"]["action"] for d in log.reactions("defer")] == ["defer_active"] * 2
    assert len(backend.kv.calls_of("serve")) == 3
    assert len(log.of(EventName.ACTIVE_REQUEST_DEFERRED)) == 2


async def test_refused_request_under_fail_names_the_blocking_claims(backend):
    """A refused request under `fail` raises ClaimRefused with the blocking ids, unretried."""
    backend.kv.refuse_requests(blocking=("other-c1", "other-c2"), shortfall_blocks=7)
    sleep, log = Sleeps(), OutcomeLog()
    with pytest.raises(ClaimRefused) as info:
        async with session_on(backend, log, reaction="fail", sleep=sleep):
            await ask(backend)
    assert info.value.blocking_claim_ids == ("other-c1", "other-c2")
    assert info.value.shortfall_blocks == 7
    assert info.value.outcome.action is ArbiterAction.REFUSE_ACTIVE
    assert info.value.outcome.feasibility is Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE
    assert sleep.waits == []
    [refused] = log.of(EventName.ACTIVE_REQUEST_REFUSED)
    assert refused["blocking_claim_ids"] == ["other-c1", "other-c2"]
    assert len(backend.kv.calls_of("serve")) == 1


async def test_demote_makes_the_session_replan_at_its_next_call(backend):
    """A held claim demoted by the backend is re-planned when the session next calls."""
    log = OutcomeLog()
    async with session_on(backend, log) as session:
        demoted = await between_calls(backend, backend.kv.demote)
        replacement = session.claims["planner"]
    [replan] = log.reactions("replan")
    assert (replan["claim_id"], replan["outcome"]) == (demoted, "resident_claim_demoted")
    assert session.stats.claims_demoted == 1
    assert session.stats.claims_replanned == 1
    assert replacement.claim_id != demoted
    assert replacement.prefix_id == log.claim_story(demoted)[0]["prefix_id"]


async def test_harm_is_logged_with_its_cause_and_counted(backend):
    """Under the default reaction a harmed claim is logged with its cause and counted."""
    log = OutcomeLog()
    async with session_on(backend, log) as session:
        harmed = await between_calls(backend, lambda c: backend.kv.harm(c, cause="host_tier_full"))
    [line] = log.of(EventName.RESIDENT_CLAIM_HARMED)
    assert (line["claim_id"], line["cause"]) == (harmed, "host_tier_full")
    assert (line["predicate_before"], line["predicate_after"]) == (True, False)
    assert session.stats.claims_harmed == 1
    assert "planner" not in session.claims
    assert log.reactions("fail") == []


async def test_harm_under_fail_raises_claim_harmed(backend):
    """Under `fail` a harmed claim raises ClaimHarmed naming the claim and its event."""
    log = OutcomeLog()
    harmed: list[str] = []

    def harm(claim_id: str) -> None:
        harmed.append(claim_id)
        backend.kv.harm(claim_id, cause="evicted")

    async def workflow() -> None:
        async with session_on(backend, log, reaction="fail"):
            await between_calls(backend, harm)

    with pytest.raises(ClaimHarmed) as info:
        await workflow()
    assert [info.value.claim_id] == harmed
    assert info.value.event is not None
    assert info.value.event.data["cause"] == "evicted"
    assert [r["cause"] for r in log.reactions("fail")] == ["evicted"]


async def test_calls_record_the_submits_and_releases(backend):
    """`calls` holds each claim submitted and released, with the session's owner scope; the
    backend's descriptor is read once, before the first call (does it take claims riding on
    calls?)."""
    log = OutcomeLog()
    async with session_on(backend, log) as session:
        await ask(backend)
        await ask(backend)
    submitted = backend.kv.calls_of("submit_claim")
    released = backend.kv.calls_of("release_claim")
    assert [c.claim_id for c in submitted] == [c.claim_id for c in released] == log.claim_ids()
    assert len(submitted) == 2
    assert {c.args["owner_scope"] for c in submitted + released} == {session.owner_scope}
    assert {c.args["protection_mode"] for c in submitted} == {ProtectionMode.HARD_PROTECTED}
    # the gateway's descriptor names the last event (the events read after it): then the call
    assert [c.operation for c in backend.kv.calls][:3] == ["descriptor", "events", "serve"]


async def test_releases_say_done_only_when_nothing_here_uses_the_prefix_again(backend):
    """A claim let go while the run goes on (superseded by the next call's) is released as
    live work; those the ended session lets go are released ``done``: the KV side may evict
    their blocks first (the connector puts them at the head of vLLM's free queue)."""
    log = OutcomeLog()
    async with session_on(backend, log):
        await ask(backend)
        await ask(backend)
    first, second = log.claim_ids()
    done = {c.claim_id: c.args["done"] for c in backend.kv.calls_of("release_claim")}
    assert done == {first: False, second: True}  # superseded by the 2nd call's; the run ended


async def test_claim_story_runs_from_planned_to_ended(backend):
    """A claim's story in the captured log: planned, its events, then ended with a reason."""
    log = OutcomeLog()
    async with session_on(backend, log):
        claim_id = (await held_after_call(backend)).claim_id
    story = [line["event"] for line in log.claim_story(claim_id)]
    assert story == [
        "claim_planned",
        "resident_claim_submitted",
        "resident_claim_accepted",
        "resident_claim_materialized",
        "claim_ended",
        "resident_claim_expired",
    ]
    ended = log.claim_story(claim_id)[4]
    assert (ended["reason"], ended["state"]) == ("session_end", "expired")
    assert log.claim_story(claim_id)[-1]["reason"] == "released"


async def test_a_second_call_is_served_from_the_cache(backend):
    """Blocks served once stay cached: the same prompt again reports cached tokens."""
    log = OutcomeLog()
    async with session_on(backend, log) as session:
        await ask(backend)
        reply = await ask(backend)
    assert reply.usage.prompt_tokens_details.cached_tokens == 6 * 16
    assert session.stats.cached_tokens == 6 * 16
    assert [c["cached_tokens"] for c in log.of("llm_call")] == [0, 96]


async def test_evict_drops_the_blocks_and_harms_the_claim_on_them(backend):
    """`evict` empties a prefix from the cache and harms the materialized claim on it."""
    log = OutcomeLog()
    async with session_on(backend, log) as session:
        held = await held_after_call(backend)
        backend.kv.evict(held.prefix_id)
        assert await backend.residency([held.prefix_id]) == {held.prefix_id: 0}
        view = await backend.get_claim(held.claim_id, session.owner_scope)
    assert (view.state, view.end_reason, view.present_blocks) == (ClaimState.HARMED, "evicted", 0)


async def test_claims_api_checks_scope_and_existence(backend):
    """Another owner's claim is a ScopeViolation, an unknown one UnknownClaim, over HTTP."""
    log = OutcomeLog()
    async with session_on(backend, log) as session:
        claim_id = (await held_after_call(backend)).claim_id
        with pytest.raises(ScopeViolation):
            await backend.release_claim(claim_id, OwnerScope("someone-else"))
        with pytest.raises(UnknownClaim):
            await backend.get_claim("no-such-claim", session.owner_scope)
        view = await backend.get_claim(claim_id, session.owner_scope)
        assert view.state is ClaimState.MATERIALIZED
        assert view.predicate_holds


async def test_a_claim_on_the_prompt_is_decided_with_its_request():
    """A claim sent with a request on `@prompt` is accepted and materialized right away."""
    kv = FakeKV(num_blocks=8, block_size=4)
    spec = {"claim_id": "c1", "protection_mode": "expiring", "ttl_s": 2.0, "object_id": "@prompt"}
    result = await kv.serve(
        ActiveRequest(
            "r1", segments=((1, 2, 3, 4), (5, 6, 7, 8, 9)), claims=(spec,), owner_scope="o"
        )
    )
    [decision] = result.decisions
    assert (decision.decision, decision.state) == (Decision.ACCEPTED, ClaimState.MATERIALIZED)
    assert len(result.prefix_ids["messages"]) == 2
    assert result.prefix_ids["prompt"] == result.prefix_ids["messages"][1]
    view = await kv.get_claim("c1", "o")
    assert (view.object_id, view.footprint_blocks) == (result.prefix_ids["prompt"], 2)


async def test_fake_kv_answers_and_emits_like_the_reference_engine():
    """For a served request with a claim, then its release: same result, same event fields."""
    claim = {"claim_id": "c1", "object_id": "@prompt", "protection_mode": "expiring", "ttl_s": 5.0}
    request = ActiveRequest(
        "r1",
        segments=((1, 2, 3, 4, 5), (6, 7, 8, 9)),
        reply_tokens=(1, 2, 3),
        claims=(claim,),
        owner_scope=OwnerScope("o"),
    )
    seen = []
    for kv in (ReferenceKV.create(64, 4, service=ServiceTimes(0, 0)), FakeKV(64, 4)):
        result = await kv.serve(request)
        await kv.release_claim(ClaimId("c1"), OwnerScope("o"))
        events = [(e.event, e.event_sequence, sorted(e.data)) for e in await collect_events(kv)]
        seen.append((result.prefix_ids, result.outcome, result.decisions, events))
    assert seen[0] == seen[1]


async def test_fake_kv_speaks_the_protocol_and_active_serving():
    """FakeKV is a ClaimsProtocol with ActiveServing and no InstanceControl."""
    kv = FakeKV()
    assert isinstance(kv, ClaimsProtocol)
    assert supports(kv, ActiveServing)
    assert not supports(kv, InstanceControl)
    descriptor = await kv.descriptor()
    assert descriptor["kv_side"] == "fake"
    assert descriptor["block_size"] == 16


def test_outcome_log_keeps_its_lines_after_close():
    """Closing the stream keeps the parsed lines; a partial line waits for its newline."""
    log = OutcomeLog()
    log.write('{"event": "llm_call", "claim_id": null}\n{"event": "reac')
    log.write('tion_defer"}\nnot json\n')
    log.close()
    assert log.events == ["llm_call", "reaction_defer"]
    assert log.reactions() == log.reactions("defer") == [{"event": "reaction_defer"}]
    assert log.malformed == ["not json"]


def test_import_agentclaims_does_not_import_the_testing_package():
    """`import agentclaims` leaves agentclaims.testing unloaded."""
    code = "import sys, agentclaims; print('agentclaims.testing' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- the event stream

OPERATIONS = [
    "serve",
    "serve_claim",
    "serve_claim_no_admit",
    "demote",
    "expire",
    "harm",
    "release",
    "evict",
]
OPS = st.lists(
    st.tuples(
        st.sampled_from([*OPERATIONS, "refuse", "defer", "refuse_claims", "accept_claims"]),
        st.integers(1, 3),
    ),
    max_size=25,
)


async def _run(ops: list[tuple[str, int]]) -> FakeKV:
    """Apply ``ops`` to a fresh FakeKV; illegal lifecycle moves must raise and emit nothing."""
    kv = FakeKV(num_blocks=16, block_size=4, clock=iter(range(10**9)).__next__)
    owner = OwnerScope("o")
    for i, (op, arg) in enumerate(ops):
        claims = [v.claim_id for v in kv.views()]
        before = kv.last_seq
        if op.startswith("serve"):
            claim = {
                "claim_id": f"c{i}",
                "object_id": "@sequence",
                "protection_mode": "soft_priority",
            }
            request = ActiveRequest(
                f"r{i}",
                segments=(tuple(range(arg * 4 + 1)),),
                claims=(claim,) if "claim" in op else (),
                owner_scope=owner,
                admit=not op.endswith("no_admit"),
            )
            await kv.serve(request)
        elif op == "refuse":
            kv.refuse_requests(arg, blocking=claims[:1])
        elif op == "defer":
            kv.defer_requests(arg, retry_after_s=0.1)
        elif op == "refuse_claims":
            kv.refuse_claims(reason="full")
        elif op == "accept_claims":
            kv.accept_claims()
        elif claims:
            claim_id = claims[arg % len(claims)]
            try:
                if op == "release":
                    await kv.release_claim(claim_id, owner)
                elif op == "evict":
                    view = await kv.get_claim(claim_id, owner)
                    kv.evict(view.object_id)
                else:
                    getattr(kv, op)(claim_id)
            except IllegalTransition:
                assert kv.last_seq == before
    return kv


@settings(max_examples=60, deadline=None)
@given(ops=OPS, page=st.integers(1, 7))
def test_event_stream_is_gap_free_and_ordered(ops, page):
    """Over random operations: seq runs 1..n, each claim's sequence 0..k, lifecycles legal."""
    kv = asyncio.run(_run(ops))
    events = kv.event_stream
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    per_claim: dict[str | None, list[int]] = {}
    for e in events:
        per_claim.setdefault(e.claim_id, []).append(e.event_sequence)
    assert all(seqs == list(range(len(seqs))) for seqs in per_claim.values())
    histories = rebuild_claims(events)  # raises on an illegal order
    assert {cid: h.state for cid, h in histories.items()} == {
        v.claim_id: v.state for v in kv.views()
    }
    paged: list[Any] = []
    since = 0
    while True:
        got = asyncio.run(kv.events(since, limit=page))
        assert not got.gap
        paged.extend(got.events)
        if not got.more:
            break
        since = got.next_since
    assert tuple(paged) == events == tuple(asyncio.run(collect_events(kv)))


def test_spec_for_submit_needs_a_known_prefix():
    """A claim on a prefix the fake never served is a UsageError naming object_id."""
    kv = FakeKV()
    spec = ClaimSpec("c1", "o", "pfx-00000000000000ab-2", kv.cache_identity, 2, "best_effort")
    with pytest.raises(agentclaims.UsageError, match="object_id"):
        asyncio.run(kv.submit_claim(spec))
    assert kv.event_stream == ()
