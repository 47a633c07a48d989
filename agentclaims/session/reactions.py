"""Reactions to refusal outcomes: defer, reroute, relax, or fail.

A refused or deferred active request comes back from the gateway as an HTTP error whose body
carries the arbiter's typed ``ActiveOutcome`` (``agentclaims.protocol.outcome_from_error``). The session's ``ReactionPolicy`` decides what to do:

- ``defer``: wait and retry (tenacity: exponential backoff with jitter, honouring the server's
  ``Retry-After``), bounded by the policy's deadline;
- ``reroute``: move the session to another backend of its pool (preferring one where the prefix
  is resident) and retry there; with no other backend, defer;
- ``relax``: retry refused residency claims one mode weaker (also done under ``defer`` and
  ``reroute``: see ``relax_claims``); for refused requests it waits like ``defer``;
- ``fail``: raise ``ClaimRefused`` naming the claims and the outcome.

Events taken after every call are reacted to as well: a held claim demoted or expired while
its node still waits is renewed, re-planned or dropped (``on_lapsed``); a harmed one is logged
with its cause and counted, and under ``fail`` raises ``ClaimHarmed`` (``on_harmed``).

A deferral (HTTP 503) is always waited out, whatever the policy, except under ``fail``. Whatever
the policy, a session never waits on itself: when the blocking claims are its own, it relaxes
them at once and retries.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import tenacity

from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.protocol import ActiveOutcome

__all__ = [
    "HARMS",
    "LAPSES",
    "REACTIONS",
    "UNPROVEN",
    "ReactionPolicy",
    "RetryAfterWait",
    "RetryRequested",
]

ReactionKind = Literal["defer", "reroute", "relax", "fail"]
REACTIONS: tuple[ReactionKind, ...] = ("defer", "reroute", "relax", "fail")
LapseKind = Literal["renew", "replan", "drop"]
LAPSES: tuple[LapseKind, ...] = ("renew", "replan", "drop")
HarmKind = Literal["log", "fail"]
HARMS: tuple[HarmKind, ...] = ("log", "fail")
UnprovenKind = Literal["relax", "refuse"]
UNPROVEN: tuple[UnprovenKind, ...] = ("relax", "refuse")


@dataclass(frozen=True, slots=True)
class ReactionPolicy:
    """How a session reacts to refusals. ``ReactionPolicy.named("reroute")`` etc."""

    on_refused: ReactionKind = "defer"
    deadline_s: float = 30.0
    """Total time one LLM call may spend deferring before ``DeadlineExceeded``."""
    initial_delay_s: float = 0.02
    max_delay_s: float = 1.0
    jitter_s: float = 0.02
    relax_claims: bool = True
    """When a residency claim is refused, retry it one mode weaker (down to best_effort)."""
    on_lapsed: LapseKind = "replan"
    """A held claim demoted or expired while its node still waits: ``renew`` it (re-planned
    when the backend will not), ``replan`` a new claim on the prefix, or ``drop`` it."""
    on_harmed: HarmKind | None = None
    """A held claim harmed (its KV lost while promised): always logged and counted; ``fail``
    raises ``ClaimHarmed`` at the session's next call. ``None``: ``fail`` under the ``fail``
    reaction, else ``log``."""
    on_unproven: UnprovenKind = "relax"
    """A claim in a mode the backend does not honour (its lowering descriptor, as checked, is
    below ``adapter_policy`` for the mode: an approximation, an observer, rejected or unknown)
    is never submitted: it is refused locally (``refuse_residency_claim``, counted as refused,
    logged with the reason), then ``relax``: planned again in the strongest weaker mode the
    backend honours (logged ``reaction_relax``), or ``refuse``: no claim (``reaction_refuse``)."""

    def __post_init__(self) -> None:
        if self.on_refused not in REACTIONS:
            raise UnknownNameError("reaction", self.on_refused, REACTIONS)
        if self.on_lapsed not in LAPSES:
            raise UnknownNameError("reaction.on_lapsed", self.on_lapsed, LAPSES)
        if self.on_harmed is None:
            object.__setattr__(self, "on_harmed", "fail" if self.on_refused == "fail" else "log")
        if self.on_harmed not in HARMS:
            raise UnknownNameError("reaction.on_harmed", self.on_harmed, HARMS)
        if self.on_unproven not in UNPROVEN:
            raise UnknownNameError("reaction.on_unproven", self.on_unproven, UNPROVEN)
        if not isinstance(self.relax_claims, bool):
            raise UsageError(
                "reaction.relax_claims", f"must be True or False, got {self.relax_claims!r}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not (
                not isinstance(value, bool)
                and isinstance(value, int | float)
                and math.isfinite(value)
                and value >= 0
            ):
                raise UsageError(
                    f"reaction.{f.name}", f"must be a finite number >= 0, got {value!r}"
                )

    @classmethod
    def named(cls, name: str) -> ReactionPolicy:
        if name not in REACTIONS:
            raise UnknownNameError("reaction", name, REACTIONS)
        return cls(on_refused=name)

    def with_(self, **changes: Any) -> ReactionPolicy:
        return replace(self, **changes)

    def retrying(
        self,
        sleep: Any,
        before_sleep: Any = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        started: float | None = None,
    ) -> tenacity.AsyncRetrying:
        """The tenacity loop that waits out deferrals (``RetryRequested`` exceptions); the
        deadline is measured on ``clock`` (the session's, so tests inject it with ``sleep``)
        from ``started`` (default: now; a call whose first try went before the loop: then)."""
        if started is None:
            started = clock()

        def past_deadline(state: tenacity.RetryCallState) -> bool:
            """Stop at the deadline, or now when the server's Retry-After would cross it."""
            elapsed = clock() - started
            exc = state.outcome.exception() if state.outcome is not None else None
            asked = exc.retry_after_s if isinstance(exc, RetryRequested) else None
            return elapsed >= self.deadline_s or elapsed + (asked or 0.0) > self.deadline_s

        backoff = tenacity.wait_exponential_jitter(
            multiplier=self.initial_delay_s, max=self.max_delay_s, jitter=self.jitter_s
        )
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(RetryRequested),
            wait=RetryAfterWait(backoff),
            stop=past_deadline,
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )


class RetryRequested(Exception):
    """Internal: raised inside the retry loop to wait and try again."""

    def __init__(self, outcome: ActiveOutcome, retry_after_s: float | None) -> None:
        super().__init__(outcome.action.value)
        self.outcome = outcome
        self.retry_after_s = retry_after_s


class RetryAfterWait(tenacity.wait.wait_base):
    """Wait what the server asked for (``Retry-After``), else fall back to ``fallback``."""

    def __init__(self, fallback: tenacity.wait.wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, RetryRequested) and exc.retry_after_s is not None:
            return max(0.0, exc.retry_after_s)
        return float(self.fallback(retry_state))
