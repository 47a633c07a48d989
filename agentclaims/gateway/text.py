"""The text half of the gateway: who writes the replies.

``ScriptedModel`` answers deterministically (for demos and tests, LangGraph agents included);
an upstream OpenAI-compatible server is the other text side, not implemented yet: it would
implement ``TextSide.complete`` by forwarding the request and reading back the reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from agentclaims.engine.blocks import blake2b_hash
from agentclaims.engine.tokenizer import content_text
from agentclaims.errors import UsageError

__all__ = [
    "Reply",
    "Script",
    "ScriptedModel",
    "TextRequest",
    "TextSide",
    "ToolCall",
    "load_script",
]


@dataclass(frozen=True, slots=True)
class TextRequest:
    """What the text side sees of one completion request."""

    kind: str
    """``"chat"`` or ``"completion"``."""
    model: str
    messages: tuple[Mapping[str, Any], ...] = ()
    """Chat messages (empty for a completion)."""
    prompt: str = ""
    """The completion prompt (empty for chat; token-id prompts give their ids as text)."""
    tools: tuple[Mapping[str, Any], ...] = ()
    node: str | None = None
    """The agent node that sent the request (from the extension object), if any."""

    @property
    def turn(self) -> int:
        """How many assistant messages the conversation already holds (0 on the first call)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    @property
    def last_text(self) -> str:
        if self.kind == "completion":
            return self.prompt
        return content_text(self.messages[-1].get("content")) if self.messages else ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call in a scripted reply; ``arguments`` are sent JSON-encoded."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply: text, tool calls, or both."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish: str | None = None
    """Why it ended, where not as its parts say (``length``: cut at ``max_tokens``)."""

    @classmethod
    def text(cls, content: str) -> Reply:
        return cls(content=content)

    @classmethod
    def tool(cls, name: str, arguments: Mapping[str, Any] | None = None) -> Reply:
        return cls(tool_calls=(ToolCall(name, dict(arguments or {})),))

    @property
    def finish_reason(self) -> str:
        return self.finish or ("tool_calls" if self.tool_calls else "stop")

    def message(self, request_key: str) -> dict[str, Any]:
        """The OpenAI assistant message; tool call ids derive from ``request_key`` so that a
        retried request gets the same ids."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": f"call_{blake2b_hash(f'{request_key}:{i}'.encode()):016x}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(dict(call.arguments), sort_keys=True),
                    },
                }
                for i, call in enumerate(self.tool_calls)
            ]
        return msg


class TextSide(Protocol):
    """Writes the reply to a request. Implementations: ``ScriptedModel``; (later) an upstream
    OpenAI-compatible server."""

    name: str

    async def complete(self, request: TextRequest) -> Reply: ...


Script: TypeAlias = (
    "Callable[[TextRequest], Reply | str | None] | Mapping[str, Sequence[Reply | str]]"
)
"""A callable (``None`` means: use the default echo), or a mapping from node name (``"*"`` for
any other node) to the replies of its successive turns (``TextRequest.turn`` picks one; the
last one repeats)."""


ECHO_WORDS = 12
"""The default reply echoes at most this many words of the last message (short replies)."""


class ScriptedModel:
    """Deterministic replies. The same request always gets the same reply (so a deferred and
    retried request is answered as the first try would have been); the default echoes."""

    name = "scripted"

    def __init__(self, script: Script | None = None) -> None:
        if script is not None and not callable(script) and not isinstance(script, Mapping):
            raise UsageError("script", f"expected a callable or a mapping, got {script!r}")
        if isinstance(script, Mapping):
            for node, turns in script.items():
                if isinstance(turns, str | Reply) or not turns:
                    raise UsageError(f"script[{node!r}]", "must be a non-empty sequence of replies")
                for entry in turns:
                    if not isinstance(entry, str | Reply):
                        raise UsageError(f"script[{node!r}]", f"not a reply: {entry!r}")
        self.script = script

    async def complete(self, request: TextRequest) -> Reply:
        return self.reply(request)

    def reply(self, request: TextRequest) -> Reply:
        """The reply to ``request`` (synchronous: scripts never wait)."""
        entry: Reply | str | None = None
        script = self.script
        if isinstance(script, Mapping):
            turns = script.get(request.node or "*") or script.get("*")
            if turns:
                entry = turns[min(request.turn, len(turns) - 1)]
        elif script is not None:
            entry = script(request)
        if entry is None:
            words = request.last_text.split()
            return Reply.text(" ".join(["echo:", *words[:ECHO_WORDS]]))
        if isinstance(entry, str):
            return Reply.text(entry)
        if not isinstance(entry, Reply):
            raise UsageError("script", f"returned {entry!r}, expected a Reply, a str or None")
        return entry


def load_script(text: str, *, where: str = "script") -> dict[str, list[Reply | str]]:
    """A node-keyed script from JSON (``agentclaims serve --script FILE``): ``{node: [reply,
    ...]}``, each reply a string, ``{"tool": name, "arguments": {...}}``, or ``{"content": str
    | null, "tool_calls": [{"name": ..., "arguments": {...}}, ...]}``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(where, f"not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or not data:
        raise UsageError(where, "expected a non-empty object {node: [reply, ...]}")
    script: dict[str, list[Reply | str]] = {}
    for node, turns in data.items():
        if not isinstance(turns, list) or not turns:
            raise UsageError(f"{where}[{node!r}]", "must be a non-empty list of replies")
        script[node] = [_reply(entry, f"{where}[{node!r}][{i}]") for i, entry in enumerate(turns)]
    return script


def _reply(entry: Any, where: str) -> Reply | str:
    if isinstance(entry, str):
        return entry
    if not isinstance(entry, dict):
        raise UsageError(where, f"expected a string or an object, got {entry!r}")
    if "tool" in entry:
        calls = [{"name": entry["tool"], "arguments": entry.get("arguments") or {}}]
        content = entry.get("content")
    else:
        calls = entry.get("tool_calls") or []
        content = entry.get("content")
    if content is not None and not isinstance(content, str):
        raise UsageError(f"{where}.content", f"must be a string or null, got {content!r}")
    if not isinstance(calls, list):
        raise UsageError(f"{where}.tool_calls", "must be a list")
    tool_calls = []
    for j, call in enumerate(calls):
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments") if isinstance(call, dict) else None
        if not isinstance(name, str) or not name:
            raise UsageError(f"{where}.tool_calls[{j}].name", "must be a non-empty string")
        if arguments is not None and not isinstance(arguments, dict):
            raise UsageError(f"{where}.tool_calls[{j}].arguments", "must be an object")
        tool_calls.append(ToolCall(name, dict(arguments or {})))
    if content is None and not tool_calls:
        raise UsageError(where, "a reply needs content or tool calls")
    return Reply(content=content, tool_calls=tuple(tool_calls))
