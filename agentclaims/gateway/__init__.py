"""The agentclaims gateway: one ASGI app, two pluggable halves.

- KV side: ``ReferenceKV`` (the reference engine plus a stand-in tokenizer); a lowering onto a
  real runtime is the other implementation of ``KVSide``.
- Text side: ``ScriptedModel`` (deterministic replies and tool calls); an upstream
  OpenAI-compatible server is the other implementation of ``TextSide`` (not built yet).

``create_app(kv, text)`` is served in-process by ``EmbeddedBackend`` and on a port by
``agentclaims serve``. The wire protocol is in docs/gateway.md.
"""

from agentclaims.gateway.app import Extension, create_app
from agentclaims.gateway.kv import (
    PROMPT_OBJECT,
    SEQUENCE_OBJECT,
    ActiveRequest,
    KVSide,
    ReferenceKV,
    ServeResult,
    ServiceTimes,
)
from agentclaims.gateway.protocol import outcome_from_error
from agentclaims.gateway.text import Reply, Script, ScriptedModel, TextRequest, TextSide, ToolCall
from agentclaims.gateway.tokenizer import ByteTokenizer, Tokenizer, WordTokenizer, tokenizer_named

__all__ = [
    "PROMPT_OBJECT",
    "SEQUENCE_OBJECT",
    "ActiveRequest",
    "ByteTokenizer",
    "Extension",
    "KVSide",
    "ReferenceKV",
    "Reply",
    "Script",
    "ScriptedModel",
    "ServeResult",
    "ServiceTimes",
    "TextRequest",
    "TextSide",
    "Tokenizer",
    "ToolCall",
    "WordTokenizer",
    "create_app",
    "outcome_from_error",
    "tokenizer_named",
]
