"""``KVSide``: what the gateway serves, a claims speaker with active serving."""

from __future__ import annotations

from typing import Protocol

from agentclaims.protocol import ActiveServing, ClaimsProtocol

__all__ = ["KVSide"]


class KVSide(ClaimsProtocol, ActiveServing, Protocol):
    """What the gateway serves: the claims protocol with active serving. ``InstanceControl``
    and a ``metrics()`` method are used if present, and so are a ``lowering`` attribute (its
    lowering descriptor: a document or a file) and a ``runtime_version`` one (the version of
    the runtime it lowers onto). Who writes the replies is a ``ReplyWriter``: the KV side itself
    (``VllmKV``), or a text side over a KV side that tokenizes (``ScriptedWriter``)."""

    block_size: int
