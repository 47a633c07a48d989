"""Replay traces on the reference engine (or the engine a policy names: vLLM's pool for the
``-vllm`` rows, :mod:`agentclaims.replay.vllm_pool`): a discrete-event simulation in trace time.

``sessions`` slots each run traces back to back; trace ``i`` (file order) goes to slot
``i % sessions``. A trace's sub-agents run as their own concurrent sessions. Each request:

1. arrives ``delay_s`` after its session's previous step ended (tool or human time);
2. asks the engine to ``begin`` over its block hashes (prefix semantics: the leading resident
   run is reused) plus unhashed blocks for its partial tail and output; if the pool cannot
   hold it now it waits in a FIFO queue (a deferral) and is retried whenever a request ends;
3. runs for ``ServiceModel.seconds(timeline_prefill, out)``, where ``timeline_prefill`` is the
   input not shared with the session's previous request: the work the request needs with a
   perfect cache. The timeline is therefore the same for every policy that never defers, so all
   of them (and the optimum) see one request order; what a policy's misses cost is added per
   session as ``extra = recomputed tokens / prefill rate`` (along the critical path through
   sub-agents) into the modelled completion time;
4. finishes: its hashed blocks become resident and the policy may evict them from then on.

The optimum needs next-use times: :func:`run_replay` with ``record=True`` returns the start
sequence number of every request, and :class:`~agentclaims.replay.policies.OptimalPolicy`
reads them (per trace, as each trace is loaded).

With ``admission`` (an :class:`~agentclaims.backends.admission.AdmissionWindow`) a trace whose
slot is free starts only once the window admits it (FIFO across slots), and its completion time
counts the wait. The window sees what a session's pool sees, per request as it starts: its
prompt and hit tokens, whether it waited for memory, claims harmed since, and the share of the
pool held by running requests (KV usage). This changes the timeline: compare such a run with
the same policy without admission, not with the rows of one shared timeline.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentclaims.backends.admission import AdmissionWindow
from agentclaims.contract import ArbiterAction
from agentclaims.errors import UsageError
from agentclaims.replay.model import (
    REPLAY_EVENT_BUFFER,
    CountsClaimEvents,
    ReplayEngine,
    ReplayPolicy,
    ServiceModel,
    SessionState,
)
from agentclaims.replay.traces import SubAgentGroup, Trace, TraceRequest, TraceSource

__all__ = ["ReplayResult", "Schedule", "TraceInput", "run_replay", "working_set_blocks"]

Schedule = dict[tuple[int, int], int]
"""(trace ordinal, request index in ``Trace.requests()`` order) -> start sequence number."""

TraceInput = TraceSource | Sequence[Trace]

_FINISH, _RETRY, _SUB_START, _ARRIVE = 0, 1, 2, 3  # same-time order: free capacity first
_MAX_STALLS = 600
"""Retries of a claim-blocked head before it is served without the cache (deadlock guard)."""


@dataclass
class ReplayResult:
    """What one replay measured (tokens, seconds in modelled time, counts)."""

    policy: str
    capacity_blocks: int
    sessions: int
    traces: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    computed_tokens: int = 0
    recomputed_tokens: int = 0
    completion_s_mean: float = 0.0
    makespan_s: float = 0.0
    deferrals: int = 0
    deferral_wait_s: float = 0.0
    refusals: int = 0
    true_harm: int = 0
    peak_protected_blocks: int = 0
    oversize: int = 0
    admission_deferred: int = 0
    """Traces that waited for the admission window (0 without one)."""
    admission_wait_s: float = 0.0
    """Their total wait for it, in modelled seconds (counted in their completion times)."""
    admission_window: tuple[int, int, int] | None = None
    """The window's smallest, largest and final size (``None`` without one)."""
    claim_events: dict[str, int] | None = None
    """The engine's claim events by name, where it counts them (vLLM's pool with the
    connector: ``resident_claim_demoted`` = soft holds shed); ``None`` elsewhere."""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of this process the replay took (what other load on the machine does not
    inflate, unlike ``wall_s``)."""
    schedule: Schedule | None = field(default=None, repr=False)

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("schedule")
        data["hit_ratio"] = self.hit_ratio
        return data


def _shared_run(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(slots=True)
class _ReqInfo:
    index: int
    """Position in ``Trace.requests()`` order."""
    fresh_blocks: int
    """Blocks no earlier request of the trace had (compulsory misses)."""
    timeline_prefill: int
    """Input tokens not shared with the session's previous request."""


