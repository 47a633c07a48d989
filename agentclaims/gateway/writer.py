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
        reply = await self.text.complete(text_request)
        choice, reply_tokens = self._render(call, reply, segments)
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
