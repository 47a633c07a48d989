"""``PoolShare``: what the sessions of one process know together of one engine's pool, and
how they share it when their agents' working set does not fit.

Every answer of an engine that says so (vLLM's connector from its KV events, the reference
engine from its own pool) carries the pool's figures: usable and free blocks, evictions per
second, how long a block freed now survives. The sessions on that engine note them here, and
three decisions follow from them, the same for every session of the process:

* **Which workflows keep their prefixes.** Each hold a session plans is worth
  ``(saving_s - cost_s) / (blocks x seconds held)``: seconds saved per block-second (the
  planner's :meth:`~agentclaims.planner.ClaimPlanner.value`). Holds may take
  ``hold_share`` of the usable blocks; a hold fits when it and the holds worth more per
  block-second fit, and a denser hold takes the room of a sparser one (which ends at its
  node's next call). So when the agents' working set exceeds the pool, the prefixes that save
  the most per block held keep theirs, instead of every prefix held softly and shed under
  pressure.
* **Whether a pin has room** (``room``): a ``hard_protected`` claim only where the agents'
  working set (every live agent's latest context) fits in the share, the holds made and this
  one too, and the pool has that many free blocks: a pin in a pool the agents over-subscribe
  makes their own calls wait for it.
* **Admission.** An AIMD window on the sessions running model calls (Concur's agent-level
  admission), engaged only while the pool thrashes because the agents' own contexts
  over-subscribe it and the engine is the bottleneck: a period of calls whose hit ratio fell
  below its running average while blocks survive in the pool for less than the agents' wait,
  the agents' working set over the usable blocks, and at least ``SATURATED_IN_FLIGHT`` calls
  in flight on average.
  Until then it admits everyone (``max_window``); engaged, a session that reaches a model call
  while more run than the window allows gives its slot back and waits in line.

``PoolShare.of(backend)`` is the process's share for a backend (by its name); the learned
block cost (``EngineCosts``) lives here too, so every session's calls teach it.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from agentclaims.backends.admission import AdmissionWindow
from agentclaims.contract import ClaimEvent, EventName
from agentclaims.errors import UsageError
from agentclaims.graph.costs import EngineCosts
from agentclaims.planner.planner import SHED_MODES

__all__ = ["DENSER_HOLDS", "QUIET_WINDOW_S", "PoolShare", "pool_survival"]

QUIET_WINDOW_S = 10.0
"""A pool that evicted nothing vouches for its blocks only once it was watched this long: an
engine that just started (or idled a moment) says nothing of the load to come."""


def _seconds(value: object) -> float | None:
    """A duration an engine's answer gives: a finite number >= 0, else unknown."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 and math.isfinite(value) else None


def pool_survival(pool: object) -> float | None:
    """How long an unheld block freed now survives the engine's evictions, as an answer's
    ``agentclaims.pool`` says (``None``: unknown). A pool that evicted nothing over its
    window (``window_s``) kept every block that long, and vouches for no longer: an engine
    that idled through the window says nothing of the tenant that starts next; a window
    under ``QUIET_WINDOW_S`` vouches for nothing."""
    if not isinstance(pool, Mapping):
        return None
    rate, said = pool.get("evicted_per_s"), pool.get("survival_s")
    survival = _seconds(pool.get("window_s") if rate == 0 else said)
    if rate == 0 and (survival is None or survival < QUIET_WINDOW_S):
        return None  # quiet for a moment only: no evidence it keeps blocks
    return survival


HOLDS_FADE = 0.95
"""How much less each soft hold counts toward ``PoolShare.hold_kept_p`` than the next one
(the last fifty or so decide it)."""
HOLDS_HALF_LIFE_S = 120.0
"""The counts behind ``PoolShare.hold_kept_p`` also halve every this many seconds: a pool
that shed every hold while a tenant flooded it is tried again once that is old news."""
HOLDS_SEEN = 5.0
"""Soft holds accepted (faded) before ``PoolShare.hold_kept_p`` says anything."""
_SHED = frozenset(mode.value for mode in SHED_MODES)

DENSER_HOLDS = "the pool's room for holds goes to prefixes that save more per block"
"""The reason of a plan without a claim because holds worth more seconds per block-second
fill the share of the pool holds may take."""

OPEN_WINDOW = 4096
"""The admission window while the pool does not thrash: everyone is admitted."""

_HIT_WEIGHT = 0.3

SATURATED_IN_FLIGHT = 2.0
"""Calls in flight on average over a period (their times added up, over its span) from which
the engine is the bottleneck: only then can holding agents back make the others finish
sooner. Where the agents mostly wait on their tools, fewer of them at once only makes the
workflows later, however the cache thrashes."""


