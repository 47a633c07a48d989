"""The agentclaims gateway: one ASGI app, two pluggable halves.

- KV side: anything that speaks the claims protocol with active serving (``KVSide``): the
  reference engine (``agentclaims.engine.ReferenceKV``) by default; a lowering onto a real
  runtime is another.
- Text side: ``ScriptedModel`` (deterministic replies and tool calls); an upstream
  OpenAI-compatible server is the other implementation of ``TextSide``.

``create_app(kv, text)`` is served in-process by ``EmbeddedBackend`` and on a port by
``agentclaims serve``. The wire protocol is in docs/gateway.md.
"""

from agentclaims.gateway.app import Extension, Instance, KVSide, create_app
from agentclaims.gateway.limits import Limits
from agentclaims.gateway.text import Reply, Script, ScriptedModel, TextRequest, TextSide, ToolCall

__all__ = [
    "Extension",
    "Instance",
    "KVSide",
    "Limits",
    "Reply",
    "Script",
    "ScriptedModel",
    "TextRequest",
    "TextSide",
    "ToolCall",
    "create_app",
]
