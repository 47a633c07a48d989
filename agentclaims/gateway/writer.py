"""``ScriptedWriter``: replies written by a text side (``ScriptedModel``), the request's blocks
served by a KV side that tokenizes (the reference engine, ``FakeKV``). The gateway's completion
pipeline asks it as it asks ``VllmKV``, which writes its own replies (``ReplyWriter``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from agentclaims.contract import OwnerScope, RequestId
from agentclaims.engine import blake2b_hash
from agentclaims.errors import UsageError
from agentclaims.gateway.limits import Limits
from agentclaims.gateway.text import Reply, TextRequest, TextSide
from agentclaims.protocol import ActiveRequest, ActiveServing, ServeResult, Tokenizer
from agentclaims.protocol.writer import (
    ID_PREFIX,
    CompletionCall,
    ReplyStream,
    Written,
    check_body,
)

__all__ = ["ScriptedWriter", "TokenizingKV"]

_OBJECT = {"chat": "chat.completion", "completion": "text_completion"}


class TokenizingKV(ActiveServing, Protocol):
    """A KV side that serves requests by their token ids, with the tokenizer it hashes."""

    tokenizer: Tokenizer


class ScriptedWriter:
    """The text side writes the reply; the KV side serves its blocks and claims."""

    streams = False
    """Its replies are whole at once: a streamed request gets them as events after."""
    streams_claims = False

    def __init__(self, kv: TokenizingKV, text: TextSide, limits: Limits) -> None:
        tokenizer = getattr(kv, "tokenizer", None)
        if tokenizer is None:
            raise UsageError(
                "text", "this KV side has no tokenizer: it writes its own replies (no text side)"
            )
        self.kv = kv
        self.text = text
        self.tokenizer: Tokenizer = tokenizer
        self.limits = limits

    @property
    def model_name(self) -> str:
        return self.text.name

    def prepare(self, call: CompletionCall) -> CompletionCall:
        """The body checked and tokenized (a message per segment), within the prompt limit."""
        body = call.body
        check_body(call.kind, body)
        _check_scripted(call.kind, body)
        if call.kind == "chat":
            tok = self.tokenizer
            segments = tuple(tuple(tok.encode_message(m)) for m in body["messages"])
        else:
            prompt = _prompt(body)
            segments = (
                tuple(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else prompt,
            )
        tokens = sum(len(s) for s in segments)
        if tokens > self.limits.max_prompt_tokens:
            raise UsageError(
                "messages" if call.kind == "chat" else "prompt",
                f"{tokens} tokens; at most {self.limits.max_prompt_tokens}",
            )
        return replace(call, segments=segments)

    async def write(self, call: CompletionCall) -> Written:
        if call.segments is None:
            call = self.prepare(call)
        segments = call.segments
        assert segments is not None  # prepare sets them
        body = call.body
        model = _model(body) or self.text.name
        if call.kind == "chat":
            text_request = TextRequest(
                kind="chat",
                model=model,
                messages=tuple(body["messages"]),
                tools=tuple(body.get("tools") or ()),
                node=call.node,
            )
        else:
            prompt = _prompt(body)
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            text_request = TextRequest(kind="completion", model=model, prompt=text, node=call.node)
        reply, matched = _limited(await self.text.complete(text_request), body)
        choice, reply_tokens = self._render(call, reply, segments)
        if matched is not None:
            choice["stop_reason"] = matched  # the stop string it ended at, as vLLM says it
        request_id = call.request_id or f"{ID_PREFIX[call.kind]}-{uuid.uuid4().hex}"
        result: ServeResult = await self.kv.serve(
            ActiveRequest(
                request_id=RequestId(request_id),
                segments=segments,
                reply_tokens=reply_tokens,
                claims=call.claims,
                owner_scope=None if call.owner_scope is None else OwnerScope(call.owner_scope),
                admit=call.admit,
                cache_salt=call.cache_salt,
                chat=call.kind == "chat",
            )
        )
        prompt_tokens = sum(len(s) for s in segments)
        payload = {
            "id": result.outcome.request_id,
            "object": _OBJECT[call.kind],
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, **choice, "finish_reason": reply.finish_reason}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(reply_tokens),
                "total_tokens": prompt_tokens + len(reply_tokens),
                "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            },
        }
        return Written(payload, result)

    def _render(
        self, call: CompletionCall, reply: Reply, segments: tuple[tuple[int, ...], ...]
    ) -> tuple[dict[str, Any], tuple[int, ...]]:
        """The choice's payload and the reply's token ids."""
        tok = self.tokenizer
        if call.kind == "chat":
            key = f"{blake2b_hash(json.dumps(segments).encode()):016x}"
            message = reply.message(key)
            return {"message": message, "logprobs": None}, tuple(tok.encode_message(message))
        content = reply.content or ""
        return {"text": content, "logprobs": None}, tuple(tok.encode(content))

    async def stream(self, call: CompletionCall) -> ReplyStream:
        raise UsageError("stream", "a scripted reply is written whole")  # ``streams`` is False


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""OpenAI's chat roles: what the reference engine's chat template reads."""


