"""The session API: claimed sessions, the decorator, reactions and the claims transport."""

from agentclaims.session.decorators import ClaimedGraph, SessionDecorator, claimed_session
from agentclaims.session.options import SessionOptions
from agentclaims.session.reactions import ReactionPolicy
from agentclaims.session.session import ClaimedSession, HeldClaim, SessionStats, current_session
from agentclaims.session.transport import ClaimsTransport

__all__ = [
    "ClaimedGraph",
    "ClaimedSession",
    "ClaimsTransport",
    "HeldClaim",
    "ReactionPolicy",
    "SessionDecorator",
    "SessionOptions",
    "SessionStats",
    "claimed_session",
    "current_session",
]
