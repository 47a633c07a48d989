"""What the replay harness and its policies share: sessions, the service-time model, hooks.

A replay policy is an engine :class:`~agentclaims.engine.EvictionPolicy` that also hears what a
serving system (plus the agent SDK beside it) knows as the replay runs: a request arrived,
started, finished (with its stop reason), a parent started waiting for sub-agents, a sub-agent
returned, time passed. Online policies use only these; the optimum alone is also handed the
future (:meth:`PolicyHooks.on_trace` with the recorded schedule).

A policy also names the engine it runs on (``make_engine``): the reference
:class:`~agentclaims.engine.KVEngine` ranked by the policy, by default, or a model of vLLM's
pool (:mod:`agentclaims.replay.vllm_pool`). What the harness asks of either is
:class:`ReplayEngine`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentclaims.engine import BlockHash, EngineStats, EvictionPolicy, KVEngine
from agentclaims.errors import UsageError
from agentclaims.protocol.types import ActiveOutcome

if TYPE_CHECKING:
    from agentclaims.replay.traces import SessionScript, Trace, TraceRequest

__all__ = [
    "CountsClaimEvents",
    "PolicyHooks",
    "ReplayEngine",
    "ReplayPolicy",
    "ServiceModel",
    "SessionState",
]

REPLAY_EVENT_BUFFER = 64
"""Events an engine of the replay keeps (nobody reads the stream back in a replay)."""


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Modelled seconds a request runs: prefill of the tokens it computes plus decode of its
    output, at fixed per-token rates (defaults: a large model on one serving replica)."""

    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            value = getattr(self, name)
            if not value > 0:
                raise UsageError(name, f"must be positive, got {value!r}")

    def prefill_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s

    def seconds(self, prefill_tokens: int, output_tokens: int) -> float:
        return prefill_tokens / self.prefill_tokens_per_s + output_tokens / self.decode_tokens_per_s


@dataclass(eq=False, slots=True)
class SessionState:
    """One running session (a trace's root or a sub-agent) as the serving side sees it."""

    sid: int
    name: str
    kind: str
    """``main`` or the sub-agent's type."""
    ordinal: int
    """The trace's position in file order."""
    parent: SessionState | None
    script: SessionScript
    turn: int = 0
    """Requests finished so far."""
    last_stop: str = ""
    """Stop reason of the last finished response (``tool_use``, ``end_turn``, ``""``)."""
    last_finish: float = 0.0
    hashes: tuple[int, ...] = ()
    """Block hashes of the session's latest request: its current context."""
    running: bool = False
    waiting_subagents: int = 0
    done: bool = False
    # harness bookkeeping
    step: int = 0
    extra_s: float = 0.0
    group_extra_s: float = 0.0
    started_at: float = 0.0
    ctx_blocks: int = 0
    children: list[SessionState] = field(default_factory=list)


class ReplayEngine(Protocol):
    """What the harness asks of the engine a replay runs on: start a request over its block
    hashes (served, or deferred/refused with a retry hint), finish it, and the counters the
    report reads. :class:`~agentclaims.engine.KVEngine` is one;
    :class:`~agentclaims.replay.vllm_pool.VllmPoolEngine` another."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def stats(self) -> EngineStats:
        """``true_harm``: claims that lost blocks without a release, the report's column."""

    @property
    def active_blocks(self) -> int:
        """Blocks running requests hold."""

    @property
    def protected_resident_blocks(self) -> int:
        """Resident blocks claims shield from eviction now."""

    def begin(
        self,
        request_id: str,
        block_hashes: Sequence[BlockHash],
        *,
        extra_blocks: int = 0,
        owner: str | None = None,
    ) -> ActiveOutcome: ...

    def finish(self, request_id: str) -> None: ...


@runtime_checkable
class CountsClaimEvents(Protocol):
    """An engine that counts its claim events by name (vLLM's pool with the connector): the
    replay reports them (``ReplayResult.claim_events``)."""

    def claim_event_counts(self) -> dict[str, int]: ...


class ReplayPolicy(Protocol):
    """What a replay runs: the engine (``make_engine``) with its eviction policy
    (``engine_policy``; an anchor policy is one itself) and what hears the replay's events (see
    :class:`PolicyHooks`)."""

    name: str
    protected_blocks: int

    def engine_policy(self) -> EvictionPolicy: ...

    def make_engine(
        self, capacity_blocks: int, block_size: int, clock: Callable[[], int]
    ) -> ReplayEngine: ...

    def attach(self, engine: ReplayEngine) -> None: ...
    def on_trace(self, trace: Trace, ordinal: int) -> None: ...
    def on_trace_end(self, ordinal: int) -> None: ...
    def advance(self, now: float) -> None: ...
    def on_arrive(self, session: SessionState, request: TraceRequest, now: float) -> None: ...
    def on_begin(self, session: SessionState, request: TraceRequest, now: float) -> None: ...
    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None: ...
    def on_wait(self, session: SessionState, now: float) -> None: ...
    def on_session_end(self, session: SessionState, now: float) -> None: ...
    def owner_of(self, session: SessionState) -> str | None: ...


class PolicyHooks:
    """No-op hooks; a policy overrides the ones it needs.

    Order per request: ``on_arrive`` (it reached the server), ``on_begin`` (after the engine
    served it), ``on_finish`` (before the engine parks its blocks, so ``insert`` sees fresh
    metadata). ``next_seq`` is the start sequence number the next request will get.
    """

    name: str
    """The row's name (each policy sets it)."""
    protected_blocks: int = 0
    """Blocks the policy currently shields from eviction (pins), for the report."""

    def engine_policy(self) -> EvictionPolicy:
        """The engine's eviction policy: the policy itself (the anchors are engine policies)."""
        assert isinstance(self, EvictionPolicy)
        return self

    def make_engine(
        self, capacity_blocks: int, block_size: int, clock: Callable[[], int]
    ) -> ReplayEngine:
        """The engine the policy runs on: the reference engine, ranked by ``engine_policy``
        (``clock() -> ns``: the replay's virtual clock)."""
        return KVEngine(
            capacity_blocks,
            block_size,
            eviction_policy=self.engine_policy(),
            clock=clock,
            policy_name=self.name,
            event_buffer=REPLAY_EVENT_BUFFER,
        )

    def attach(self, engine: ReplayEngine) -> None:
        return None

    def on_trace(self, trace: Trace, ordinal: int) -> None:
        return None

    def on_trace_end(self, ordinal: int) -> None:
        return None

    def advance(self, now: float) -> None:
        return None

    def on_arrive(self, session: SessionState, request: TraceRequest, now: float) -> None:
        return None

    def on_begin(self, session: SessionState, request: TraceRequest, now: float) -> None:
        return None

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        return None

    def on_wait(self, session: SessionState, now: float) -> None:
        return None

    def on_session_end(self, session: SessionState, now: float) -> None:
        return None

    def owner_of(self, session: SessionState) -> str | None:
        """The owner the engine groups the session's blocks under (``None``: not told)."""
        return None
