"""The planner's documented mapping from reuse context to claim, row by row."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.contract import ProtectionMode as M
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.planner import ClaimPlan, ClaimPlanner, PlannerPolicy, PrefixContext, relax_mode


def ctx(**kw: object) -> PrefixContext:
    base: dict[str, object] = {"prefix_id": "pfx-1", "footprint_blocks": 10, "ste": 1.0}
    base.update(kw)
    return PrefixContext(**base)  # type: ignore[arg-type]


planner = ClaimPlanner()


def test_unlikely_or_unreachable_reuse_gets_no_claim():
    """Low probability, infinite STE or a tiny prefix: no claim."""
    assert planner.plan(ctx(reuse_probability=0.01)).mode is None
    assert planner.plan(ctx(reuse_probability=0.9, ste=math.inf)).mode is None
    assert planner.plan(ctx(reuse_probability=0.9, footprint_blocks=0)).mode is None


def test_waiting_on_the_human_gets_no_claim():
    """A turn handed back to the human has no predictable reuse: plain LRU decides."""
    assert planner.plan(ctx(reuse_probability=0.9, waiting_on="human")).mode is None


def test_zero_cost_benefit_ttl_is_best_effort():
    """Continuum's tau* = 0 means reloading is cheaper than pinning."""
    plan = planner.plan(
        ctx(reuse_probability=1.0, waiting_on="tool", expected_wait_s=1.0, ttl_s=0.0)
    )
    assert plan.mode is M.BEST_EFFORT


def test_near_certain_short_wait_is_hard_with_a_ttl():
    """p >= 0.9, STE <= 1 and a known short wait: hard_protected, TTL = wait x 1.5."""
    plan = planner.plan(ctx(reuse_probability=1.0, waiting_on="tool", expected_wait_s=2.0))
    assert plan == ClaimPlan(M.HARD_PROTECTED, 3.0, "near and certain reuse")


def test_likely_reuse_is_expiring_with_the_larger_ttl():
    """p >= 0.5: expiring, TTL = max(tau*, wait x margin), else the default TTL."""
    plan = planner.plan(ctx(reuse_probability=0.6, ste=2, expected_wait_s=2.0, ttl_s=5.0))
    assert (plan.mode, plan.ttl_s) == (M.EXPIRING, 5.0)
    plan = planner.plan(ctx(reuse_probability=0.6, ste=2))
    assert (plan.mode, plan.ttl_s) == (M.EXPIRING, PlannerPolicy().default_ttl_s)


def test_possible_reuse_is_best_effort():
    """Below the expiring threshold, with soft claims off by default: best_effort."""
    assert planner.plan(ctx(reuse_probability=0.4, ste=2)).mode is M.BEST_EFFORT


def test_memory_pressure_turns_pins_into_demotable_priority():
    """Under pressure nothing is pinned: likely reuse is demotable, the rest best_effort."""
    hot = ctx(reuse_probability=1.0, waiting_on="tool", expected_wait_s=1.0, pressure=0.5)
    assert planner.plan(hot).mode is M.DEMOTABLE
    assert planner.plan(ctx(reuse_probability=0.3, pressure=0.5)).mode is M.BEST_EFFORT


def test_presets_and_field_changes():
    """Named presets exist, unknown ones and unknown fields are typed errors."""
    assert ClaimPlanner(PlannerPolicy.named("off")).plan(ctx(reuse_probability=1.0)).mode is None
    conservative = ClaimPlanner(PlannerPolicy.named("conservative"))
    assert conservative.plan(ctx(reuse_probability=0.9, ste=1)).mode is M.SOFT_PRIORITY
    assert PlannerPolicy().with_(hard_min_p=0.5).hard_min_p == 0.5
    priority = ClaimPlanner(PlannerPolicy.named("priority"))
    hot = ctx(reuse_probability=1.0, waiting_on="tool", expected_wait_s=1.0)
    assert priority.plan(hot).mode is M.DEMOTABLE
    with pytest.raises(UnknownNameError, match="policy"):
        PlannerPolicy.named("reckless")
    with pytest.raises(UnknownNameError, match="policy field"):
        PlannerPolicy().with_(nonsense=1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reuse_probability", 1.5),
        ("ste", -1.0),
        ("expected_wait_s", -2.0),
        ("pressure", 2.0),
        ("prefix_id", ""),
    ],
)
def test_bad_context_values_name_the_field(field, value):
    """Out-of-range context values raise UsageError naming the field."""
    with pytest.raises(UsageError, match=field):
        ctx(**{field: value})


def test_bad_policy_values_name_the_field():
    """Probabilities outside [0, 1] and negative durations are rejected."""
    with pytest.raises(UsageError, match="hard_min_p"):
        PlannerPolicy(hard_min_p=1.5)
    with pytest.raises(UsageError, match="ttl_margin"):
        PlannerPolicy(ttl_margin=-1)