def _trace_tables(trace: Trace) -> dict[int, _ReqInfo]:
    seen: set[int] = set()
    infos: dict[int, _ReqInfo] = {}
    bs = trace.block_size

    def walk(steps: Sequence[TraceRequest | SubAgentGroup]) -> None:
        prev: tuple[int, ...] = ()
        for step in steps:
            if isinstance(step, TraceRequest):
                fresh = sum(1 for h in step.block_hashes if h not in seen)
                seen.update(step.block_hashes)
                shared = _shared_run(prev, step.block_hashes) * bs
                infos[id(step)] = _ReqInfo(len(infos), fresh, max(0, step.input_tokens - shared))
                prev = step.block_hashes
            else:
                for agent in step.agents:
                    walk(agent.steps)

    walk(trace.root.steps)
    return infos


class _Replay:
    """One replay run; ``engine is None`` runs the timeline only (for the working set)."""

    def __init__(
        self,
        traces: TraceInput,
        engine: ReplayEngine | None,
        policy: ReplayPolicy | None,
        sessions: int,
        service: ServiceModel,
        record: bool,
        progress: Callable[[int], None] | None,
        admission: AdmissionWindow | None = None,
    ) -> None:
        self.traces = traces
        self.admission = admission
        self._admitting: dict[str, SessionState] = {}  # trace key -> root waiting for a slot
        self._harm_seen = 0
        self._window_range = (admission.window, admission.window) if admission else (0, 0)
        self.engine = engine
        self.policy = policy
        self.sessions = sessions
        self.service = service
        self.progress = progress
        self.schedule: Schedule | None = {} if record else None
        self.now = 0.0
        self.seq = 0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._count = 0
        self._sid = 0
        self._slot_next = list(range(sessions))
        self._tables: dict[int, dict[int, _ReqInfo]] = {}
        self._slot_of: dict[int, int] = {}
        self._waiting: deque[tuple[SessionState, TraceRequest, float]] = deque()
        self._completions: list[float] = []
        self._retry_pending = False
        self._stalls = 0
        self.live_blocks = 0
        self.peak_live_blocks = 0
        self.result = ReplayResult(
            policy="timeline" if policy is None else policy.name,
            capacity_blocks=0 if engine is None else engine.num_blocks,
            sessions=sessions,
        )

    # ------------------------------------------------------------------ plumbing
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._count += 1
        heapq.heappush(self._heap, (t, kind, self._count, payload))

    def _load(self, index: int) -> Trace | None:
        if isinstance(self.traces, TraceSource):
            return self.traces.load(index)
        return self.traces[index]

    def run(self) -> ReplayResult:
        started = time.perf_counter()
        cpu_started = time.process_time()
        if self.engine is not None and self.policy is not None:
            self.policy.attach(self.engine)
        for slot in range(min(self.sessions, len(self.traces))):
            self._next_trace(slot, 0.0)
        policy, engine, res = self.policy, self.engine, self.result
        while self._heap:
            t, kind, _, payload = heapq.heappop(self._heap)
            self.now = t
            if policy is not None:
                policy.advance(t)
            if kind == _FINISH:
                self._finish(*payload)
            elif kind == _ARRIVE:
                self._arrive(*payload)
            elif kind == _RETRY:
                self._retry_pending = False
                if self._waiting and self._stalls > _MAX_STALLS:
                    self._force_head()
                else:
                    self._drain()
            else:
                payload.started_at = t
                self._advance(payload, t)
            if engine is not None:
                protected = max(
                    engine.protected_resident_blocks, policy.protected_blocks if policy else 0
                )
                if protected > res.peak_protected_blocks:
                    res.peak_protected_blocks = protected
            if not self._heap and self._waiting:
                self._force_head()
        if engine is not None:
            res.true_harm = engine.stats.true_harm
            if isinstance(engine, CountsClaimEvents):
                res.claim_events = engine.claim_event_counts()
        if self.admission is not None:
            low, high = self._window_range
            res.admission_deferred = self.admission.stats.deferred
            res.admission_window = (low, high, self.admission.window)
        res.completion_s_mean = (
            sum(self._completions) / len(self._completions) if self._completions else 0.0
        )
        res.makespan_s = self.now
        res.wall_s = time.perf_counter() - started
        res.cpu_s = time.process_time() - cpu_started
        res.schedule = self.schedule
        return res

    # ------------------------------------------------------------------ sessions
    def _next_trace(self, slot: int, t: float) -> None:
        while self._slot_next[slot] < len(self.traces):
            ordinal = self._slot_next[slot]
            self._slot_next[slot] += self.sessions
            trace = self._load(ordinal)
            if trace is None or not any(True for _ in trace.requests()):
                continue
            self._tables[ordinal] = _trace_tables(trace)
            self._slot_of[ordinal] = slot
            if self.policy is not None:
                self.policy.on_trace(trace, ordinal)
            root = self._session(trace.root, ordinal, None)
            root.started_at = t  # its completion time counts any wait for admission
            if self.admission is not None and not self.admission.request(f"t{ordinal}"):
                self._admitting[f"t{ordinal}"] = root
                return
            self._advance(root, t)
            return

    def _session(self, script: Any, ordinal: int, parent: SessionState | None) -> SessionState:
        self._sid += 1
        return SessionState(self._sid, script.name, script.kind, ordinal, parent, script)

    def _advance(self, s: SessionState, t: float) -> None:
        steps = s.script.steps
        while s.step < len(steps):
            step = steps[s.step]
            s.step += 1
            if isinstance(step, TraceRequest):
                self._push(t + step.delay_s, _ARRIVE, (s, step))
                return
            live = [
                (a, d)
                for a, d in zip(step.agents, step.start_delays_s, strict=True)
                if any(True for _ in a.requests())
            ]
            if not live:
                continue
            s.waiting_subagents = len(live)
            if self.policy is not None:
                self.policy.on_wait(s, t)
            for agent, delay in live:
                self._push(t + delay, _SUB_START, self._session(agent, s.ordinal, s))
            return
        self._end_session(s, t)

    def _end_session(self, s: SessionState, t: float) -> None:
        s.done = True
        self.live_blocks -= s.ctx_blocks
        parent = s.parent
        if parent is not None:
            if self.policy is not None:
                self.policy.on_session_end(s, t)
            parent.group_extra_s = max(parent.group_extra_s, s.extra_s)
            parent.waiting_subagents -= 1
            if parent.waiting_subagents == 0:
                parent.extra_s += parent.group_extra_s
                parent.group_extra_s = 0.0
                self._advance(parent, t)
            return
        self._completions.append(t - s.started_at + s.extra_s)
        self.result.traces += 1
        del self._tables[s.ordinal]
        if self.policy is not None:
            self.policy.on_trace_end(s.ordinal)
        if self.progress is not None:
            self.progress(self.result.traces)
        if self.admission is not None:
            self._admitted(self.admission.release(f"t{s.ordinal}"))
        self._next_trace(self._slot_of.pop(s.ordinal), t)

    def _admitted(self, keys: list[str]) -> None:
        """Start the traces the admission window just let in."""
        for key in keys:
            root = self._admitting.pop(key)
            self.result.admission_wait_s += self.now - root.started_at
            self._advance(root, self.now)

    def _observe(self, req: TraceRequest, hit_tokens: int, arrived: float) -> None:
        """What the admission window learns from one request starting."""
        assert self.admission is not None
        engine = self.engine
        harmed = 0
        usage = None
        if engine is not None:
            harmed = engine.stats.true_harm - self._harm_seen
            self._harm_seen = engine.stats.true_harm
            usage = min(1.0, engine.active_blocks / engine.num_blocks)
        self._admitted(
            self.admission.observe(
                prompt_tokens=max(1, req.input_tokens),
                cached_tokens=min(hit_tokens, max(1, req.input_tokens)),
                pressed=self.now > arrived,
                harmed=harmed,
                kv_usage=usage,
            )
        )
        low, high = self._window_range
        w = self.admission.window
        self._window_range = (min(low, w), max(high, w))

    # ------------------------------------------------------------------ requests
    def _arrive(self, s: SessionState, req: TraceRequest) -> None:
        if self.policy is not None:
            self.policy.on_arrive(s, req, self.now)
        if self._waiting or not self._try(s, req, self.now):
            self._waiting.append((s, req, self.now))
            self.result.deferrals += 1

    def _try(self, s: SessionState, req: TraceRequest, arrived: float) -> bool:
        """Start ``req`` now if the engine serves it; ``False`` leaves it waiting."""
        info = self._tables[s.ordinal][id(req)]
        engine = self.engine
        rid: str | None = None
        n = len(req.block_hashes)
        hits = 0
        if engine is not None:
            bs = engine.block_size
            rid = f"r{self.seq}"
            extra = max(0, math.ceil((req.input_tokens - n * bs + req.output_tokens) / bs))
            if n + extra > engine.num_blocks:
                # larger than the whole pool whatever is cached: served without the cache
                self.result.oversize += 1
                rid = None
            else:
                out = engine.begin(
                    rid,
                    req.block_hashes,  # type: ignore[arg-type]
                    extra_blocks=extra,
                    owner=self.policy.owner_of(s) if self.policy is not None else None,
                )
                if not out.served:
                    return self._blocked(out.action, out.retry_after_s)
                hits = out.hit_blocks
            hit_tokens = min(req.input_tokens, hits * bs)
        else:
            hit_tokens = 0
        res = self.result
        res.requests += 1
        res.prompt_tokens += req.input_tokens
        res.hit_tokens += hit_tokens
        computed = req.input_tokens - hit_tokens
        res.computed_tokens += computed
        res.recomputed_tokens += max(0, (n - hits - info.fresh_blocks)) * (
            engine.block_size if engine else 0
        )
        res.deferral_wait_s += self.now - arrived
        s.extra_s += self.service.prefill_s(max(0, computed - info.timeline_prefill))
        if self.schedule is not None and rid is not None:  # a bypass is no use of the cache
            self.schedule[(s.ordinal, info.index)] = self.seq
        self.seq += 1
        s.running = True
        self.live_blocks += n - s.ctx_blocks
        s.ctx_blocks = n
        if self.live_blocks > self.peak_live_blocks:
            self.peak_live_blocks = self.live_blocks
        if self.policy is not None:
            self.policy.on_begin(s, req, self.now)
        service = self.service.seconds(info.timeline_prefill, req.output_tokens)
        self._push(self.now + service, _FINISH, (s, req, rid))
        if self.admission is not None:
            self._observe(req, hit_tokens, arrived)
        return True

    def _blocked(self, action: ArbiterAction, retry_after_s: float | None) -> bool:
        """The engine deferred or refused the request (claims hold the pool): retry when the
        blocking claims expire (deferral) or after a 1 s back-off (refusal), as the SDK does."""
        if action is ArbiterAction.REFUSE_ACTIVE:
            self.result.refusals += 1
        wait = retry_after_s if retry_after_s is not None else 1.0
        if action is not ArbiterAction.DEFER_ACTIVE or retry_after_s is not None:
            self._stalls += 1
            if not self._retry_pending:
                self._retry_pending = True
                self._push(self.now + wait + 1e-6, _RETRY, None)
        return False

    def _finish(self, s: SessionState, req: TraceRequest, rid: str | None) -> None:
        s.turn += 1
        s.last_stop = req.stop
        s.last_finish = self.now
        s.hashes = req.block_hashes
        s.running = False
        if self.policy is not None:
            self.policy.on_finish(s, req, self.now, self.seq)
        if rid is not None and self.engine is not None:
            self.engine.finish(rid)
        self._advance(s, self.now)
        self._drain()

    def _drain(self) -> None:
        waiting = self._waiting
        while waiting:
            s, req, arrived = waiting[0]
            if not self._try(s, req, arrived):
                return
            self._stalls = 0
            waiting.popleft()

    def _force_head(self) -> None:
        """The head still does not fit after long waiting (claims hold the pool): serve it
        without the cache rather than stall forever; counted as oversize."""
        self._stalls = 0
        s, req, arrived = self._waiting.popleft()
        engine = self.engine
        self.engine = None
        try:
            self._try(s, req, arrived)
        finally:
            self.engine = engine
        self.result.oversize += 1
        self._drain()


