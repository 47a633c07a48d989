"""Streamed completions: ``stream: true`` answered with server-sent events, as the OpenAI API.

The claim decisions are all made before the first byte: a refused or deferred request is still
an HTTP error (409 / 503, docs/gateway.md), never a stream that breaks off. A served one is
sent as ``data: <chunk>`` events then ``data: [DONE]``:

* chat (``chat.completion.chunk``): a first delta with the role, the content in pieces (a word
  and its trailing space each), each tool call (its id and name, then its arguments), and a
  last delta carrying ``finish_reason`` (and ``stop_reason``, the stop string it ended at,
  where the whole answer has one: Anthropic's ``stop_sequence`` is read from it);
* text (``text_completion``): the text in pieces, then the ``finish_reason``;
* ``stream_options: {"include_usage": true}``: every chunk has ``"usage": null`` and one more
  chunk, with no choices, carries the usage (OpenAI's shape).

The last chunk also carries the ``agentclaims`` object of the non-streamed answer (outcome,
prefix ids, decisions, ``events_seq``) with the ``usage`` added, whether or not the client asked
for usage: the claims transport reads it there to plan the next claim.

A ``ChunkStream`` writes the chunks in batches, those that came from the engine together in one
write; the APIs answered through the chat pipeline (``/v1/messages``, ``/v1/responses``) read
its chunks as objects (``batches``), never the bytes written of them.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

from starlette.responses import JSONResponse as _StarletteJSON
from starlette.responses import Response, StreamingResponse

from agentclaims import _json
from agentclaims.errors import UsageError
from agentclaims.protocol import EXTENSION_KEY

__all__ = [
    "DONE",
    "FLUSH",
    "ChunkStream",
    "JSONResponse",
    "chunks",
    "chunks_of",
    "event",
    "joined",
    "respond",
    "stream_requested",
    "unstreamed",
]

_PIECE = re.compile(r"\s*\S+\s*|\s+")


class JSONResponse(_StarletteJSON):
    """Starlette's JSON response, written by the gateway's codec (``agentclaims._json``);
    without extra headers (every agent's call), its two headers are set in one step."""

    def render(self, content: Any) -> bytes:
        return _json.dumps(content)

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        if headers is not None or self.status_code < 200 or self.status_code in (204, 304):
            super().init_headers(headers)
            return
        self.raw_headers = [
            (b"content-length", str(len(self.body)).encode()),
            (b"content-type", b"application/json"),
        ]


def stream_requested(body: Mapping[str, Any]) -> bool:
    """Whether ``body`` asks for a stream; ``UsageError`` for a malformed ``stream`` or
    ``stream_options``."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise UsageError("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, Mapping):
            raise UsageError("stream_options", f"expected an object, got {options!r}")
        extra = set(options) - {"include_usage", "include_obfuscation"}
        if extra:
            raise UsageError("stream_options", f"unknown fields {sorted(extra)}")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise UsageError(
                "stream_options.include_usage", f"must be true or false, got {usage!r}"
            )
        if not stream:
            raise UsageError("stream_options", "only allowed with stream: true")
    return bool(stream)


def unstreamed(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` without its stream fields: what an upstream engine is asked (the gateway
    streams its whole answer itself)."""
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def respond(body: Mapping[str, Any], answer: Mapping[str, Any], streamed: bool) -> Response:
    """``answer`` (a ``chat.completion`` or ``text_completion`` object) as JSON, or as a
    stream of events when ``body`` asks for one (``streamed``: ``stream_requested(body)``)."""
    if not streamed:
        return JSONResponse(answer)
    options = body.get("stream_options") or {}
    return ChunkStream(
        _one_by_one(chunks(answer, include_usage=bool(options.get("include_usage"))))
    )


DONE = b"data: [DONE]\n\n"
"""The event that ends a stream."""


def event(chunk: Mapping[str, Any]) -> bytes:
    """One server-sent event: ``chunk`` as the ``data:`` of one event."""
    return b"data: " + _json.dumps(chunk) + b"\n\n"


class ChunkStream(StreamingResponse):
    """A completion's chunks as server-sent events (``data: <chunk>``, then ``[DONE]``), a
    write per batch (``batches``: the chunks that came together; never an empty one)."""

    def __init__(self, batches: AsyncIterator[list[dict[str, Any]]]) -> None:
        self.batches = batches
        """The chunks themselves, for an API that writes its own events of them: read these
        or the response, not both."""
        super().__init__(
            _events(batches), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )


async def _events(batches: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    async for batch in batches:
        yield b"".join(map(event, batch))
    yield DONE


FLUSH = b""
"""What an API writing its own events of a ``ChunkStream``'s chunks yields where a batch of
them ended (``chunks_of`` says where): ``joined`` writes what came before it in one piece."""


async def chunks_of(response: ChunkStream) -> AsyncIterator[dict[str, Any] | None]:
    """The chunks of ``response``, in order, each batch followed by ``None``."""
    async for batch in response.batches:
        for chunk in batch:
            yield chunk
        yield None


async def joined(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``pieces`` written a batch at a time: everything up to each ``FLUSH``, and the rest."""
    out: list[bytes] = []
    async for piece in pieces:
        if piece:
            out.append(piece)
        elif out:
            yield b"".join(out)
            out = []
    if out:
        yield b"".join(out)


async def _one_by_one(items: Iterable[dict[str, Any]]) -> AsyncIterator[list[dict[str, Any]]]:
    """Each of ``items`` (a reply written whole, all there) a batch of its own, written on at
    once: no step of the loop, let alone a worker thread, between two."""
    for item in items:
        yield [item]


def _pieces(text: str | None) -> list[str]:
    return _PIECE.findall(text or "")


def chunks(answer: Mapping[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed ``answer``; the last one carries the ``agentclaims`` object."""
    chat = answer.get("object") == "chat.completion"
    head: dict[str, Any] = {
        "id": answer.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": answer.get("created"),
        "model": answer.get("model"),
    }
    if include_usage:
        head["usage"] = None
    choice = (answer.get("choices") or [{}])[0]
    out: list[dict[str, Any]] = []

    def add(**fields: Any) -> None:
        finish = fields.pop("finish_reason", None)
        matched = fields.pop("stop_reason", None)
        if chat:
            part = {"index": 0, "delta": fields, "logprobs": None, "finish_reason": finish}
        else:
            part = {"index": 0, "text": fields.get("text", ""), "logprobs": None}
            part["finish_reason"] = finish
        if matched is not None:  # the stop string it ended at, as vLLM streams it
            part["stop_reason"] = matched
        out.append({**head, "choices": [part]})

    if chat:
        message = choice.get("message") or {}
        add(role="assistant", content="")
        for piece in _pieces(message.get("content")):
            add(content=piece)
        for i, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            opening = {"name": function.get("name"), "arguments": ""}
            opened = {"index": i, "id": call.get("id"), "type": "function", "function": opening}
            add(tool_calls=[opened])
            add(tool_calls=[{"index": i, "function": {"arguments": function.get("arguments")}}])
        add(finish_reason=choice.get("finish_reason"), stop_reason=choice.get("stop_reason"))
    else:
        for piece in _pieces(choice.get("text")):
            add(text=piece)
        add(
            text="",
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
        )
    usage = answer.get("usage")
    if include_usage:
        out.append({**head, "choices": [], "usage": usage})
    extension = answer.get(EXTENSION_KEY)
    if extension is not None:
        out[-1][EXTENSION_KEY] = {**extension, "usage": usage}
    yield from out