def test_relax_ladder_skips_soft_priority():
    """hard -> expiring -> best_effort -> no claim; soft, demotable, offloadable -> best_effort."""
    assert relax_mode(M.HARD_PROTECTED) is M.EXPIRING
    assert relax_mode(M.EXPIRING) is M.BEST_EFFORT
    assert relax_mode(M.BEST_EFFORT) is None
    for mode in (M.SOFT_PRIORITY, M.DEMOTABLE, M.OFFLOADABLE):
        assert relax_mode(mode) is M.BEST_EFFORT


def test_revise_releases_relaxes_renews_and_keeps():
    """revise: release when reuse vanished, relax when weaker, renew near the TTL's end."""
    held = ClaimPlan(M.HARD_PROTECTED, 10.0, "")
    assert planner.revise(ctx(reuse_probability=0.0), held, None) == "release"
    assert planner.revise(ctx(reuse_probability=0.4, ste=2), held, None) == "relax"
    certain = ctx(reuse_probability=1.0, waiting_on="tool", expected_wait_s=1.0)
    assert planner.revise(certain, held, 1.0) == "renew"
    assert planner.revise(certain, held, 9.0) == "keep"


CONTEXTS = {
    "p": st.floats(0, 1),
    "ste": st.integers(0, 6),
    "wait": st.one_of(st.none(), st.floats(0, 100)),
    "pressure": st.floats(0, 1),
    "waiting": st.sampled_from(["tool", "subagent", "human", "llm", "unknown"]),
}
"""What a prefix's context may be, for the mapping's properties."""


def fields_of(
    p: float, ste: int, wait: float | None, pressure: float, waiting: str, **more: object
) -> dict[str, object]:
    """``PrefixContext`` fields from ``CONTEXTS``' draws (and ``more``)."""
    return {
        "reuse_probability": p,
        "ste": float(ste),
        "expected_wait_s": wait,
        "pressure": pressure,
        "waiting_on": waiting,
        **more,
    }


strength = {
    M.BEST_EFFORT: 0,
    M.DEMOTABLE: 1,
    M.SOFT_PRIORITY: 2,
    M.EXPIRING: 3,
    M.HARD_PROTECTED: 4,
}


@given(**CONTEXTS)
def test_plans_are_monotone_in_probability_and_never_pin_under_pressure(
    p, ste, wait, pressure, waiting
):
    """A likelier reuse never gets a weaker claim; under pressure nothing is pinned; pins
    always carry a TTL within the policy's bounds."""
    pol = PlannerPolicy()
    base = {"ste": float(ste), "expected_wait_s": wait, "pressure": pressure, "waiting_on": waiting}
    lo = planner.plan(ctx(reuse_probability=p * 0.5, **base))
    hi = planner.plan(ctx(reuse_probability=p, **base))
    rank = lambda plan: -1 if plan.mode is None else strength[plan.mode]  # noqa: E731
    assert rank(hi) >= rank(lo)
    if pressure > pol.pin_max_pressure:
        assert hi.mode not in (M.HARD_PROTECTED, M.EXPIRING)
    if hi.mode in (M.HARD_PROTECTED, M.EXPIRING):
        assert hi.ttl_s is not None
        assert pol.min_ttl_s <= hi.ttl_s <= pol.max_ttl_s


@given(mode=st.sampled_from(list(M)), soft=st.sampled_from([M.BEST_EFFORT, M.DEMOTABLE]))
def test_the_relax_ladder_only_weakens_ends_and_never_goes_soft_priority(mode, soft):
    """Any mode relaxed again and again: each rung weaker than the last, never soft_priority,
    no claim within four rungs; with ``soft=demotable`` expiring's next rung is demotable (held
    on a backend that sheds by hints) before best_effort."""
    rungs = []
    current: M | None = mode
    while current is not None:
        nxt = relax_mode(current, soft)
        if nxt is not None:
            assert strength[nxt] < strength.get(current, 5), (current, nxt)
            assert nxt is not M.SOFT_PRIORITY
        rungs.append(nxt)
        current = nxt
        assert len(rungs) <= 4
    if soft is M.DEMOTABLE and mode in (M.HARD_PROTECTED, M.EXPIRING):
        assert M.DEMOTABLE in rungs
    if soft is M.BEST_EFFORT:
        assert M.DEMOTABLE not in rungs


held = ClaimPlanner(PlannerPolicy.named("held"))


