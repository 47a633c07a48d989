"""The planner decides by time: a claim is made only where the seconds it is expected to save
exceed the seconds it is expected to cost, and every plan says both."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from agentclaims.contract import ProtectionMode as M
from agentclaims.planner import (
    HOLDS_KEPT_LEAST,
    SAVES_LESS,
    ClaimPlanner,
    PlannerPolicy,
    PrefixContext,
)

held = ClaimPlanner(PlannerPolicy.named("held"))
default = ClaimPlanner()


def tool_wait(**kw: object) -> PrefixContext:
    base: dict[str, object] = {
        "prefix_id": "pfx-1",
        "footprint_blocks": 30,
        "ste": 1.0,
        "reuse_probability": 1.0,
        "waiting_on": "tool",
        "expected_wait_s": 2.0,
        "reload_s": 0.3,
    }
    base.update(kw)
    return PrefixContext(**base)  # type: ignore[arg-type]


def test_a_prefix_costly_to_recompute_in_a_churning_pool_is_claimed_with_its_figures():
    """30 blocks that take 0.3 s to recompute, a pool whose blocks survive 1 s against a 2 s
    wait: it would very likely be gone, so the claim saves about 0.26 s and costs what it
    displaces (30 blocks x 10 ms x 0.2) and its overhead."""
    plan = default.plan(tool_wait(pool_survival_s=1.0, evicted_per_s=100.0))
    assert plan.mode is M.HARD_PROTECTED
    gone = 1 - math.exp(-2.0)
    assert plan.saving_s == round(0.3 * gone, 6)
    assert plan.cost_s == round(0.0001 + 30 * 0.01 * 0.2, 6)
    assert plan.to_dict()["saving_s"] == plan.saving_s


def test_a_claim_that_saves_less_than_it_costs_is_not_made():
    """A prefix the pool would likely keep anyway (blocks survive 7 s, a 2 s wait) whose
    reuse is uncertain saves less than the others' blocks the hold displaces are worth: no
    claim, and the plan says what it weighed."""
    plan = held.plan(
        tool_wait(pool_survival_s=7.0, evicted_per_s=50.0, waiting_on="llm", reuse_probability=0.7)
    )
    assert plan.mode is None
    assert plan.reason == SAVES_LESS
    assert plan.saving_s is not None
    assert plan.cost_s is not None
    assert plan.saving_s <= plan.cost_s


def test_a_hint_displaces_nothing():
    """best_effort keeps no block from anyone: it costs only its overhead."""
    planner = ClaimPlanner(PlannerPolicy.named("ranked"))
    plan = planner.plan(tool_wait(reuse_probability=0.5, waiting_on="llm", expected_wait_s=None))
    assert plan.mode is M.BEST_EFFORT
    assert plan.cost_s == 0.0001


def test_without_a_recompute_cost_the_mapping_alone_decides():
    """reload_s unknown: the plan is not weighed (no figures), as before."""
    plan = default.plan(tool_wait(reload_s=None))
    assert plan.mode is M.HARD_PROTECTED
    assert plan.saving_s is None
    assert plan.cost_s is None
    assert "saving_s" not in plan.to_dict()


def test_continuums_zero_ttl_gives_way_to_the_time_weighing():
    """Continuum's tau* = 0 (a pin's seconds priced as lost) demotes a claim to a hint only
    where the plan is not weighed by time: where it is, the weighing of what the hold saves
    against what it displaces decides, and its TTL is the wait's."""
    wait = {"waiting_on": "llm", "ste": 2.0, "expected_wait_s": 2.0, "ttl_s": 0.0}
    weighed = default.plan(tool_wait(pool_survival_s=1.0, evicted_per_s=100.0, **wait))
    assert weighed.mode is M.EXPIRING
    assert weighed.ttl_s == 2.0 * PlannerPolicy().ttl_margin
    assert weighed.saving_s is not None
    assert weighed.cost_s is not None
    assert weighed.saving_s > weighed.cost_s
    unweighed = default.plan(tool_wait(reload_s=None, **wait))
    assert unweighed.mode is M.BEST_EFFORT
    assert unweighed.reason == "pinning costs more than reloading"
    off = ClaimPlanner(PlannerPolicy().with_(decide_by_time=False))
    assert off.plan(tool_wait(**wait)).mode is M.BEST_EFFORT


def test_decide_by_time_off_keeps_the_mapping():
    planner = ClaimPlanner(PlannerPolicy().with_(decide_by_time=False))
    plan = planner.plan(tool_wait(pool_survival_s=3.0, evicted_per_s=50.0, expected_wait_s=1.0))
    assert plan.mode is M.HARD_PROTECTED


def test_a_pin_needs_room_in_the_pool():
    """Sure of a short wait, but the pool has no room for the pin: not hard, expiring."""
    assert default.plan(tool_wait(pool_room=True)).mode is M.HARD_PROTECTED
    assert default.plan(tool_wait(pool_room=False)).mode is M.EXPIRING
    assert held.plan(tool_wait(pool_room=False)).mode is M.DEMOTABLE


