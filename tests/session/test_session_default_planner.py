"""The planner a session gets by default follows its backend: ``ranked`` (soft, hinted
best-effort claims) where the backend's descriptor says it ranks by reuse hints, ``default``
elsewhere. Real sessions on embedded reference engines, real HTTP through the gateway app."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.contract import ProtectionMode
from agentclaims.engine import NextUsePolicy
from agentclaims.errors import UnknownNameError
from agentclaims.gateway.text import Reply
from agentclaims.planner import POOL_KEEPS, SAVES_LESS, ClaimPlan, ClaimPlanner, PrefixContext
from agentclaims.protocol import (
    CLAIMS_RIDE_ON_REQUESTS,
    RANKS_BY_HINTS,
    SEQUENCE_OBJECT,
    SHEDS_BY_HINTS,
    ranks_by_hints,
    sheds_by_hints,
)
from agentclaims.session import ClaimedSession
from agentclaims.session.riding import Riding

SYSTEM = "you are a careful agent " * 40


def _backend(ranking: bool) -> EmbeddedBackend:
    return EmbeddedBackend(
        num_blocks=512,
        block_size=16,
        script=lambda request: Reply.tool("search"),
        eviction_policy=NextUsePolicy() if ranking else None,
    )


async def _planned(
    ranking: bool, tmp_path: Path, **options: object
) -> tuple[ClaimedSession, set[object]]:
    """The session and the modes it planned, on a fresh engine that ranks or does not."""
    backend = _backend(ranking)
    try:
        session, planned = await _three_calls(backend, tmp_path, **options)
    finally:
        await backend.aclose()
    assert planned
    return session, {line["mode"] for line in planned}


async def _three_calls(
    backend: EmbeddedBackend, tmp_path: Path, **options: object
) -> tuple[ClaimedSession, list[dict[str, object]]]:
    """One agent calling the model three times, a tool between calls; the planned claims."""
    client = agentclaims.openai_client(backend)
    session = ClaimedSession(backend, log_dir=tmp_path, **options)  # type: ignore[arg-type]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]
    async with session:
        with session.node("agent"):
            for _ in range(3):
                reply = await client.chat.completions.create(model="scripted", messages=messages)
                messages.append({"role": "assistant", "content": str(reply.choices[0].message)})
                async with session.tool_call("search"):
                    pass
                messages.append({"role": "user", "content": "result " * 10})
        await session.settle()
    lines = [json.loads(line) for line in session.log_path.read_text().splitlines()]  # type: ignore[union-attr]
    return session, [line for line in lines if line["event"] == "claim_planned"]


async def test_descriptor_states_whether_the_engine_ranks_by_hints():
    """The capability is the descriptor's ``ranks_by_hints``, through the gateway's HTTP."""
    ranking, plain = _backend(True), _backend(False)
    try:
        assert (await ranking.descriptor())[RANKS_BY_HINTS] is True
        assert (await plain.descriptor())[RANKS_BY_HINTS] is False
        assert not ranks_by_hints({})  # absent: does not rank
        assert not ranks_by_hints({RANKS_BY_HINTS: "yes"})  # fail closed on anything else
    finally:
        await ranking.aclose()
        await plain.aclose()


async def test_ranking_backend_gets_ranked_plans_without_naming_a_preset(tmp_path):
    """No ``planner`` option, an engine with ``NextUsePolicy``: every claim is ``best_effort``
    (ranked by its hint, never a pin), as the ``ranked`` preset plans."""
    session, modes = await _planned(True, tmp_path)
    assert session.planner.policy.name == "ranked"
    assert modes == {"best_effort"}
    assert session.stats.claims_accepted >= 1


async def test_non_ranking_backend_keeps_the_default_mapping(tmp_path):
    """The same workflow on an LRU engine: the ``default`` mapping, which pins the prefix
    across a short, sure tool wait (``hard_protected``)."""
    session, modes = await _planned(False, tmp_path)
    assert session.planner.policy.name == "default"
    assert "hard_protected" in modes


async def test_a_named_planner_is_kept_on_a_ranking_backend(tmp_path):
    """A preset the user names wins over the backend's capability."""
    session, modes = await _planned(True, tmp_path, planner="default")
    assert session.planner.policy.name == "default"
    assert "hard_protected" in modes


def test_unknown_planner_name_lists_auto():
    backend = _backend(False)
    with pytest.raises(UnknownNameError, match="auto"):
        ClaimedSession(backend, planner="ranked-soft")


