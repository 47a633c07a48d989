"""A streamed completion on its way from vLLM to the client, read on the way.

vLLM streams server-sent events; the gateway passes each chunk on as it comes (tokens reach the
client as vLLM produces them; those that came together, while the gateway was busy, go on
together: ``batches``) and keeps what it needs of them for the KV life of the request:
the prompt's token ids (vLLM's first chunk, with ``return_token_ids``), the reply's (each
chunk's delta), the finish reason and the usage (vLLM's last chunk, with ``stream_options:
{"include_usage": true}``, asked for whatever the client asked). The client gets the chunks as
it asked for them: without token ids unless it asked for them, without the usage chunk unless
it asked for usage.

``start()`` reads up to the first token (the role chunk vLLM sends first is not one). A request
vLLM ends before its first token (the refusing scheduler aborts it) is then whole, and its
``ServeResult`` says it was not served: the gateway answers the claim-scoped refusal instead of
a stream. Once the stream is exhausted, ``result`` is its ``ServeResult``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agentclaims.protocol import ServeResult
from agentclaims.vllm.upstream import Stream

__all__ = ["UpstreamStream"]

Settle = Callable[[dict[str, Any]], Awaitable[ServeResult]]
"""Turns the answer put together from the stream (shaped as vLLM's answer read whole) into
its ``ServeResult``."""


class UpstreamStream:
    """One streamed completion (see the module)."""

    def __init__(
        self,
        stream: Stream,
        *,
        keep_token_ids: bool,
        include_usage: bool,
        settle: Settle,
        tally: list[int] | None = None,
    ) -> None:
        self._stream = stream
        self._tally = [0, 0] if tally is None else tally  # chunks, batches: added to
        self._events = stream.batches()
        self._keep_ids = keep_token_ids
        self._usage_asked = include_usage
        self._settle = settle
        self._head: list[dict[str, Any]] = []
        self._id: Any = None
        self._prompt: list[int] | None = None
        self._reply: list[int] = []
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._shape: dict[str, Any] = {}
        self.result: ServeResult | None = None
        """The request's KV life, once the stream is exhausted."""

    @property
    def shape(self) -> dict[str, Any]:
        """``id``, ``object``, ``created`` and ``model`` of vLLM's chunks: what a chunk the
        gateway adds to the stream carries too."""
        return dict(self._shape)

    @property
    def usage(self) -> dict[str, Any] | None:
        """vLLM's usage of the whole request (its last chunk)."""
        return self._usage

    async def start(self) -> ServeResult | None:
        """Read up to the first token; ``None`` once it came, else (vLLM ended the request
        before any token) the request's ``ServeResult``."""
        async for batch in self._events:
            began = False
            for event in batch:  # what came with the first token goes with it
                out = self._take(event)
                if out is not None:
                    self._head.append(out)
                began = began or _began(event)
            if began:
                return None
        return await self._settled()

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The chunks as the client gets them, a batch per read of vLLM's stream (those that
        came together): those ``start`` read, then the rest as they come; ``result`` is set
        when they end. No batch is empty."""
        tally = self._tally
        head, self._head = self._head, []
        if head:
            tally[0] += len(head)
            tally[1] += 1
            yield head
        async for batch in self._events:
            out = [chunk for chunk in map(self._take, batch) if chunk is not None]
            if out:
                tally[0] += len(out)
                tally[1] += 1
                yield out
        await self._settled()

    async def aclose(self) -> None:
        """End the stream (early: vLLM aborts the request). Idempotent."""
        await self._events.aclose()
        await self._stream.aclose()

    async def _settled(self) -> ServeResult:
        if self.result is None:
            data = {
                "id": self._id,
                "prompt_token_ids": self._prompt,
                "choices": [{"token_ids": self._reply, "finish_reason": self._finish}],
                "usage": self._usage,
            }
            self.result = await self._settle(data)
        return self.result

    def _take(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Note what ``event`` says; the chunk the client gets of it (``None``: none): the
        event itself, what the client did not ask for taken out (it is this stream's own,
        parsed for it; every token's event comes this way, so nothing is copied)."""
        keep = self._keep_ids
        if "id" in event:
            self._id = event["id"]
        if len(self._shape) < len(_SHAPE):  # the same in every chunk: read until all came
            self._shape.update({k: event[k] for k in _SHAPE if k in event})
        prompt = event.get("prompt_token_ids") if keep else event.pop("prompt_token_ids", None)
        choices = event.get("choices") or []
        for i, choice in enumerate(choices):
            ids = choice.get("prompt_token_ids") if keep else choice.pop("prompt_token_ids", None)
            if prompt is None and i == 0:
                prompt = ids
            ids = choice.get("token_ids") if keep else choice.pop("token_ids", None)
            if i == 0 and isinstance(ids, list):
                self._reply.extend(ids if set(map(type, ids)) <= _INT else map(int, ids))
        if isinstance(prompt, list):
            self._prompt = prompt
        if choices and choices[0].get("finish_reason") is not None:
            self._finish = choices[0]["finish_reason"]
        usage = event.get("usage")
        if usage:
            self._usage = usage
        if not choices and not self._usage_asked:
            return None  # the usage chunk the gateway asked for, not the client
        event.pop("kv_transfer_params", None)
        if not self._usage_asked:
            event.pop("usage", None)
        return event


_SHAPE = ("id", "object", "created", "model")
_INT = {int}


def _began(event: dict[str, Any]) -> bool:
    """Whether ``event`` carries the reply's first token (text, a tool call, or token ids)."""
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or choice.get("text"):
            return True
        if choice.get("token_ids"):
            return True
    return False
