"""Exceptions raised by agentclaims.

Expected outcomes (a claim refused, an active request deferred, no room) are values and
events, not exceptions. Exceptions are for misuse, for broken invariants, and for the
user-facing ``fail`` reaction::

    AgentClaimsError
     +-- UsageError (also ValueError)          bad input: names the field that is wrong
     |    +-- UnknownNameError                 an unknown mode, policy, backend, ... name
     |    +-- DescriptorError                  a lowering descriptor that does not parse:
     |                                         names the file and each field that is wrong
     +-- ContractViolation                     the contract forbids this
     |    +-- IllegalTransition                a claim state change the state machine forbids
     |    +-- ScopeViolation                   one owner touching another owner's claim
     |    +-- UnknownClaim (also KeyError)     no claim with that id (in this scope)
     +-- ClaimOutcomeError                     the session's reaction to an outcome is ``fail``;
     |    |                                    ``.outcome`` is the typed outcome that decided it
     |    +-- ClaimRefused                     a residency claim or an active request was refused
     |    +-- ClaimHarmed                      an accepted claim lost its blocks (true harm)
     |    +-- DeadlineExceeded                 deferral ran past the session's deadline
     +-- Unauthorized                          no valid API key (a gateway with tenants): 401
     +-- Forbidden                             another tenant's owner scope, an operator route
     +-- BackendError                          the backend could not be reached or answered badly
          +-- BackendUnavailable               connection refused, server down, closed backend
          |    +-- ServiceUnavailable          the gateway is stopping or its ledger is unusable
          +-- OperationNotExposed              the backend does not offer an operation

Every error raised on bad input changes no state: the check happens before the change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentclaims.contract import ClaimEvent
    from agentclaims.protocol.types import ActiveOutcome, ClaimDecision

__all__ = [
    "AgentClaimsError",
    "BackendError",
    "BackendUnavailable",
    "ClaimHarmed",
    "ClaimOutcomeError",
    "ClaimRefused",
    "ContractViolation",
    "DeadlineExceeded",
    "DescriptorError",
    "Forbidden",
    "IllegalTransition",
    "OperationNotExposed",
    "ScopeViolation",
    "ServiceUnavailable",
    "Unauthorized",
    "UnknownClaim",
    "UnknownNameError",
    "UsageError",
]


class AgentClaimsError(Exception):
    """Root of every exception agentclaims raises on purpose."""


class UsageError(AgentClaimsError, ValueError):
    """A value given to a public entry point is wrong; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownNameError(UsageError):
    """A name (mode, policy, backend, level, ...) that is not one of the known ones."""

    def __init__(self, field: str, value: object, known: Sequence[str]) -> None:
        super().__init__(field, f"unknown value {value!r}; expected one of {', '.join(known)}")
        self.value = value
        self.known = tuple(known)


class DescriptorError(UsageError):
    """A lowering descriptor that did not parse (bad YAML, a wrong type, an unknown version or
    field). ``file`` names it; ``problems`` is every ``(field, message)`` found, the first also
    being ``field`` and ``message``. Its text is one ``FILE: FIELD: message`` line per problem."""

    def __init__(self, file: str, problems: Sequence[tuple[str, str]]) -> None:
        if not problems:
            raise ValueError("a DescriptorError needs at least one problem")
        super().__init__(*problems[0])
        self.file = file
        self.problems = tuple(problems)
        self.args = ("\n".join(f"{file}: {field}: {why}" for field, why in self.problems),)


class ContractViolation(AgentClaimsError):
    """An operation the Resident KV Claims contract forbids."""


class IllegalTransition(ContractViolation):
    """A claim state change that the lifecycle state machine does not allow."""

    def __init__(self, claim_id: str, current: str, target: str) -> None:
        super().__init__(f"claim {claim_id!r}: illegal transition {current} -> {target}")
        self.claim_id = claim_id
        self.current = current
        self.target = target


class ScopeViolation(ContractViolation):
    """An owner tried to renew, release or read a claim of another owner."""

    def __init__(self, claim_id: str, owner_scope: str) -> None:
        super().__init__(f"claim {claim_id!r} is not in owner scope {owner_scope!r}")
        self.claim_id = claim_id
        self.owner_scope = owner_scope


class UnknownClaim(ContractViolation, KeyError):
    """No claim with this id exists (or none is visible to this owner)."""

    def __init__(self, claim_id: str) -> None:
        super().__init__(f"no claim {claim_id!r}")
        self.claim_id = claim_id

    def __str__(self) -> str:  # KeyError would quote the message again
        return str(self.args[0])


class ClaimOutcomeError(AgentClaimsError):
    """Raised by the ``fail`` reaction. ``outcome`` is what the backend answered: the
    ``ActiveOutcome`` of an active request (action, feasibility, shortfall, blocking claims) or
    the ``ClaimDecision`` of a residency claim; ``event`` the event that decided it, if any."""

    def __init__(
        self,
        message: str,
        *,
        outcome: ActiveOutcome | ClaimDecision | None = None,
        claim_id: str | None = None,
        event: ClaimEvent | None = None,
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.event = event
        blocking = tuple(getattr(outcome, "blocking_claim_ids", ()))
        self.claim_id: str | None = (
            claim_id
            or getattr(outcome, "claim_id", None)
            or getattr(event, "claim_id", None)
            or (blocking[0] if blocking else None)
        )
        """The claim concerned: the refused or harmed one, else the first blocking claim."""

    @property
    def blocking_claim_ids(self) -> tuple[str, ...]:
        """The claims whose blocks stood in the way (empty for a refused residency claim)."""
        return tuple(getattr(self.outcome, "blocking_claim_ids", ()))

    @property
    def shortfall_blocks(self) -> int:
        return int(getattr(self.outcome, "shortfall_blocks", 0))


class ClaimRefused(ClaimOutcomeError):
    """A residency claim or an active request was refused and the policy says fail."""


class ClaimHarmed(ClaimOutcomeError):
    """An accepted claim was harmed (its predicate held, then failed without release)."""


class DeadlineExceeded(ClaimOutcomeError):
    """Deferring a refused request ran past the session's deadline."""


class BackendError(AgentClaimsError):
    """The backend answered in a way agentclaims cannot use."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached (server down, connection refused, closed)."""


class OperationNotExposed(BackendError):
    """The backend does not offer an operation (a conformance level is then ``not_exposed``)."""

    def __init__(self, backend: str, operation: str) -> None:
        super().__init__(f"backend {backend!r} does not expose {operation}")
        self.backend = backend
        self.operation = operation


class Unauthorized(AgentClaimsError):
    """The request carries no valid API key (the gateway has keys configured)."""


class Forbidden(AgentClaimsError):
    """The caller's key does not allow this: another tenant's owner scope, or an operator
    route (metrics, instance control) asked for with a tenant's key."""


class ServiceUnavailable(BackendUnavailable):
    """The gateway is shutting down, its claim ledger is unusable, or the engine behind it is
    dead (a gateway on vLLM): nothing was changed; HTTP 503 ``unavailable``."""