class _Shedding(EmbeddedBackend):
    """The reference engine behind a descriptor that states ``sheds_by_hints`` (as vLLM's
    connector does), with ``demotable`` honoured as the engine's lowering shows, or
    (``honoured=False``) stated ``rejected``; ``rides``: it states
    ``claims_ride_on_requests`` too (as vLLM's gateway does)."""

    def __init__(self, *, honoured: bool = True, rides: bool = False, script=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(
            num_blocks=512,
            block_size=16,
            script=script or (lambda request: "an answer in a few words"),
        )
        self.honoured = honoured
        self.rides = rides

    async def descriptor(self) -> dict[str, object]:
        desc = dict(await super().descriptor())
        desc[SHEDS_BY_HINTS] = True
        desc[CLAIMS_RIDE_ON_REQUESTS] = self.rides
        if not self.honoured:
            modes = dict(desc["modes"])  # type: ignore[arg-type]
            modes["demotable"] = {**modes["demotable"], "lowering_class": "rejected"}
            desc["modes"] = modes
        return desc


async def test_the_held_preset_holds_prefixes_demotable_where_default_claims_best_effort(
    tmp_path,
):
    """``planner="held"``: a prefix the ``default`` mapping would claim ``best_effort`` (an
    answer, no tool: the next call's wait unknown) is held ``demotable`` with its hint. ``auto``
    stays ``default`` on such a backend while a claim there costs a request of its own (it
    does not state ``claims_ride_on_requests``)."""
    backend = _Shedding()
    try:
        session, planned = await _three_calls(backend, tmp_path, planner="held")
        auto, _ = await _three_calls(backend, tmp_path)
    finally:
        await backend.aclose()
    assert session.planner.policy.name == "held"
    assert {line["mode"] for line in planned} == {"demotable"}
    assert session.stats.claims_accepted == len(planned)
    assert not session.stats.claims_refused
    assert auto.planner.policy.name == "default"
    assert sheds_by_hints({SHEDS_BY_HINTS: True})
    assert not sheds_by_hints({SHEDS_BY_HINTS: "yes"})  # only a JSON true counts


async def test_auto_holds_where_holds_ride_on_the_calls(tmp_path):
    """Where the backend sheds holds by their hints and takes claims riding on its requests
    (vLLM's gateway), ``auto`` plans ``held``: each call carries its claim on ``@sequence``
    (accepted, on the prefix the answer names), the claim it supersedes rides away with the
    next call (ended ``superseded``, confirmed expired), or goes with it once the answer says
    holding it saves nothing (``saves_less``), the session's end releases the last; no claim
    goes through the claims API on its own."""
    backend = _Shedding(rides=True)
    try:
        session, planned = await _three_calls(backend, tmp_path)
        routes = (await backend.http_client().get("/v1/stats")).json()["gateway"]["calls"]
    finally:
        await backend.aclose()
    assert session.planner.policy.name == "held"
    assert [line["prefix_id"] for line in planned] == ["@sequence"] * 3
    assert {line["mode"] for line in planned} == {"demotable"}
    assert session.stats.claims_accepted == 3
    assert not any(route == "POST /v1/claims" for route in routes), routes
    lines = [json.loads(line) for line in session.log_path.read_text().splitlines()]  # type: ignore[union-attr]
    ended = [(d["reason"], d["state"]) for d in lines if d["event"] == "claim_ended"]
    # the first call's claim went out before anything was known of the agent; its answer
    # (no tool asked, nothing learned to follow) says the prefix saves nothing held: let go
    assert sorted(ended) == [
        ("saves_less", "expired"),
        ("session_end", "expired"),
        ("superseded", "expired"),
    ]
    held = {d["claim_id"]: d["prefix_id"] for d in lines if d["event"] == "claim_ended"}
    calls = [d for d in lines if d["event"] == "llm_call"]
    assert len(set(held.values())) == 3  # each on the sequence its own call left cached
    assert len(calls) == 3


async def test_held_claims_follow_the_lowering_not_the_capability(tmp_path):
    """The same descriptor with ``demotable`` stated ``rejected``: fail closed, no claim is
    submitted ``demotable``; each is refused locally and relaxed to a mode the backend honours."""
    backend = _Shedding(honoured=False)
    try:
        session, planned = await _three_calls(backend, tmp_path, planner="held")
    finally:
        await backend.aclose()
    assert planned
    assert "demotable" not in {line["mode"] for line in planned}
    assert session.stats.claims_refused >= 1


class _Pool(_Shedding):
    """``_Shedding(rides=True)`` whose answers call the ``search`` tool (so the wait until
    the next call is the tool's, predicted) and report the pool's churn as vLLM's connector
    does (``agentclaims.pool``: ``survival_s`` from its KV events), a figure the test sets."""

    def __init__(self, pool: dict[str, object]) -> None:
        super().__init__(rides=True, script=lambda request: Reply.tool("search"))
        self.pool = pool
        serve = self.kv.serve

        async def reporting(request):  # type: ignore[no-untyped-def]
            return dataclasses.replace(await serve(request), pool=dict(self.pool))

        self.kv.serve = reporting  # type: ignore[method-assign]


QUIET = {
    "free_blocks": 400,
    "evicted_blocks": 0,
    "evicted_per_s": 0.0,
    "survival_s": None,
    "window_s": 30.0,
}
CHURNING = {"free_blocks": 0, "evicted_blocks": 900, "evicted_per_s": 40.0, "survival_s": 0.0}


async def test_no_claim_where_the_pool_keeps_the_prefix_and_none_made_on_its_own(tmp_path):
    """On a pool that evicts nothing (its answers say so), ``auto`` holds the first call's
    prefix (nothing known yet), and keeps it through the first wait for a tool whose waits it
    has not seen (its prior is no wait the agent knows: fail closed). Then it claims nothing:
    the next calls carry no claim, none is made on its own after them (no ``POST
    /v1/claims``: on vLLM an engine request), and the first claim goes with the next call
    (superseded). On a churning pool every call carries its claim. Each ``llm_call``
    line carries the figures its answer gave."""
    quiet = _Pool(QUIET)
    churning = _Pool(CHURNING)
    try:
        kept, kept_plans = await _three_calls(quiet, tmp_path / "quiet")
        quiet_routes = (await quiet.http_client().get("/v1/stats")).json()["gateway"]["calls"]
        held, held_plans = await _three_calls(churning, tmp_path / "churning")
    finally:
        await quiet.aclose()
        await churning.aclose()
    assert kept.planner.policy.name == "held"
    assert kept.stats.claims_accepted == 1  # the first call's, before any answer
    assert len(kept_plans) == 1
    assert not any(route == "POST /v1/claims" for route in quiet_routes), quiet_routes
    assert kept.workflow.pool_survival_s == 30.0  # the quiet window vouches for no longer
    lines = [json.loads(x) for x in kept.log_path.read_text().splitlines()]  # type: ignore[union-attr]
    assert [d["reason"] for d in lines if d["event"] == "claim_ended"] == ["superseded"]
    assert [d["pool"] for d in lines if d["event"] == "llm_call"] == [QUIET] * 3
    assert held.stats.claims_accepted == 3
    assert len(held_plans) == 3  # each call carried its claim
    assert held.workflow.pool_survival_s == 0.0


class _Flipping(ClaimPlanner):
    """Weighs the claim a call would carry as saving less than it costs, and the same prefix
    once answered as worth holding: the flip a learned cost per block that moves between two
    calls gives (on the embedded engine, fitted from noise)."""

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        if ctx.prefix_id == SEQUENCE_OBJECT:
            return ClaimPlan(None, reason=SAVES_LESS, saving_s=0.0, cost_s=0.001)
        return ClaimPlan(ProtectionMode.DEMOTABLE, 30.0, "likely reuse", 0.01, 0.001)


async def test_a_call_that_declined_its_claim_makes_none_on_its_own_after_the_tools_expected(
    tmp_path,
):
    """A call carries no claim because, weighed before it, the claim saves less than it
    costs. Its answer calls the tool it was planned with (``search``, as the last answer did):
    the choice stands, and no claim goes on its own after it (a request of its own). The first
    call was planned knowing no tool: its answer calling ``search`` is news, and the claim the
    answer calls for goes on its own, once."""
    backend = _Pool(QUIET)
    try:
        session, planned = await _three_calls(backend, tmp_path, planner=_Flipping())
        routes = (await backend.http_client().get("/v1/stats")).json()["gateway"]["calls"]
    finally:
        await backend.aclose()
    assert routes.get("POST /v1/claims") == 1, routes
    assert session.stats.claims_accepted == 1
    [alone] = planned  # the claim after the first call, on the prefix its answer named
    assert alone["prefix_id"] != SEQUENCE_OBJECT


def test_a_declined_claim_stands_only_for_the_tools_it_was_weighed_with() -> None:
    """``Riding.declined_for``: the pool keeping the prefix stands whatever the answer calls;
    a claim weighed as saving less stands for the same tools, in any order, and not for
    others; a call that carried its claim declined nothing."""
    kept = Riding("vllm", declined=POOL_KEEPS, tools=("search",))
    weighed = Riding("vllm", declined=SAVES_LESS, tools=("search", "read"))
    assert kept.declined_for(["write"])
    assert weighed.declined_for(["read", "search"])
    assert not weighed.declined_for(["search"])
    assert not weighed.declined_for([])
    assert not Riding("vllm", tools=("search",)).declined_for(["search"])
