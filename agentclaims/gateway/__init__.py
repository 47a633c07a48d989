"""The agentclaims gateway: one ASGI app, two pluggable halves.

- KV side: anything that speaks the claims protocol with active serving (``KVSide``): the
  reference engine (``agentclaims.engine.ReferenceKV``) by default; a lowering onto a real
  runtime is another.
- Who writes the replies (``agentclaims.protocol.ReplyWriter``): a text side
  (``ScriptedModel``: deterministic replies and tool calls) over a KV side that tokenizes
  (``ScriptedWriter``), or the KV side itself when a real engine answers (``VllmKV``).

``create_app(kv, text)`` (``create_app(kv)`` for a KV side that writes its replies) is served
in-process by ``EmbeddedBackend`` and on a port by ``agentclaims serve``. One completion
pipeline serves both. The wire protocol is in docs/gateway.md.
"""

from agentclaims.gateway.app import Extension, Instance, KVSide, create_app
from agentclaims.gateway.limits import Limits
from agentclaims.gateway.text import Reply, Script, ScriptedModel, TextRequest, TextSide, ToolCall
from agentclaims.gateway.writer import ScriptedWriter

__all__ = [
    "Extension",
    "Instance",
    "KVSide",
    "Limits",
    "Reply",
    "Script",
    "ScriptedModel",
    "ScriptedWriter",
    "TextRequest",
    "TextSide",
    "ToolCall",
    "create_app",
]