@given(
    p=st.floats(0.0, 1.0),
    blocks=st.integers(0, 400),
    reload_s=st.floats(0.0, 5.0),
    wait=st.one_of(st.none(), st.floats(0.0, 60.0)),
    survival=st.one_of(st.none(), st.floats(0.0, 600.0), st.just(math.inf)),
    rate=st.one_of(st.none(), st.floats(0.0, 500.0)),
    waiting=st.sampled_from(["tool", "llm", "subagent", "unknown"]),
    preset=st.sampled_from(["default", "held", "ranked", "aggressive", "priority"]),
)
def test_no_claim_is_planned_that_saves_no_more_than_it_costs(
    p, blocks, reload_s, wait, survival, rate, waiting, preset
):
    """Whatever the context, a plan that claims carries a saving above its cost, and the
    saving never exceeds what recomputing the whole prefix would take."""
    planner = ClaimPlanner(PlannerPolicy.named(preset))
    plan = planner.plan(
        PrefixContext(
            "pfx",
            blocks,
            ste=1.0,
            reuse_probability=p,
            waiting_on=waiting,
            expected_wait_s=wait,
            pool_survival_s=survival,
            evicted_per_s=rate,
            reload_s=reload_s,
        )
    )
    if plan.mode is not None:
        assert plan.saving_s is not None
        assert plan.cost_s is not None
        assert plan.saving_s > plan.cost_s
    if plan.saving_s is not None:
        assert 0.0 <= plan.saving_s <= reload_s + 1e-6


def test_the_engines_regretted_evictions_price_what_a_hold_displaces():
    """Where the engine says how often its evictions were regretted (``displaced_reuse_p``,
    from its answers), each displaced block is priced at that share, not the policy's prior:
    in a pool whose evicted blocks all come back, a hold that would keep a prefix likely to
    survive anyway costs more than it saves."""
    churning = {"pool_survival_s": 4.0, "evicted_per_s": 50.0}
    prior = default.plan(tool_wait(**churning))
    assert prior.cost_s == round(0.0001 + 30 * 0.01 * 0.2, 6)
    learned = default.plan(tool_wait(**churning, displaced_reuse_p=1.0))
    assert learned.cost_s == round(0.0001 + 30 * 0.01 * 1.0, 6)
    assert prior.mode is not None
    assert learned.mode is None
    assert learned.reason == SAVES_LESS
    none_back = default.plan(tool_wait(**churning, displaced_reuse_p=0.0))
    assert none_back.cost_s == 0.0001


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_hold_costs_more_the_more_of_its_displaced_blocks_come_back(p: float, q: float):
    """The cost of a hold never falls as the engine's regretted share rises."""
    low, high = sorted((p, q))
    ctx = {"pool_survival_s": 1.0, "evicted_per_s": 100.0}
    cheap = default.value(tool_wait(**ctx, displaced_reuse_p=low), M.HARD_PROTECTED)
    dear = default.value(tool_wait(**ctx, displaced_reuse_p=high), M.HARD_PROTECTED)
    assert cheap is not None
    assert dear is not None
    assert cheap[1] <= dear[1]


def test_a_regretted_share_outside_zero_and_one_is_refused():
    import pytest

    from agentclaims.errors import UsageError

    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(UsageError, match="displaced_reuse_p"):
            tool_wait(displaced_reuse_p=bad)


def test_a_soft_hold_the_engine_sheds_saves_nothing():
    """Where the engine sheds nearly every soft hold of the process for memory before its
    agent comes back (``hold_kept_p`` under ``HOLDS_KEPT_LEAST``), a ``demotable`` hold saves
    nothing and is not made (``SAVES_LESS``); where it keeps a fair share, the hold is weighed
    as before; a pin is not shed, and is weighed as before."""
    churning = {"pool_survival_s": 1.0, "evicted_per_s": 100.0, "displaced_reuse_p": 0.0}
    kept = default.value(tool_wait(**churning), M.DEMOTABLE)
    some = default.value(tool_wait(**churning, hold_kept_p=HOLDS_KEPT_LEAST), M.DEMOTABLE)
    none = default.value(tool_wait(**churning, hold_kept_p=0.05), M.DEMOTABLE)
    assert kept is not None
    assert kept[0] > 0
    assert some == kept
    assert none == (0.0, kept[1])
    assert default.value(tool_wait(**churning, hold_kept_p=0.0), M.HARD_PROTECTED) == (
        default.value(tool_wait(**churning), M.HARD_PROTECTED)
    )
    shed = held.plan(tool_wait(**churning, hold_kept_p=0.0, waiting_on="llm"))
    assert shed.mode is None
    assert shed.reason == SAVES_LESS
    assert held.plan(tool_wait(**churning, waiting_on="llm", hold_kept_p=0.5)).mode is M.DEMOTABLE


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.sampled_from(list(M)))
def test_a_hold_saves_no_more_the_more_the_engine_sheds(p: float, q: float, mode: M):
    """The saving of a claim never rises as the share of soft holds kept falls, in any mode;
    its cost does not move."""
    low, high = sorted((p, q))
    ctx = {"pool_survival_s": 1.0, "evicted_per_s": 100.0}
    shed = default.value(tool_wait(**ctx, hold_kept_p=low), mode)
    kept = default.value(tool_wait(**ctx, hold_kept_p=high), mode)
    assert shed is not None
    assert kept is not None
    assert shed[0] <= kept[0]
    assert shed[1] == kept[1]


def test_a_kept_share_outside_zero_and_one_is_refused():
    import pytest

    from agentclaims.errors import UsageError

    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(UsageError, match="hold_kept_p"):
            tool_wait(hold_kept_p=bad)