@dataclass(slots=True)
class _Hold:
    blocks: int
    density: float
    """Its worth in seconds per block-second, as ``fits`` ranks it (not a number: -inf)."""
    until: float
    seq: int
    """Its place in ``PoolShare``'s indexes (one per hold made: a replaced hold's stale
    entries are told apart by it)."""


class PoolShare:
    """The holds, the pool's figures and the admission window of one engine, per process."""

    _by_url: ClassVar[dict[str, PoolShare]] = {}
    _by_object: ClassVar[weakref.WeakKeyDictionary[object, PoolShare]] = weakref.WeakKeyDictionary()
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        *,
        hold_share: float = 0.6,
        prior_reload_s_per_block: float = 0.002,
        period_calls: int = 24,
        max_hit_drop: float = 0.2,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if isinstance(hold_share, bool) or not (0.0 < hold_share <= 1.0):
            raise UsageError("hold_share", f"must be within (0, 1], got {hold_share!r}")
        import time

        self.hold_share = float(hold_share)
        self.clock = clock or time.monotonic
        self.costs = EngineCosts(prior_reload_s_per_block)
        """The block cost learned from every session's answered calls on this engine."""
        self.window = AdmissionWindow(
            initial=OPEN_WINDOW,
            max_window=OPEN_WINDOW,
            period_calls=period_calls,
            max_hit_drop=max_hit_drop,
            max_pressed_share=1.0,
            max_kv_usage=1.0,
            max_harm_rate=math.inf,
        )
        """Sessions running model calls; ``OPEN_WINDOW`` (everyone) until the pool thrashes."""
        self.usable_blocks: int | None = None
        self.free_blocks: int | None = None
        self.evicted_per_s: float | None = None
        self.survival_s: float | None = None
        self.displaced_reuse_p: float | None = None
        """Of the blocks the engine evicted lately, the share it stored again (its answers'
        ``evicted_reused_p``; ``None`` until one says it)."""
        self._soft_made = 0.0  # soft holds the engine accepted, lately (decayed counts)
        self._soft_shed = 0.0  # ... and the demotions it made of this process's holds
        self._soft_at = 0.0  # the counts are as of this time
        self.pool_survival_s: float | None = None
        """What a session's plan takes the pool's survival to be (``pool_survival``), as the
        last answer on this engine said: a new session's first call plans with it."""
        self.thrash_periods = 0
        """Periods of calls in which the pool was seen thrashing."""
        self._holds: dict[tuple[str, str], _Hold] = {}
        """The live holds (those whose time ran out leave at the next read, ``_prune``)."""
        self._held = 0  # their blocks added up, kept as holds come and go
        self._dense: list[tuple[float, int, int]] = []  # (-density, seq, blocks), sorted
        self._expiry: list[tuple[float, int, tuple[str, str]]] = []  # heap of (until, seq, key)
        self._made = 0
        self._footprints: dict[tuple[str, str], int] = {}
        self._working = 0  # the footprints added up, kept as they change (``room`` per call)
        self._waits: deque[float] = deque(maxlen=64)
        self._hit_average: float | None = None
        self._period = [0, 0, 0]  # calls, prompt tokens, cached tokens
        self._period_started = 0.0
        self._busy_s = 0.0  # the period's calls' time, send to answer, added up

    @classmethod
    def of(cls, backend: object) -> PoolShare:
        """The process's share for ``backend`` (made on first use): one per engine URL
        (``backend.share_key``: every ``HTTPBackend`` to one gateway shares it), else one per
        backend object (an embedded engine is its own)."""
        key = getattr(backend, "share_key", None)
        with cls._registry_lock:
            if isinstance(key, str):
                share = cls._by_url.get(key)
                if share is None:
                    share = cls._by_url[key] = cls()
                return share
            share = cls._by_object.get(backend)
            if share is None:
                share = cls._by_object[backend] = cls()
            return share

    @classmethod
    def forget_all(cls) -> None:
        """Drop every backend's share (a fresh start: tests, benchmarks between set-ups)."""
        with cls._registry_lock:
            cls._by_url.clear()
            cls._by_object.clear()

    # ------------------------------------------------------------------ the pool's figures
    def note_pool(self, pool: object) -> None:
        """What an answer said of the pool (its ``agentclaims.pool``); absent figures stay as
        they were last said."""
        if not isinstance(pool, Mapping):
            return
        self.pool_survival_s = pool_survival(pool)
        for name in ("usable_blocks", "free_blocks"):
            value = pool.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(self, name, value)
        regret = pool.get("evicted_reused_p")
        if isinstance(regret, int | float) and not isinstance(regret, bool) and 0 <= regret <= 1:
            self.displaced_reuse_p = float(regret)
        rate = pool.get("evicted_per_s")
        if isinstance(rate, int | float) and not isinstance(rate, bool) and rate >= 0:
            self.evicted_per_s = float(rate)
            said = pool.get("survival_s")
            self.survival_s = (
                float(said) if isinstance(said, int | float) and rate > 0 else math.inf
            )

    def note_holds(self, events: Iterable[ClaimEvent]) -> None:
        """A session's events, as it took them: each soft hold the engine accepted, and each
        one it demoted (shed for memory), counted toward ``hold_kept_p``. Older counts fade
        (each event weighs ``HOLDS_FADE`` less than the one after it)."""
        now = self.clock()  # one read per answer's events, not one per event
        for ev in events:
            if ev.event is EventName.RESIDENT_CLAIM_ACCEPTED:
                mode = ev.data.get("mode", ev.data.get("protection_mode"))
                if mode not in _SHED:
                    continue
                self._fade_to(now, HOLDS_FADE)
                self._soft_made += 1.0
            elif ev.event is EventName.RESIDENT_CLAIM_DEMOTED:
                self._fade_to(now)
                self._soft_shed += 1.0

    @property
    def hold_kept_p(self) -> float | None:
        """The share of this process's soft holds the engine did not shed, lately; ``None``
        while fewer than ``HOLDS_SEEN`` were accepted lately (a hold is then taken as kept)."""
        if self._soft_made * self._time_fade(self.clock()) < HOLDS_SEEN:
            return None
        # both counts fade alike with time: their ratio as of their last event is today's
        return max(0.0, 1.0 - self._soft_shed / self._soft_made)

    def _time_fade(self, now: float) -> float:
        """What the counts as of their last event weigh at ``now`` (they halve every
        ``HOLDS_HALF_LIFE_S``)."""
        return float(0.5 ** (max(0.0, now - self._soft_at) / HOLDS_HALF_LIFE_S))

    def _fade_to(self, now: float, more: float = 1.0) -> None:
        """The counts as of ``now`` (times ``more``: an older hold weighs less)."""
        fade = self._time_fade(now) * more
        self._soft_made *= fade
        self._soft_shed *= fade
        self._soft_at = now

    @property
    def budget_blocks(self) -> int | None:
        """The blocks the process's holds may take together (``None``: pool size unknown)."""
        usable = self.usable_blocks
        return None if usable is None else int(usable * self.hold_share)

    # ------------------------------------------------------------------ capacity
    # Each call asks ``fits`` or ``room``: their work is kept to what changed, not to every
    # hold of every session in the process. The live holds' blocks are one running total;
    # holds whose time ran out leave through a heap of their ends; ``fits`` walks the holds
    # by density only when the total does not fit, and only as far as the budget.
    def fits(self, key: tuple[str, str], blocks: int, density: float) -> bool:
        """Whether a hold of ``blocks`` worth ``density`` seconds per block-second fits beside
        the holds worth as much or more (``key``'s own previous hold aside). Unknown pool
        size: it fits (the engine's own caps still apply)."""
        budget = self.budget_blocks
        if budget is None:
            return True
        self._prune(self.clock())
        own = self._holds.get(key)
        if self._held - (0 if own is None else own.blocks) + blocks <= budget:
            return True  # every live hold fits beside it, whatever their worth
        room = budget - blocks
        if room < 0:
            return False
        if math.isnan(density):
            return True  # worth nothing comparable: no hold counts as denser (and it fits)
        denser = 0
        for negative, seq, held in self._dense:  # densest first, only until it overflows
            if -negative < density:
                break
            if own is None or seq != own.seq:
                denser += held
                if denser > room:
                    return False
        return True

    def room(self, key: tuple[str, str], blocks: int) -> bool | None:
        """Whether a pin of ``blocks`` has room: the agents' working set (every live agent's
        latest context, ``note_footprint``) fits in the share, the live holds and it too, and
        that many blocks are free. A pin where the agents' contexts do not all fit would make
        their own calls wait for it. ``None``: the pool's size is unknown."""
        budget = self.budget_blocks
        if budget is None:
            return None
        self._prune(self.clock())
        own = self._holds.get(key)
        held = self._held - (0 if own is None else own.blocks)
        working = self._working - self._footprints.get(key, 0) + blocks
        free = self.free_blocks
        return working <= budget and held + blocks <= budget and (free is None or blocks <= free)

    def note_footprint(self, key: tuple[str, str], blocks: int) -> None:
        """``key``'s agent now carries a context of ``blocks`` (its part of the working set)."""
        self._working += blocks - self._footprints.get(key, 0)
        self._footprints[key] = blocks

    @property
    def working_set_blocks(self) -> int:
        """The live agents' contexts together, as their sessions last planned them."""
        return self._working

    def hold(self, key: tuple[str, str], blocks: int, density: float, seconds: float) -> None:
        """``key`` (a session and node) holds ``blocks`` for about ``seconds`` (its previous
        hold replaced). A ``density`` that is not a number ranks below every other."""
        self.drop(key)
        self._made += 1
        seq, until = self._made, self.clock() + max(1.0, 2.0 * seconds)
        rank = -math.inf if math.isnan(density) else density
        self._holds[key] = _Hold(blocks, rank, until, seq)
        self._held += blocks
        bisect.insort(self._dense, (-rank, seq, blocks))
        if len(self._expiry) > 4 * len(self._holds) + 64:  # replaced holds' stale ends
            # rebuilt from the live holds, this new one among them
            self._expiry = [(h.until, h.seq, k) for k, h in self._holds.items()]
            heapq.heapify(self._expiry)
        else:
            heapq.heappush(self._expiry, (until, seq, key))

    def drop(self, key: tuple[str, str]) -> None:
        hold = self._holds.pop(key, None)
        if hold is None:
            return
        self._held -= hold.blocks
        del self._dense[bisect.bisect_left(self._dense, (-hold.density, hold.seq))]

    def _prune(self, now: float) -> None:
        """The holds whose time ran out leave (the heap's earliest ends first; an end whose
        hold was replaced or dropped since is passed over)."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, seq, key = heapq.heappop(expiry)
            hold = self._holds.get(key)
            if hold is not None and hold.seq == seq:
                self.drop(key)

    def leave(self, session_id: str) -> None:
        """The session ended: its holds and its admission slot go."""
        for key in [k for k in self._holds if k[0] == session_id]:
            self.drop(key)
        for key in [k for k in self._footprints if k[0] == session_id]:
            self._working -= self._footprints.pop(key)
        self.window.cancel(session_id)

    @property
    def held_blocks(self) -> int:
        self._prune(self.clock())
        return self._held

    # ------------------------------------------------------------------ admission
    async def admit_call(self, session_id: str) -> float:
        """Before a model call of ``session_id``: its slot in the window (at once while the
        pool does not thrash). A session holding a slot beyond a window that shrank gives it
        back and waits in line (paused at the call, as a whole agent). Returns the seconds it
        waited."""
        window = self.window
        if window.is_active(session_id):
            if window.active <= window.window:
                return 0.0
            window.release(session_id)
        if not window.waiting and window.active < window.window:
            window.request(session_id)  # a slot is free: at once
            return 0.0
        started = self.clock()
        await window.acquire(session_id)
        return max(0.0, self.clock() - started)

    def note_wait(self, seconds: float) -> None:
        """An agent waited ``seconds`` between two of its calls (its tools, other agents)."""
        if seconds > 0 and math.isfinite(seconds):
            self._waits.append(seconds)

    def observe_call(
        self, *, prompt_tokens: int, cached_tokens: int, latency_s: float | None = None
    ) -> None:
        """An answered model call on this engine (``latency_s``: send to answer). Every
        ``period_calls`` calls the window moves: halved from the sessions running where the
        period thrashed, else grown while sessions wait."""
        if prompt_tokens <= 0:
            return
        period = self._period
        if period[0] == 0:
            self._period_started = self.clock() - (latency_s or 0.0)
        period[0] += 1
        period[1] += prompt_tokens
        period[2] += min(cached_tokens, prompt_tokens)
        if latency_s is not None and latency_s > 0 and math.isfinite(latency_s):
            self._busy_s += latency_s
        if period[0] < self.window.period_calls:
            return
        span = self.clock() - self._period_started
        saturated = span > 0 and self._busy_s / span >= SATURATED_IN_FLIGHT
        thrashed = self._thrashed(period[2] / period[1]) and saturated
        self._period = [0, 0, 0]
        self._busy_s = 0.0
        window = self.window
        if thrashed:
            self.thrash_periods += 1
            running = max(1, min(window.window, window.active))
            window.resize(math.floor(running * window.decrease))
        elif window.window < OPEN_WINDOW and (window.waiting or window.active >= window.window):
            grown = window.window + window.increase
            if not window.waiting and grown >= window.active + 4:
                grown = OPEN_WINDOW  # nobody waits and room to spare: open again
            window.resize(grown)

    def _thrashed(self, hit: float) -> bool:
        average = self._hit_average
        self._hit_average = hit if average is None else average + _HIT_WEIGHT * (hit - average)
        if average is None or hit >= average * (1.0 - self.window.max_hit_drop):
            return False
        survival, waits = self.survival_s, self._waits
        if survival is None or not waits:
            return False  # turnover unknown: no evidence the agents outlive their blocks
        usable = self.usable_blocks
        if usable is None or self.working_set_blocks <= usable:
            # the agents' contexts fit the pool: what turns it over is someone else's load,
            # and holding agents back would only make them later
            return False
        return survival < statistics.median(waits)