def _check_scripted(kind: str, body: Mapping[str, Any]) -> None:
    """What the reference engine reads beyond ``check_body``'s shape (vLLM checks its own:
    its roles, images and ``n`` depend on its model): OpenAI's roles, text content parts,
    function tools, one choice, and the types of the sampling fields (``max_tokens`` and
    ``stop`` are honoured), ``user``, ``metadata`` and ``seed``."""
    if kind == "chat":
        for i, message in enumerate(body["messages"]):
            role = message.get("role")
            if role not in _ROLES:
                raise UsageError(
                    f"messages[{i}].role", f"must be one of {sorted(_ROLES)}, got {role!r}"
                )
            content = message.get("content")
            parts = content if isinstance(content, list) else ()
            if content is not None and not isinstance(content, str | list):
                raise UsageError(
                    f"messages[{i}].content",
                    f"expected a string or a list of parts, got {content!r}",
                )
            for j, part in enumerate(parts):
                kind_of = part.get("type") if isinstance(part, Mapping) else None
                if kind_of != "text" or not isinstance(part.get("text"), str):
                    raise UsageError(
                        f"messages[{i}].content[{j}]",
                        f"the reference engine reads text parts only, got {part!r}",
                    )
    for i, tool in enumerate(body.get("tools") or ()):  # check_body: a list of objects
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, Mapping):
            raise UsageError(f"tools[{i}]", 'must be {"type": "function", "function": {...}}')
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise UsageError(f"tools[{i}].function.name", "must be a non-empty string")
    user, metadata, seed = body.get("user"), body.get("metadata"), body.get("seed")
    if user is not None and not isinstance(user, str):
        raise UsageError("user", f"must be a string, got {user!r}")
    if metadata is not None and not (
        isinstance(metadata, Mapping) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise UsageError("metadata", f"must be an object of strings, got {metadata!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UsageError("seed", f"must be an integer, got {seed!r}")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(name, f"must be an integer >= 1, got {value!r}")
    if body.get("n", 1) != 1:
        raise UsageError("n", f"the reference engine writes one choice, got {body['n']!r}")
    for name, most in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most
        ):
            raise UsageError(name, f"must be a number in [0, {most:g}], got {value!r}")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stop is not None and (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise UsageError("stop", f"must be a string or a list of at most 4 strings, got {stop!r}")


def _limited(reply: Reply, body: Mapping[str, Any]) -> tuple[Reply, str | None]:
    """A text reply as ``stop`` and ``max_tokens`` (``max_completion_tokens``) end it: cut
    before the first stop string (``finish_reason`` ``stop``; the string is returned), or
    after that many words, a word a token (``length``). A reply of tool calls is whole."""
    text = reply.content
    if text is None or reply.tool_calls:
        return reply, None
    stop = body.get("stop")
    found = [(text.find(s), s) for s in ([stop] if isinstance(stop, str) else stop or ())]
    at, matched = min(((i, s) for i, s in found if i >= 0), default=(-1, None))
    if matched is not None:
        text = text[:at]
    most = body.get("max_completion_tokens") or body.get("max_tokens")
    words = text.split()
    if isinstance(most, int) and len(words) > most:
        return replace(reply, content=" ".join(words[:most]), finish="length"), None
    return (reply, None) if matched is None else (replace(reply, content=text), matched)


def _model(body: Mapping[str, Any]) -> str | None:
    value = body.get("model")
    if value is not None and (not isinstance(value, str) or not value):
        raise UsageError("model", f"must be a non-empty string, got {value!r}")
    return value


def _prompt(body: Mapping[str, Any]) -> str | tuple[int, ...]:
    """A completion's prompt (``check_body`` checked it): its text, or its token ids."""
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tuple(prompt)
