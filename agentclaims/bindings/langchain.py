"""LangChain's ``ChatOpenAI`` bound to an agentclaims backend.

Its HTTP clients use the claims transport (``ClaimsTransport`` for ``ainvoke``/``astream``,
``SyncClaimsTransport`` for ``invoke``/``stream`` from ``def`` nodes), which reads the current
LangGraph node and step from LangChain's run config: prebuilt agents (``create_agent``,
``create_react_agent`` and friends) carry claims without any change to their code.
"""

from __future__ import annotations

from typing import Any

from langchain_openai import ChatOpenAI

from agentclaims.backends.base import Backend
from agentclaims.bindings.openai import (
    claims_http_client,
    claims_sync_http_client,
    client_backend,
)
from agentclaims.session.transport import PLACEHOLDER_KEY

__all__ = ["chat_model"]


def chat_model(backend: Backend, *, model: str = "scripted", **kwargs: Any) -> ChatOpenAI:
    """A ``ChatOpenAI`` whose calls go to ``backend`` with claims (retries owned by the session)."""
    backend = client_backend(backend)
    kwargs.setdefault("api_key", getattr(backend, "api_key", None) or PLACEHOLDER_KEY)
    kwargs.setdefault("max_retries", 0)
    return ChatOpenAI(
        model=model,
        base_url=backend.base_url,
        http_async_client=claims_http_client(backend),
        http_client=claims_sync_http_client(backend),
        **kwargs,
    )
