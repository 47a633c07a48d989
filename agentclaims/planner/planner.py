"""The claim planner: from how soon and how surely a prefix is reused, to a claim.

Inputs per prefix (``PrefixContext``): steps-to-execution of its nearest user (KVFlow's STE),
the probability that it is reused within the planning horizon, what the workflow is waiting on
(a tool, a sub-agent, the human, another LLM call), the predicted wait and a cost-benefit TTL
(Continuum's tau*), and the prefix's size. Output (``ClaimPlan``): no claim, ``best_effort``,
``soft_priority``, ``expiring`` with a TTL, or ``hard_protected`` (always with a TTL too, so a
crashed client never pins memory forever).

The default mapping, in order (every threshold lives in ``PlannerPolicy``)::

    footprint < min_blocks, p < best_effort_min_p, STE inf   -> no claim
    the pool keeps it unheld (its KV events: a block freed now
        survives >= pool_keeps_factor x the learned wait)    -> no claim
    waiting on the human                                     -> no claim (plain LRU)
    tau* == 0 (Continuum: pinning costs more than reloading) -> best_effort (unweighed plans)
    pressure > pin_max_pressure (requests being deferred)    -> demotable if p >= expiring_min_p,
                                                                else best_effort
    p >= hard_min_p and STE <= hard_max_ste
        and a learned wait <= hard_max_wait_s                -> hard_protected, ttl = wait x margin
    p >= expiring_min_p                                      -> expiring, ttl = max(tau*, wait x margin)
                                                                (default_ttl_s when neither is known)
    use_soft and p >= soft_min_p and STE <= soft_max_ste     -> soft_priority
    otherwise                                                -> best_effort

The default never issues ``soft_priority``: a soft claim can be lost without a refusal (true
harm), while ``expiring`` turns pressure into a deferral that ends with the TTL.

Which policy a session gets by default (``ClaimedSession(planner="auto")``) depends on its
backend: where the descriptor states ``ranks_by_hints`` (the backend ranks resident blocks by
predicted next use from the claims' reuse hints, e.g. the reference engine with
``NextUsePolicy``), the ``ranked`` preset: soft by default (every prefix ``best_effort`` with its
hint: ranked, never harmed), no pins (``ranked-hard`` adds ``hard_protected`` where the agent is
sure of a short tool wait and the pool has room; measured in the replay it cost hits, so it is
opt-in). On any other backend, the ``default`` mapping above: without a ranking, a
best-effort hint is only a hint, and the pins are what keeps a prefix.

The ``held`` preset is for a backend whose descriptor states ``sheds_by_hints`` (vLLM with the
agentclaims connector: it ranks no unclaimed block, its free queue is LRU, but it holds claimed
blocks and sheds soft holds farthest expected next use first): the ``ranked`` mapping with
``soft_mode=demotable``, so every prefix likely reused is held with its hint instead of only
watched, ``hard_protected`` where the agent is sure of a short tool wait and the pool has room,
and a refused ``expiring`` relaxed to ``demotable``. ``auto`` picks it where claims also ride on the
backend's requests (``claims_ride_on_requests``: a hold then costs no engine request).
``soft_mode`` is what the mapping's ``best_effort`` rows give (``best_effort`` by default).

Every preset claims nothing where the engine says its pool would keep the prefix unheld
through the wait (``PrefixContext.pool_survival_s``: vLLM's connector measures it from the
pool's own KV events), so a pool that does not churn costs the agents no claim work.

**Decided by time.** Where the context says what recomputing the prefix costs
(``PrefixContext.reload_s``: its blocks times the block cost learned from the engine's
answers), every preset weighs, before it claims, the seconds the claim saves against the
seconds it costs (:meth:`ClaimPlanner.value`)::

    saving = p(reuse) x p(gone unheld before the reuse) x reload_s
    cost   = claim_overhead_s + displaced blocks x reload_s per block x displaced_reuse_p

``p(gone)`` is ``1 - exp(-(wait + admission) / survival)`` with the pool's survival time from
its answers (1 where unknown: fail toward keeping); a hold displaces as many of others' blocks
as the pool evicts during the wait, up to its own size (all of them where the eviction rate is
unknown), each of which another call would have reused with ``displaced_reuse_p``: the share
of its evicted blocks the engine stored again lately, as its answers say it
(``PrefixContext.displaced_reuse_p``: vLLM's KV events), else the policy's prior.
A soft hold (``demotable``, ``soft_priority``) saves nothing where the engine sheds nearly
every one it accepts (fewer than ``HOLDS_KEPT_LEAST`` of this process's soft holds kept
lately, ``PrefixContext.hold_kept_p``): a pool whose active work sheds each hold before its
agent comes back has no room for them, and none is made.
A claim that saves no more than it costs is not made (``SAVES_LESS``); every plan carries its
``saving_s`` and ``cost_s`` into the outcome log. A hint alone (``best_effort``) displaces
nothing. Which of the claims worth making the pool has room for is the sessions' shared
``PoolShare``'s decision (capacity).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypeVar

from agentclaims.contract import ProtectionMode
from agentclaims.errors import UnknownNameError, UsageError

T = TypeVar("T")

POOL_KEEPS = "the pool keeps it: its evictions are too slow"
"""The reason of a plan without a claim because the engine's pool keeps the prefix unheld
through the predicted wait (``PlannerPolicy.pool_keeps_factor``)."""

SAVES_LESS = "saves less time than it costs"
"""The reason of a plan without a claim because the seconds it would save (recompute avoided,
times the chance the prefix is otherwise gone) do not exceed what it costs (its overhead and
the others' blocks it displaces): :meth:`ClaimPlanner.value`."""

__all__ = [
    "HOLDS_KEPT_LEAST",
    "POOL_KEEPS",
    "RELAX_ORDER",
    "SAVES_LESS",
    "ClaimPlan",
    "ClaimPlanner",
    "PlannerPolicy",
    "PrefixContext",
    "Revision",
    "claim_down_the_ladder",
    "relax_ladder",
    "relax_mode",
    "run_now",
    "update_pressure",
]

WaitingOn = Literal["tool", "subagent", "human", "llm", "unknown"]
Revision = Literal["keep", "renew", "relax", "release"]

#: The relax reaction walks down this ladder, one step per refusal.
RELAX_ORDER: tuple[ProtectionMode, ...] = (
    ProtectionMode.HARD_PROTECTED,
    ProtectionMode.EXPIRING,
    ProtectionMode.BEST_EFFORT,
)
"""soft_priority is skipped on purpose: a soft claim can be lost without a refusal (harm)."""


_SOFT_MODES = (ProtectionMode.BEST_EFFORT, ProtectionMode.DEMOTABLE)
"""What ``PlannerPolicy.soft_mode`` may be."""

PRESSURE_WEIGHT = 0.2
"""Weight of the newest observation in the memory-pressure average."""


def update_pressure(pressure: float, pressed: bool) -> float:
    """The recent share of requests that met memory pressure (had to wait for memory), as an
    exponentially weighted average: what ``PrefixContext.pressure`` carries."""
    return (1.0 - PRESSURE_WEIGHT) * pressure + PRESSURE_WEIGHT * pressed


def relax_ladder(
    mode: ProtectionMode | None, soft: ProtectionMode = ProtectionMode.BEST_EFFORT
) -> Iterator[ProtectionMode]:
    """``mode``, then each weaker mode in turn (``relax_mode``): the ladder a refused claim
    walks down, the session's and the replays' alike, with the policy's ``soft`` mode."""
    while mode is not None:
        yield mode
        mode = relax_mode(mode, soft)


async def claim_down_the_ladder(
    first: ProtectionMode | None,
    attempt: Callable[[ProtectionMode], Awaitable[bool]],
    *,
    soft: ProtectionMode = ProtectionMode.BEST_EFFORT,
    usable: Callable[[ProtectionMode], ProtectionMode | None] | None = None,
    refused: Callable[[ProtectionMode], ProtectionMode | None] | None = None,
) -> ProtectionMode | None:
    """The one relax loop, the session's and the replays' alike: claim in ``first``, then
    down the ladder. ``usable(mode)`` is the mode to submit for ``mode`` (itself where the
    backend honours it, a weaker one where it does not, ``None``: no claim); ``attempt(mode)``
    submits, true when accepted; ``refused(mode)`` is the mode after a refusal (by default
    the next rung, ``relax_mode``; ``None`` stops; it may raise). The accepted mode, or
    ``None``. A port that never suspends (the replays' engines) runs it with
    :func:`run_now`."""
    mode = first
    while mode is not None:
        if usable is not None:
            instead = usable(mode)
            if instead is not mode:
                mode = instead
                continue
        if await attempt(mode):
            return mode
        mode = relax_mode(mode, soft) if refused is None else refused(mode)
    return None


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """The result of ``coro``, which must not suspend (its awaits all complete at once): the
    replays' synchronous ports through the async loop, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("run_now: the coroutine suspended (it awaits real I/O)")


def relax_mode(
    mode: ProtectionMode, soft: ProtectionMode = ProtectionMode.BEST_EFFORT
) -> ProtectionMode | None:
    """The next weaker mode on the relax ladder, or ``None`` (drop the claim). ``soft`` is the
    policy's soft mode (``PlannerPolicy.soft_mode``): with ``demotable`` (a backend that sheds
    holds by their hints) the ladder is hard -> expiring -> demotable -> best_effort."""
    if mode in (ProtectionMode.SOFT_PRIORITY, ProtectionMode.DEMOTABLE, ProtectionMode.OFFLOADABLE):
        return ProtectionMode.BEST_EFFORT
    if mode is ProtectionMode.EXPIRING and soft is not ProtectionMode.BEST_EFFORT:
        return soft
    i = RELAX_ORDER.index(mode)
    return RELAX_ORDER[i + 1] if i + 1 < len(RELAX_ORDER) else None


@dataclass(frozen=True, slots=True)
class PrefixContext:
    """What the session knows about one prefix at the moment it plans."""

    prefix_id: str
    footprint_blocks: int
    ste: float = math.inf
    """Steps until the prefix's nearest user runs (0: running now; inf: unreachable). Sessions
    give it exactly up to their horizon and as ``horizon + 1`` beyond it (all the mapping needs)."""
    reuse_probability: float = 0.0
    """Probability that a user of the prefix runs within the planning horizon."""
    waiting_on: WaitingOn = "unknown"
    expected_wait_s: float | None = None
    """Predicted seconds until the next use (e.g. the pending tool's predicted duration)."""
    wait_learned: bool = True
    """Whether ``expected_wait_s`` comes from waits observed (``False``: a prior alone, as for
    a tool never seen to run). A prior still orders holds (the reuse hint) and starts a TTL,
    but it is no wait the agent is sure of: it never grounds a pin (``hard_protected``) nor
    the pool-keeps rule's skipping a claim (fail closed)."""
    ttl_s: float | None = None
    """Cost-benefit TTL (Continuum's tau*) for the pending wait, when one is known."""
    pressure: float = 0.0
    """Share of recent requests the backend deferred or refused (0..1): memory pressure."""
    pool_survival_s: float | None = None
    """How long an unheld block freed now survives the engine's evictions (from its KV
    events: free blocks / evicted blocks per second; ``inf``: it evicts nothing lately;
    ``None``: unknown, as on a backend that does not say)."""
    admission_s: float = 0.0
    """How long the next call may take to reach the prefix after it is sent (the session's
    recent LLM-call latency): a call queued in a busy engine finds its prefix only when it is
    scheduled, so an unheld prefix must survive the wait and this."""
    reload_s: float | None = None
    """Seconds the engine takes to recompute the prefix (its blocks times the block cost
    learned from its answers; ``None``: unknown, and the plan is not weighed by time)."""
    evicted_per_s: float | None = None
    """The engine's evictions of cached blocks per second, as its last answer said
    (``None``: unknown): how many of others' blocks a hold displaces during the wait."""
    pool_room: bool | None = None
    """Whether the pool has room for a pin of this prefix beside the holds already made
    (``PoolShare.room``; ``None``: unknown). ``False`` rules out ``hard_protected``."""
    displaced_reuse_p: float | None = None
    """Of the blocks the engine evicted lately, the share it stored again (its answers'
    ``pool.evicted_reused_p``, from vLLM's KV events): the chance that a block a hold
    displaces would have been reused. ``None``: unknown, the policy's prior stands."""
    hold_kept_p: float | None = None
    """Of the soft holds (``demotable``, ``soft_priority``) the engine accepted lately for
    this process, the share it did not shed for memory (``PoolShare.hold_kept_p``); under
    ``HOLDS_KEPT_LEAST`` a soft hold saves nothing. ``None``: too few seen yet."""

    def __post_init__(self) -> None:
        if not self.prefix_id:
            raise UsageError("prefix_id", "must be non-empty")
        if self.footprint_blocks < 0:
            raise UsageError("footprint_blocks", f"must be >= 0, got {self.footprint_blocks}")
        if not self.ste >= 0:
            raise UsageError("ste", f"must be >= 0, got {self.ste}")
        if not 0.0 <= self.reuse_probability <= 1.0:
            raise UsageError(
                "reuse_probability", f"must be within [0, 1], got {self.reuse_probability}"
            )
        if not 0.0 <= self.pressure <= 1.0:
            raise UsageError("pressure", f"must be within [0, 1], got {self.pressure}")
        for name in ("expected_wait_s", "ttl_s", "admission_s", "reload_s", "evicted_per_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise UsageError(name, f"must be a finite number >= 0, got {value}")
        for name in ("displaced_reuse_p", "hold_kept_p"):
            p = getattr(self, name)
            if p is not None and not 0.0 <= p <= 1.0:
                raise UsageError(name, f"must be within [0, 1], got {p}")
        survival = self.pool_survival_s
        if survival is not None and not survival >= 0:
            raise UsageError("pool_survival_s", f"must be >= 0 (inf allowed), got {survival}")

    @property
    def learned_wait_s(self) -> float | None:
        """The predicted wait where waits observed give it; ``None`` for an unknown one or a
        prior alone. What a pin and the pool-keeps rule may rest on (fail closed)."""
        return self.expected_wait_s if self.wait_learned else None

    def pool_keeps(self, factor: float) -> bool:
        """Whether the pool keeps the prefix through the predicted wait unheld: the engine
        said how long a block freed now survives its evictions, and that is at least
        ``factor`` times the wait and the next call's way to the prefix (``admission_s``).
        Unknown survival or wait, or a wait from a prior alone: it may not (fail closed); an
        infinite ``factor``: never (even a pool that evicts nothing)."""
        survival, wait = self.pool_survival_s, self.learned_wait_s
        if survival is None or wait is None or math.isinf(factor):
            return False
        return survival >= factor * (wait + self.admission_s)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The planner's decision for one prefix. ``mode is None`` means: do not claim."""

    mode: ProtectionMode | None
    ttl_s: float | None = None
    reason: str = ""
    saving_s: float | None = None
    """The seconds the claim was expected to save (``ClaimPlanner.value``; ``None``: not
    weighed, the recompute cost being unknown)."""
    cost_s: float | None = None
    """The seconds it was expected to cost (its overhead, others' blocks it displaces)."""

    @property
    def claims(self) -> bool:
        return self.mode is not None

    def ttl_for(self, mode: ProtectionMode, default_ttl_s: float) -> float | None:
        """The TTL a claim of this plan carries in ``mode`` (a rung of its relax ladder): the
        plan's for a pin (``hard_protected``, ``expiring``), ``default_ttl_s`` for an
        ``expiring`` one the plan gave none; no TTL in any other mode."""
        if mode is ProtectionMode.EXPIRING:
            return default_ttl_s if self.ttl_s is None else self.ttl_s
        return self.ttl_s if mode is ProtectionMode.HARD_PROTECTED else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": None if self.mode is None else self.mode.value,
            "ttl_s": self.ttl_s,
            "reason": self.reason,
        }
        if self.saving_s is not None:
            out["saving_s"], out["cost_s"] = self.saving_s, self.cost_s
        return out


@dataclass(frozen=True, slots=True)
class PlannerPolicy:
    """Thresholds of the default mapping. Named presets: ``default``, ``conservative`` (soft
    priority only, never pins), ``aggressive`` (hard more often), ``off`` (never claims)."""

    name: str = "default"
    enabled: bool = True
    min_blocks: int = 1
    best_effort_min_p: float = 0.05
    soft_min_p: float = 0.3
    soft_max_ste: float = 3
    expiring_min_p: float = 0.5
    hard_min_p: float = 0.9
    hard_max_ste: float = 1
    hard_max_wait_s: float = 20.0
    allow_hard: bool = True
    allow_expiring: bool = True
    use_soft: bool = False
    default_ttl_s: float = 1.0
    """TTL of an expiring claim when neither a wait nor a cost-benefit TTL is known."""
    ttl_margin: float = 1.5
    """A TTL covers the predicted wait times this margin (tool times vary)."""
    min_ttl_s: float = 0.5
    max_ttl_s: float = 300.0
    allow_pins: bool = True
    """False: never hard_protected/expiring; likely reuse gets demotable priority instead."""
    pin_max_pressure: float = 0.25
    """Above this pressure nothing is pinned (hard/expiring): pins would only turn misses into
    deferrals. Likely reuse is then claimed ``demotable``: kept ahead of other blocks, and
    demoted (not harmed) when the memory is needed."""
    pool_keeps_factor: float = 4.0
    """No claim where the engine's pool keeps an unheld prefix through the wait: the time a
    block freed now survives its evictions (``PrefixContext.pool_survival_s``, from vLLM's KV
    events) is at least this many times the predicted wait. ``inf``: always claim."""
    decide_by_time: bool = True
    """Weigh each claim's expected saving against its cost (``ClaimPlanner.value``) and make
    none that saves no more than it costs. ``False``: the mapping alone."""
    claim_overhead_s: float = 0.0001
    """What carrying one claim costs (the engine's and the gateway's work on it, riding on a
    call): the least a claim must save."""
    displaced_reuse_p: float = 0.2
    """The chance that a block a hold displaces (one of another's the pool evicts instead)
    would have been reused: the prior the cost of a hold is weighed with, until the engine
    says how often its evictions are regretted (``PrefixContext.displaced_reuse_p``)."""
    renew_fraction: float = 0.2
    """Renew when less than this fraction of the TTL is left and reuse is still likely."""
    renew_slack: float = 0.2
    """A held pin is renewed to a longer wanted TTL (its tool now predicted longer, its reply
    calling a slower tool) only when that is more than this fraction longer than its own: the
    TTL's margin absorbs a prediction that moved a little, and a renewal that goes on its own
    is a request (``needs_renewal``)."""
    ranked: bool = False
    """The backend ranks resident blocks by predicted next use from the claims' reuse hints
    (``NextUsePolicy``): every prefix is claimed ``soft_mode`` with its hint (ranked, never
    harmed), and ``hard_protected`` only where the agent is sure of a short tool wait and the
    pool has room (pressure at most ``pin_max_pressure``)."""
    soft_mode: ProtectionMode = ProtectionMode.BEST_EFFORT
    """What a claim without a pin is: ``best_effort`` (a hint the backend may rank), or
    ``demotable`` on a backend that ranks nothing unclaimed but holds claimed blocks and sheds
    them by their hints, with a demotion (``sheds_by_hints``: vLLM with the connector), where a
    ``best_effort`` claim would only be watched. It is also the rung below ``expiring`` on the
    relax ladder."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_p") and not 0.0 <= value <= 1.0:
                raise UsageError(f"policy.{f.name}", f"must be within [0, 1], got {value}")
            if f.name.endswith(
                ("_s", "_ste", "_margin", "_fraction", "_factor", "_slack")
            ) and not (value >= 0):
                raise UsageError(f"policy.{f.name}", f"must be >= 0, got {value}")
        if self.min_ttl_s > self.max_ttl_s:
            raise UsageError("policy.min_ttl_s", "must not exceed max_ttl_s")
        if self.soft_mode not in _SOFT_MODES:
            raise UsageError(
                "policy.soft_mode",
                f"must be one of {', '.join(m.value for m in _SOFT_MODES)}, got {self.soft_mode!r}",
            )

    def needs_renewal(self, held_ttl_s: float | None, wanted_ttl_s: float | None) -> bool:
        """Whether a pin held for ``held_ttl_s`` is renewed to ``wanted_ttl_s``: only when that
        is more than ``renew_slack`` longer (a TTL covers its wait ``ttl_margin`` times over,
        so the pin still covers the wait ``ttl_margin / (1 + renew_slack)`` times)."""
        if held_ttl_s is None or wanted_ttl_s is None:
            return False
        return wanted_ttl_s > held_ttl_s * (1.0 + self.renew_slack)

    @classmethod
    def preset_names(cls) -> list[str]:
        """The names ``named`` knows, sorted."""
        return sorted(_PRESETS)

    @classmethod
    def named(cls, name: str) -> PlannerPolicy:
        presets = _PRESETS
        if name not in presets:
            raise UnknownNameError("policy", name, sorted(presets))
        return presets[name]

    def with_(self, **changes: Any) -> PlannerPolicy:
        known = {f.name for f in fields(self)}
        for key in changes:
            if key not in known:
                raise UnknownNameError("policy field", key, sorted(known))
        return replace(self, **changes)


_PRESETS: dict[str, PlannerPolicy] = {
    "default": PlannerPolicy(),
    "conservative": PlannerPolicy(
        name="conservative", allow_hard=False, allow_expiring=False, use_soft=True, soft_min_p=0.5
    ),
    "aggressive": PlannerPolicy(
        name="aggressive", hard_min_p=0.7, hard_max_ste=2, expiring_min_p=0.3, soft_min_p=0.15
    ),
    "off": PlannerPolicy(name="off", enabled=False),
    "priority": PlannerPolicy(name="priority", allow_pins=False),
    "ranked": PlannerPolicy(name="ranked", ranked=True, allow_hard=False),
    "ranked-hard": PlannerPolicy(name="ranked-hard", ranked=True, hard_max_wait_s=5.0),
    "held": PlannerPolicy(
        name="held", ranked=True, soft_mode=ProtectionMode.DEMOTABLE, hard_max_wait_s=5.0
    ),
}


HOLDS_KEPT_LEAST = 0.2
"""Below this share of soft holds kept (``PrefixContext.hold_kept_p``) a soft hold saves
nothing: the engine's active work sheds nearly every one before its agent comes back. A hold
shed late still kept its prefix for part of the wait, so a pool that sheds some of them is
not judged by the share."""
SHED_MODES = frozenset((ProtectionMode.DEMOTABLE, ProtectionMode.SOFT_PRIORITY))
"""The modes an engine sheds under memory pressure (a ``resident_claim_demoted`` each)."""


@dataclass(slots=True)
class ClaimPlanner:
    """Maps a ``PrefixContext`` to a ``ClaimPlan`` (pure, cheap: called on every LLM call)."""

    policy: PlannerPolicy = field(default_factory=PlannerPolicy)

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        plan = self._mapped(ctx)
        if plan.mode is None or not self.policy.decide_by_time:
            return plan
        value = self.value(ctx, plan.mode)
        if value is None:
            return plan
        saving, cost = value
        if saving <= cost:
            return ClaimPlan(None, reason=SAVES_LESS, saving_s=saving, cost_s=cost)
        return replace(plan, saving_s=saving, cost_s=cost)

    def value(self, ctx: PrefixContext, mode: ProtectionMode) -> tuple[float, float] | None:
        """``(saving_s, cost_s)`` of claiming ``ctx``'s prefix in ``mode``, rounded to the
        microsecond; ``None`` where the recompute cost is unknown (``ctx.reload_s``)."""
        reload_s = ctx.reload_s
        if reload_s is None:
            return None
        pol = self.policy
        wait = ctx.expected_wait_s
        reach = None if wait is None else wait + ctx.admission_s
        survival = ctx.pool_survival_s
        if survival is None or reach is None:
            gone = 1.0  # unknown: it may well be gone (fail toward keeping)
        elif math.isinf(survival):
            gone = 0.0
        else:
            gone = 1.0 - math.exp(-reach / survival) if survival > 0 else 1.0
        saving = ctx.reuse_probability * gone * reload_s
        kept = ctx.hold_kept_p
        if mode in SHED_MODES and kept is not None and kept < HOLDS_KEPT_LEAST:
            saving = 0.0  # the engine sheds nearly every soft hold: it has no room for them
        cost = pol.claim_overhead_s
        blocks = ctx.footprint_blocks
        if mode is not ProtectionMode.BEST_EFFORT and blocks:
            rate = ctx.evicted_per_s
            displaced = (
                float(blocks) if rate is None or reach is None else min(float(blocks), rate * reach)
            )
            regret = ctx.displaced_reuse_p
            cost += (
                displaced
                * (reload_s / blocks)
                * (pol.displaced_reuse_p if regret is None else regret)
            )
        return round(saving, 6), round(cost, 6)

    def _mapped(self, ctx: PrefixContext) -> ClaimPlan:
        """The mode the policy's mapping gives ``ctx`` (before it is weighed by time)."""
        pol = self.policy
        p = ctx.reuse_probability
        if not pol.enabled:
            return ClaimPlan(None, reason="planner off")
        if ctx.footprint_blocks < pol.min_blocks:
            return ClaimPlan(None, reason="prefix too small")
        if ctx.pool_keeps(pol.pool_keeps_factor):
            return ClaimPlan(None, reason=POOL_KEEPS)
        if pol.ranked:
            return self._ranked(ctx)
        if p < pol.best_effort_min_p or math.isinf(ctx.ste):
            return ClaimPlan(None, reason="reuse unlikely")
        if ctx.waiting_on == "human":
            # when the human comes back is anyone's guess: ranking the prefix above others
            # would only push out prefixes whose reuse is predictable
            return ClaimPlan(None, reason="waiting on the human")
        wait = ctx.expected_wait_s
        if ctx.ttl_s == 0.0 and not (pol.decide_by_time and ctx.reload_s is not None):
            # Continuum's own weighing, only where the plan is not weighed by time (below):
            # its tau* prices a pin's seconds as lost, where the time weighing prices what the
            # pin displaces
            return ClaimPlan(pol.soft_mode, reason="pinning costs more than reloading")
        if not pol.allow_pins or ctx.pressure > pol.pin_max_pressure:
            if p >= pol.expiring_min_p:
                return ClaimPlan(ProtectionMode.DEMOTABLE, reason="likely reuse, memory pressure")
            return ClaimPlan(pol.soft_mode, reason="memory pressure")
        if (
            pol.allow_hard
            and p >= pol.hard_min_p
            and ctx.ste <= pol.hard_max_ste
            and (sure := ctx.learned_wait_s) is not None
            and sure <= pol.hard_max_wait_s
            and ctx.pool_room is not False
        ):
            return ClaimPlan(
                ProtectionMode.HARD_PROTECTED,
                self._ttl(sure * pol.ttl_margin),
                "near and certain reuse",
            )
        if pol.allow_expiring and p >= pol.expiring_min_p:
            known = [t for t in (ctx.ttl_s, None if wait is None else wait * pol.ttl_margin) if t]
            ttl = self._ttl(max(known) if known else pol.default_ttl_s)
            return ClaimPlan(ProtectionMode.EXPIRING, ttl, "likely reuse")
        if pol.use_soft and p >= pol.soft_min_p and ctx.ste <= pol.soft_max_ste:
            return ClaimPlan(ProtectionMode.SOFT_PRIORITY, reason="likely reuse, no pin")
        return ClaimPlan(pol.soft_mode, reason="possible reuse")

    def _ranked(self, ctx: PrefixContext) -> ClaimPlan:
        """Soft by default (a ranked hint, or a hold shed by it), hard only when sure of a short
        wait and room. A hold is not free (it counts against the backend's cap until shed): a
        prefix whose reuse is unlikely is not held."""
        pol = self.policy
        wait = ctx.learned_wait_s  # only a pin rests on it here
        if pol.soft_mode is not ProtectionMode.BEST_EFFORT and (
            ctx.waiting_on != "human"
            and (ctx.reuse_probability < pol.best_effort_min_p or math.isinf(ctx.ste))
        ):
            return ClaimPlan(None, reason="reuse unlikely")
        if (
            pol.allow_hard
            and ctx.waiting_on == "tool"
            and ctx.reuse_probability >= pol.hard_min_p
            and ctx.ste <= pol.hard_max_ste
            and wait is not None
            and wait <= pol.hard_max_wait_s
            and ctx.pressure <= pol.pin_max_pressure
            and ctx.pool_room is not False
        ):
            return ClaimPlan(
                ProtectionMode.HARD_PROTECTED,
                self._ttl(wait * pol.ttl_margin),
                "sure of a short wait, room in the pool",
            )
        if pol.soft_mode is ProtectionMode.BEST_EFFORT:
            return ClaimPlan(pol.soft_mode, reason="ranked by predicted next use")
        return ClaimPlan(pol.soft_mode, reason="held, shed by predicted next use")

    def revise(self, ctx: PrefixContext, held: ClaimPlan, remaining_s: float | None) -> Revision:
        """What to do with a claim already held: keep it, renew its TTL, relax it, release it."""
        fresh = self.plan(ctx)
        if fresh.mode is None:
            return "release"
        if held.mode is not None and _strength(fresh.mode) < _strength(held.mode):
            return "relax"
        if (
            remaining_s is not None
            and held.ttl_s
            and remaining_s < held.ttl_s * self.policy.renew_fraction
        ):
            return "renew"
        return "keep"

    def _ttl(self, seconds: float) -> float:
        return min(self.policy.max_ttl_s, max(self.policy.min_ttl_s, seconds))


_STRENGTH = {
    ProtectionMode.BEST_EFFORT: 0,
    ProtectionMode.DEMOTABLE: 1,
    ProtectionMode.OFFLOADABLE: 2,
    ProtectionMode.SOFT_PRIORITY: 3,
    ProtectionMode.EXPIRING: 4,
    ProtectionMode.HARD_PROTECTED: 5,
}


def _strength(mode: ProtectionMode) -> int:
    return _STRENGTH[mode]
