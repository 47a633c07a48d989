"""``POST /v1/responses``: the OpenAI Responses API on the gateway.

The OpenAI Agents SDK and ``ChatOpenAI(use_responses_api=True)`` send Responses requests; the
gateway turns each into the chat completion it means (``input`` items as messages,
``instructions`` as the system message, function tools and their calls and outputs), runs it
through the one completion pipeline (claims, tenants, the ledger, the engine's refusals, the
``prompt_cache_key`` / ``prompt_cache_retention`` claim), and answers as the Responses API
does: a ``response`` object whose ``output`` holds a ``message`` and ``function_call`` items,
or, streamed, its events (``response.created`` ... ``response.output_text.delta`` ...
``response.completed``, each numbered). The ``agentclaims`` object rides on the response (on
``response.completed``'s when streamed). Nothing is stored: ``previous_response_id`` and
``store: true`` are refused (400), as are built-in tools.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from agentclaims import _json
from agentclaims.errors import UsageError
from agentclaims.gateway.params import json_object
from agentclaims.gateway.streaming import FLUSH, ChunkStream, JSONResponse, chunks_of, joined
from agentclaims.protocol import EXTENSION_KEY

if TYPE_CHECKING:
    from agentclaims.gateway.completions import CompletionRoutes

__all__ = ["ResponsesRoute", "to_chat"]

_PASSED = ("temperature", "top_p", "prompt_cache_key", "prompt_cache_retention", EXTENSION_KEY)


def _fail(name: str, why: str) -> UsageError:
    return UsageError(name, why)


def _text(content: object, where: str) -> str:
    """A message's content: a string, or input/output text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(where, f"must be a string or a list of content parts, got {content!r}")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text"):
            raise _fail(f"{where}[{i}].type", f"{kind!r} parts are not supported here")
        text = part.get("text")
        if not isinstance(text, str):
            raise _fail(f"{where}[{i}].text", "must be a string")
        parts.append(text)
    return "".join(parts)


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion a Responses request means; ``UsageError`` naming the bad field."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "must be a non-empty string")
    if body.get("previous_response_id") is not None:
        raise _fail("previous_response_id", "responses are not stored here: send the input")
    if body.get("store") is True:
        raise _fail("store", "responses are not stored here: send store: false")
    metadata, user = body.get("metadata"), body.get("user")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise _fail("metadata", f"expected an object, got {metadata!r}")
    if user is not None and not isinstance(user, str):
        raise _fail("user", f"must be a string, got {user!r}")
    if body.get("background") is True:
        raise _fail(
            "background", "responses are not stored here to be polled: send it in the foreground"
        )
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _fail("instructions", "must be a string")
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        for i, item in enumerate(raw):
            _item(item, f"input[{i}]", messages)
    else:
        raise _fail("input", "must be a string or a non-empty list of items")
    chat: dict[str, Any] = {"model": model, "messages": messages}
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _fail("max_output_tokens", f"must be an integer >= 1, got {limit!r}")
        chat["max_tokens"] = limit
    for name in _PASSED:
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _fail("tools", "must be a list")
    chat_tools = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise _fail(f"tools[{i}].type", "only function tools are served here")
        if not isinstance(tool.get("name"), str):
            raise _fail(f"tools[{i}].name", "must be a string")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        chat_tools.append({"type": "function", "function": function})
    choice = _tool_choice(body.get("tool_choice"))
    if chat_tools:
        chat["tools"] = chat_tools
        if choice is not None:
            chat["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _fail("stream", f"must be true or false, got {stream!r}")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _tool_choice(choice: object) -> object:
    """The chat's ``tool_choice`` for a Responses one (``None``: none given)."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise _fail("tool_choice.name", f"must be a string, got {choice.get('name')!r}")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _fail(
        "tool_choice",
        f'must be "auto", "none", "required" or {{"type": "function", "name": ...}}, '
        f"got {choice!r}",
    )


def _format(text: object) -> dict[str, Any] | None:
    """The chat's ``response_format`` for a Responses ``text.format`` (``None``: plain text),
    so that a structured output (the Agents SDK's ``output_type``) is asked of the engine as a
    chat completion asks it, not dropped."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise _fail("text", f"expected an object, got {text!r}")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, Mapping)
        if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), Mapping):
            raise _fail("text.format", "a json_schema format needs a string name and a schema")
        schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise _fail("text.format.type", f'must be "text", "json_object" or "json_schema", got {kind!r}')


def _item(item: object, where: str, messages: list[dict[str, Any]]) -> None:
    """One input item into the chat messages (function calls join the assistant message
    before them)."""
    if not isinstance(item, Mapping):
        raise _fail(where, f"expected an object, got {item!r}")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role == "developer":
            role = "system"
        if role not in ("user", "assistant", "system"):
            raise _fail(
                f"{where}.role", f"must be user, assistant, system or developer, got {role!r}"
            )
        messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise _fail(where, "a function_call needs a string call_id and name")
        arguments = item.get("arguments") or "{}"
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str):
            raise _fail(f"{where}.call_id", "must be a string")
        if not isinstance(output, str):
            output = json.dumps(output)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind == "reasoning":
        return  # a model's own reasoning summary: nothing for this engine to read
    else:
        raise _fail(f"{where}.type", f"{kind!r} items are not supported here")


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    output = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": min(cached, prompt)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _shell(body: Mapping[str, Any], resp_id: str, status: str) -> dict[str, Any]:
    """A response object without its output yet."""
    return {
        "id": resp_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": body.get("model"),
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "store": False,
        "error": None,
        "incomplete_details": None,
        "metadata": body.get("metadata") or {},
        "usage": None,
    }


