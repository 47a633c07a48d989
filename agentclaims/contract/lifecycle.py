"""The claim lifecycle: one state machine, shared by the engine, the SDK and every observer.

::

    submitted --+--> accepted --+--> materialized --+--> demoted
                |               |                   +--> expired
                +--> refused    +--> demoted        +--> harmed
                                +--> expired

A release is not a state: it ends a live claim as ``expired`` (reason ``released``).
Every transition out of a terminal state, and every skip, is an ``IllegalTransition``.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentclaims.contract.names import ClaimState
from agentclaims.errors import IllegalTransition

__all__ = ["LEGAL_TRANSITIONS", "check_transition"]

_S = ClaimState
LEGAL_TRANSITIONS: Mapping[ClaimState, frozenset[ClaimState]] = {
    _S.SUBMITTED: frozenset({_S.ACCEPTED, _S.REFUSED}),
    _S.ACCEPTED: frozenset({_S.MATERIALIZED, _S.DEMOTED, _S.EXPIRED}),
    _S.MATERIALIZED: frozenset({_S.DEMOTED, _S.EXPIRED, _S.HARMED}),
    _S.REFUSED: frozenset(),
    _S.DEMOTED: frozenset(),
    _S.EXPIRED: frozenset(),
    _S.HARMED: frozenset(),
}


def check_transition(claim_id: str, current: ClaimState, target: ClaimState) -> ClaimState:
    """Return ``target`` if ``current -> target`` is legal, else raise ``IllegalTransition``."""
    if target not in LEGAL_TRANSITIONS[current]:
        raise IllegalTransition(claim_id, current.value, target.value)
    return target
