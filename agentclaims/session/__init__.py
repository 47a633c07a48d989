"""The session API: claimed sessions, reactions and the claims transport.

The ``@claimed_session`` decorator and ``ClaimedGraph`` sit one layer up, in
:mod:`agentclaims.bindings.decorators` (they bind a session to a LangGraph graph); the package
``agentclaims`` exports them.
"""

from agentclaims.session.options import SessionOptions
from agentclaims.session.reactions import ReactionPolicy
from agentclaims.session.session import ClaimedSession, HeldClaim, SessionStats, current_session
from agentclaims.session.transport import ClaimsTransport

__all__ = [
    "ClaimedSession",
    "ClaimsTransport",
    "HeldClaim",
    "ReactionPolicy",
    "SessionOptions",
    "SessionStats",
    "current_session",
]
