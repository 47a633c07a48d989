"""agentclaims: workflow-level KV residency claims for LLM agents.

The public surface is this module. Heavy parts (the gateway, LangGraph and LangChain bindings)
load on first use, so ``import agentclaims`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims._lazy import lazy
from agentclaims.contract import (
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    OwnerScope,
    PrefixId,
    ProtectionMode,
)
from agentclaims.errors import (
    AgentClaimsError,
    BackendError,
    BackendUnavailable,
    ClaimHarmed,
    ClaimOutcomeError,
    ClaimRefused,
    ContractViolation,
    DeadlineExceeded,
    DescriptorError,
    Forbidden,
    IllegalTransition,
    OperationNotExposed,
    ScopeViolation,
    ServiceUnavailable,
    Unauthorized,
    UnknownClaim,
    UnknownNameError,
    UsageError,
)
from agentclaims.planner import ClaimPlanner, PlannerPolicy

if TYPE_CHECKING:
    from agentclaims.backends.base import Backend
    from agentclaims.backends.embedded import EmbeddedBackend
    from agentclaims.backends.fleet import FleetBackend
    from agentclaims.backends.http import HTTPBackend
    from agentclaims.backends.inprocess import InProcessGateway
    from agentclaims.backends.pool import BackendPool
    from agentclaims.bindings.decorators import ClaimedGraph, ClaimedRun, claimed_session
    from agentclaims.bindings.langchain import chat_model
    from agentclaims.bindings.middleware import ClaimsMiddleware
    from agentclaims.bindings.openai import openai_client, openai_sync_client
    from agentclaims.gateway.text import Reply
    from agentclaims.session import (
        ClaimedSession,
        ReactionPolicy,
        SessionOptions,
        current_session,
    )

__version__ = "0.7.0"

__all__ = [
    "AgentClaimsError",
    "Backend",
    "BackendError",
    "BackendPool",
    "BackendUnavailable",
    "CacheIdentity",
    "ClaimHarmed",
    "ClaimId",
    "ClaimOutcomeError",
    "ClaimPlanner",
    "ClaimRefused",
    "ClaimSpec",
    "ClaimedGraph",
    "ClaimedRun",
    "ClaimedSession",
    "ClaimsMiddleware",
    "ContractViolation",
    "DeadlineExceeded",
    "DescriptorError",
    "EmbeddedBackend",
    "FleetBackend",
    "Forbidden",
    "HTTPBackend",
    "IllegalTransition",
    "InProcessGateway",
    "OperationNotExposed",
    "OwnerScope",
    "PlannerPolicy",
    "PrefixId",
    "ProtectionMode",
    "ReactionPolicy",
    "Reply",
    "ScopeViolation",
    "ServiceUnavailable",
    "SessionOptions",
    "Unauthorized",
    "UnknownClaim",
    "UnknownNameError",
    "UsageError",
    "chat_model",
    "claimed_session",
    "current_session",
    "openai_client",
    "openai_sync_client",
]

_LAZY = {
    "Backend": "agentclaims.backends.base",
    "EmbeddedBackend": "agentclaims.backends.embedded",
    "HTTPBackend": "agentclaims.backends.http",
    "InProcessGateway": "agentclaims.backends.inprocess",
    "BackendPool": "agentclaims.backends.pool",
    "FleetBackend": "agentclaims.backends.fleet",
    "ClaimedGraph": "agentclaims.bindings.decorators",
    "ClaimedRun": "agentclaims.bindings.decorators",
    "Reply": "agentclaims.gateway.text",
    "openai_sync_client": "agentclaims.bindings.openai",
    "ClaimedSession": "agentclaims.session",
    "ReactionPolicy": "agentclaims.session",
    "SessionOptions": "agentclaims.session",
    "claimed_session": "agentclaims.bindings.decorators",
    "current_session": "agentclaims.session",
    "openai_client": "agentclaims.bindings.openai",
    "chat_model": "agentclaims.bindings.langchain",
    "ClaimsMiddleware": "agentclaims.bindings.middleware",
}


__getattr__, __dir__ = lazy(__name__, _LAZY, __all__)