@given(**CONTEXTS)
def test_held_plans_hold_demotable_where_ranked_gives_best_effort(p, ste, wait, pressure, waiting):
    """The ``held`` preset is the ``ranked`` mapping with holds: wherever ``ranked`` plans
    ``best_effort`` it plans ``demotable`` (or nothing, when reuse is unlikely), and it pins
    exactly where ``ranked-hard`` does."""
    c = ctx(
        reuse_probability=p,
        ste=float(ste),
        expected_wait_s=wait,
        pressure=pressure,
        waiting_on=waiting,
    )
    mine = held.plan(c)
    theirs = ClaimPlanner(PlannerPolicy.named("ranked-hard")).plan(c)
    if theirs.mode is M.BEST_EFFORT:
        assert mine.mode in (M.DEMOTABLE, None)
        if mine.mode is None:
            assert waiting != "human"
            assert p < held.policy.best_effort_min_p
    else:
        assert mine == theirs


def test_a_soft_mode_that_is_no_soft_claim_is_refused():
    with pytest.raises(UsageError, match="soft_mode"):
        PlannerPolicy(soft_mode=M.HARD_PROTECTED)
    assert PlannerPolicy.named("held").soft_mode is M.DEMOTABLE


@given(
    **CONTEXTS,
    preset=st.sampled_from(["default", "held", "ranked", "aggressive"]),
    survival=st.one_of(st.none(), st.floats(0, 1e4), st.just(math.inf)),
    admission=st.floats(0, 100),
    learned=st.booleans(),
)
def test_no_claim_only_where_the_engine_says_its_pool_keeps_the_prefix(
    p, ste, wait, pressure, waiting, preset, survival, admission, learned
):
    """Property: a prefix is left unclaimed for the pool's sake exactly where the engine's
    figure says an unheld block survives at least ``pool_keeps_factor`` times the predicted
    wait and the next call's way to the prefix (``admission_s``), and that wait was learned;
    unknown survival, an unknown wait or one from a prior alone plans as if the engine had
    said nothing."""
    planner_ = ClaimPlanner(PlannerPolicy.named(preset))
    base = fields_of(p, ste, wait, pressure, waiting, wait_learned=learned, admission_s=admission)
    said = planner_.plan(ctx(pool_survival_s=survival, **base))
    silent = planner_.plan(ctx(**base))
    factor = planner_.policy.pool_keeps_factor
    keeps = (
        survival is not None
        and wait is not None
        and learned
        and survival >= factor * (wait + admission)
    )
    if keeps:
        assert said.mode is None
        assert "pool keeps" in said.reason
    else:
        assert said == silent


def test_a_pool_that_evicts_nothing_needs_no_claim_and_a_churning_one_does() -> None:
    held_ = ClaimPlanner(PlannerPolicy.named("held"))
    base = {"reuse_probability": 1.0, "waiting_on": "tool", "expected_wait_s": 0.5}
    assert held_.plan(ctx(pool_survival_s=math.inf, **base)).mode is None
    assert held_.plan(ctx(pool_survival_s=1.2, **base)).mode is not None  # < 4 x 0.5 s
    # a queued next call reaches its prefix late: the pool must keep it through that too
    assert held_.plan(ctx(pool_survival_s=3.0, **base)).mode is None
    assert held_.plan(ctx(pool_survival_s=3.0, admission_s=1.0, **base)).mode is not None
    with pytest.raises(UsageError, match="admission_s"):
        ctx(admission_s=-1.0)
    with pytest.raises(UsageError, match="pool_survival_s"):
        ctx(pool_survival_s=-1.0)
    with pytest.raises(UsageError, match="pool_keeps_factor"):
        PlannerPolicy(pool_keeps_factor=-1)


def test_an_infinite_pool_keeps_factor_always_claims_even_on_a_pool_that_evicts_nothing() -> None:
    always = ClaimPlanner(PlannerPolicy.named("held").with_(pool_keeps_factor=math.inf))
    base = {"reuse_probability": 1.0, "waiting_on": "tool"}
    for wait in (0.0, 0.5):
        plan = always.plan(ctx(pool_survival_s=math.inf, expected_wait_s=wait, **base))
        assert plan.mode is not None, (wait, plan)


@given(
    **CONTEXTS,
    preset=st.sampled_from(["default", "held", "ranked-hard", "aggressive", "conservative"]),
    survival=st.one_of(st.none(), st.floats(0, 1e4), st.just(math.inf)),
)
def test_a_wait_from_a_prior_alone_grounds_no_pin(
    p, ste, wait, pressure, waiting, preset, survival
):
    """Property: a wait the agent has not seen (``wait_learned=False``: a prior alone) never
    yields ``hard_protected``, and never lets the pool-keeps rule skip a claim; learned, the
    same wait plans the same but where it grounds a pin or the pool keeps the prefix."""
    planner_ = ClaimPlanner(PlannerPolicy.named(preset))
    base = fields_of(p, ste, wait, pressure, waiting, pool_survival_s=survival)
    prior = planner_.plan(ctx(wait_learned=False, **base))
    assert prior.mode is not M.HARD_PROTECTED
    assert "pool keeps" not in prior.reason
    learned = planner_.plan(ctx(**base))
    if learned.mode is not M.HARD_PROTECTED and "pool keeps" not in learned.reason:
        assert learned == prior
