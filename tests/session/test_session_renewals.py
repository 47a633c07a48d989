"""A held pin is renewed on its own only where that buys something: its tool is now predicted
to take longer than its TTL's margin covers, not a hair longer. Real engine, real gateway
in-process, fake time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from planners import Always
from test_session_reactions import FakeTime, ask, make_backend

from agentclaims.contract import ClaimId, PrefixId, ProtectionMode
from agentclaims.graph import ToolTimeModel
from agentclaims.planner import ClaimPlan, PlannerPolicy, PrefixContext
from agentclaims.session import ClaimedSession
from agentclaims.session.claims import PIN_MODES, PIN_RIDE_S, release_at_once
from agentclaims.session.held import HeldClaim

PROMPT = [{"role": "user", "content": "q " * 100}]
TOOL_S = 1.0
"""How long the tool took, the once the session saw it run."""


@pytest.mark.parametrize(("held_ttl_s", "renewed"), [(1.0, True), (1.4, False), (1.5, False)])
async def test_a_pin_is_renewed_at_a_tools_start_only_past_the_slack(
    tmp_path: Path, held_ttl_s: float, renewed: bool
) -> None:
    """The tool is predicted to take 1 s, so it wants a 1.5 s pin (``ttl_margin``). A pin held
    for 1 s is renewed to that before the tool runs (a request of its own); one held for
    1.4 s already covers the prediction 1.4 times over, and is not (``renew_slack``, 20%)."""
    t = FakeTime()
    backend = make_backend(t)
    planner = Always(ProtectionMode.HARD_PROTECTED, held_ttl_s)
    times = ToolTimeModel()
    times.observe("search", TOOL_S)
    async with ClaimedSession(
        backend,
        planner=planner,
        tool_times=times,
        sleep=t.sleep,
        clock=t.clock_s,
        log_dir=tmp_path,
    ) as session:
        with session.node("agent"):
            await ask(backend, PROMPT)
            await session.settle()
            [held] = session.claims.values()
            assert held.plan.ttl_s == held_ttl_s
            async with session.tool_call("search"):
                pass
        want = TOOL_S * planner.policy.ttl_margin
        assert session.stats.claims_renewed == (1 if renewed else 0)
        assert held.plan.ttl_s == (want if renewed else held_ttl_s)
        view = await backend.get_claim(held.claim_id, session.owner_scope)
        # the engine holds it as long as the session says it does (its clock stood still)
        assert view.expires_at_ns == t.ns + round(held.plan.ttl_s * 1e9)
    await backend.aclose()


@given(
    held=st.floats(min_value=0.01, max_value=300.0),
    wanted=st.floats(min_value=0.01, max_value=300.0),
    slack=st.floats(min_value=0.0, max_value=2.0),
)
def test_a_renewal_always_leaves_the_wait_covered(held: float, wanted: float, slack: float) -> None:
    """Whatever the slack: a pin not renewed still covers the wanted TTL's wait at least
    ``ttl_margin / (1 + slack)`` times, and one renewed was short of ``wanted`` by more than
    the slack. Without a TTL on either side nothing is renewed."""
    policy = PlannerPolicy(renew_slack=slack)
    if policy.needs_renewal(held, wanted):
        assert wanted > held * (1 + slack)
    else:
        assert held * (1 + slack) >= wanted
    assert not policy.needs_renewal(None, wanted)
    assert not policy.needs_renewal(held, None)


class PinThenNone(Always):
    """Pins the prefix its first plan names (the call carries the pin); says no claim after."""

    plans: list[PrefixContext]

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        self.plans.append(ctx)
        if len(self.plans) == 1:
            return super().plan(ctx)
        return ClaimPlan(None, reason="reuse unlikely")


async def test_a_pin_let_go_where_the_pool_has_room_costs_no_request(tmp_path: Path) -> None:
    """The reply says the pin carried by its call is no longer wanted while it has 5 s to run.
    The pool has room for it beside the agent's context, so its hold displaces nothing: no
    release goes on its own; it rides on the agent's next call, which the engine then ends."""
    t = FakeTime()
    backend = make_backend(t)
    planner = PinThenNone(ProtectionMode.HARD_PROTECTED, 5.0)
    planner.plans = []
    async with ClaimedSession(
        backend, planner=planner, sleep=t.sleep, clock=t.clock_s, log_dir=tmp_path
    ) as session:
        with session.node("agent"):
            before = await _claim_requests(backend)
            await ask(backend, PROMPT)
            await session.settle()
            assert session.stats.claims_accepted == 1
            assert planner.plans[-1].pool_room is True
            assert session.claims == {}  # let go
            assert await _claim_requests(backend) == before  # and no request of its own
            [pin] = backend.engine.claims_of(session.owner_scope)
            assert pin.state.value == "materialized"  # held still, until the next call says
            await ask(backend, [{"role": "user", "content": "next"}])
            await session.settle()
            assert await _claim_requests(backend) == before
            [done] = backend.engine.claims_of(session.owner_scope)
            assert (done.claim_id, done.end_reason) == (pin.claim_id, "released")
    await backend.aclose()


async def _claim_requests(backend: Any) -> int:
    """Requests of the claims API and event reads the gateway took (completions aside)."""
    calls = ((await backend.metrics()).get("gateway") or {}).get("calls") or {}
    return sum(n for k, n in calls.items() if "/v1/claims" in k or "/v1/events" in k)


@given(
    mode=st.sampled_from(list(ProtectionMode)),
    ttl=st.one_of(st.none(), st.floats(min_value=0.0, max_value=600.0)),
    age=st.floats(min_value=0.0, max_value=600.0),
    room=st.sampled_from([True, False, None]),
)
def test_a_pin_goes_on_its_own_only_where_it_would_hold_blocks_needed(
    mode: ProtectionMode, ttl: float | None, age: float, room: bool | None
) -> None:
    """A soft hold never needs a release of its own; a pin does while its TTL has more than
    ``PIN_RIDE_S`` to run, unless the pool has room for it (an unknown room is no room)."""
    plan = ClaimPlan(mode, ttl)
    held = HeldClaim(ClaimId("c"), "n", PrefixId("pfx-0123456789abcdef-4"), plan, "b", 100.0)
    alone = release_at_once(held, 100.0 + age, room=room)
    runs_on = ttl is None or ttl - age > PIN_RIDE_S
    assert alone == (mode in PIN_MODES and room is not True and runs_on)