def _message_item(text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    call_id = call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": function.get("name", ""),
        "arguments": function.get("arguments") or "{}",
        "status": "completed",
    }


class ResponsesRoute:
    """``POST /v1/responses`` over the gateway's completion pipeline."""

    def __init__(self, completions: CompletionRoutes) -> None:
        self.completions = completions

    async def responses(self, request: Request) -> Response:
        body = await json_object(request)
        chat = to_chat(body)  # a bad field: the gateway's usage_error, as on chat completions
        response = await self.completions.completion_of(request, "chat", chat)
        if response.status_code != 200:
            return response  # OpenAI's error shape already, the refusal's details in it
        resp_id = f"resp_{uuid.uuid4().hex[:24]}"
        if isinstance(response, ChunkStream):
            streamed = self._stream(body, response, resp_id)
            _copy_headers(response, streamed)  # the prompt cache's decision, where it is known
            return streamed
        answer = _json.loads(bytes(response.body))
        choice = (answer.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        out = _shell(body, resp_id, "completed")
        if message.get("content"):
            out["output"].append(_message_item(message["content"], f"msg_{resp_id[5:]}"))
        out["output"].extend(_call_item(c) for c in message.get("tool_calls") or ())
        if choice.get("finish_reason") == "length":
            out["status"] = "incomplete"
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        out["usage"] = _usage(answer.get("usage") or {})
        # the chat usage beside it: what the SDK's sessions read (as on a streamed chat)
        out[EXTENSION_KEY] = {**(answer.get(EXTENSION_KEY) or {}), "usage": answer.get("usage")}
        reply = JSONResponse(out)
        _copy_headers(response, reply)
        return reply

    def _stream(self, body: Mapping[str, Any], response: ChunkStream, resp_id: str) -> Response:
        async def events() -> AsyncIterator[bytes]:
            seq = iter(range(1 << 30))
            shell = _shell(body, resp_id, "in_progress")
            yield _event("response.created", next(seq), response=shell)
            yield _event("response.in_progress", next(seq), response=shell)
            text: list[str] = []
            msg_id = f"msg_{resp_id[5:]}"
            calls: dict[int, dict[str, Any]] = {}
            usage: dict[str, Any] = {}
            extension: dict[str, Any] = {}
            finish = None
            message_open = False
            async for data in chunks_of(response):
                if data is None:  # those that came together go on together
                    yield FLUSH
                    continue
                usage = data.get("usage") or usage
                if isinstance(data.get(EXTENSION_KEY), Mapping):
                    extension = dict(data[EXTENSION_KEY])
                for choice in data.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if piece:
                        if not message_open:
                            message_open = True
                            yield _event(
                                "response.output_item.added",
                                next(seq),
                                output_index=0,
                                item=_message_item("", msg_id, "in_progress") | {"content": []},
                            )
                            yield _event(
                                "response.content_part.added",
                                next(seq),
                                item_id=msg_id,
                                output_index=0,
                                content_index=0,
                                part={"type": "output_text", "text": "", "annotations": []},
                            )
                        text.append(piece)
                        yield _event(
                            "response.output_text.delta",
                            next(seq),
                            item_id=msg_id,
                            output_index=0,
                            content_index=0,
                            delta=piece,
                            logprobs=[],
                        )
                    for call in delta.get("tool_calls") or ():
                        slot = calls.setdefault(
                            call.get("index", 0),
                            {"id": None, "function": {"name": "", "arguments": ""}},
                        )
                        slot["id"] = call.get("id") or slot["id"]
                        function = call.get("function") or {}
                        slot["function"]["name"] += function.get("name") or ""
                        slot["function"]["arguments"] += function.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
            output: list[dict[str, Any]] = []
            if message_open:
                done_text = "".join(text)
                yield _event(
                    "response.output_text.done",
                    next(seq),
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    text=done_text,
                    logprobs=[],
                )
                part = {"type": "output_text", "text": done_text, "annotations": []}
                yield _event(
                    "response.content_part.done",
                    next(seq),
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    part=part,
                )
                item = _message_item(done_text, msg_id)
                yield _event("response.output_item.done", next(seq), output_index=0, item=item)
                output.append(item)
            for _, call in sorted(calls.items()):
                item = _call_item(call)
                index = len(output)
                yield _event(
                    "response.output_item.added",
                    next(seq),
                    output_index=index,
                    item=item | {"status": "in_progress", "arguments": ""},
                )
                yield _event(
                    "response.function_call_arguments.delta",
                    next(seq),
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                )
                yield _event(
                    "response.function_call_arguments.done",
                    next(seq),
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
                yield _event("response.output_item.done", next(seq), output_index=index, item=item)
                output.append(item)
            final = _shell(body, resp_id, "completed")
            if finish == "length":
                final["status"] = "incomplete"
                final["incomplete_details"] = {"reason": "max_output_tokens"}
            final["output"] = output
            final["usage"] = _usage(usage)
            final[EXTENSION_KEY] = {**extension, "usage": usage}
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield _event(kind, next(seq), response=final)

        return StreamingResponse(
            joined(events()), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )


def _copy_headers(answer: Response, reply: Response) -> None:
    """The gateway's ``x-agentclaims-*`` headers of the chat answer onto the Responses one."""
    for name, value in answer.headers.items():
        if name.startswith("x-agentclaims"):
            reply.headers[name] = value


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    return (
        b"event: "
        + kind.encode()
        + b"\ndata: "
        + _json.dumps({"type": kind, "sequence_number": seq, **fields})
        + b"\n\n"
    )