def _check_sessions(sessions: int) -> None:
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise UsageError("sessions", f"must be an integer >= 1, got {sessions!r}")


def working_set_blocks(
    traces: TraceInput, sessions: int, service: ServiceModel | None = None
) -> int:
    """Peak over time of the sum of the live sessions' current context sizes, in blocks, on
    the cache-independent timeline (one pass, no engine)."""
    _check_sessions(sessions)
    run = _Replay(traces, None, None, sessions, service or ServiceModel(), False, None)
    run.run()
    return run.peak_live_blocks


def run_replay(
    traces: TraceInput,
    policy: ReplayPolicy,
    *,
    capacity_blocks: int,
    sessions: int = 32,
    block_size: int = 64,
    service: ServiceModel | None = None,
    record: bool = False,
    progress: Callable[[int], None] | None = None,
    engine_factory: Callable[..., ReplayEngine] | None = None,
    admission: AdmissionWindow | None = None,
) -> ReplayResult:
    """Replay ``traces`` on a fresh engine of ``capacity_blocks`` blocks under ``policy``.

    The engine is the one the policy names (``policy.make_engine``: the reference engine, or
    vLLM's pool for the ``-vllm`` rows); ``engine_factory`` overrides it, called as
    ``KVEngine`` is (capacity, block size, ``eviction_policy``, ``clock``, ``policy_name``,
    ``event_buffer``). ``record=True`` keeps each request's start sequence number
    (``result.schedule``), which :class:`~agentclaims.replay.policies.OptimalPolicy` needs as
    its view of the future. ``admission`` bounds the traces running at once (module doc).
    """
    _check_sessions(sessions)
    if (
        isinstance(capacity_blocks, bool)
        or not isinstance(capacity_blocks, int)
        or capacity_blocks < 1
    ):
        raise UsageError("capacity_blocks", f"must be an integer >= 1, got {capacity_blocks!r}")
    clock_box: list[_Replay] = []

    def clock() -> int:
        return int(clock_box[0].now * 1e9) if clock_box else 0

    if engine_factory is None:
        engine = policy.make_engine(capacity_blocks, block_size, clock)
    else:
        engine = engine_factory(
            capacity_blocks,
            block_size,
            eviction_policy=policy.engine_policy(),
            clock=clock,
            policy_name=policy.name,
            event_buffer=REPLAY_EVENT_BUFFER,
        )
    run = _Replay(
        traces, engine, policy, sessions, service or ServiceModel(), record, progress, admission
    )
    clock_box.append(run)
    return run.run()
