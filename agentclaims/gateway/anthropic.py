"""``POST /v1/messages``: the Anthropic Messages API on the gateway, its ``cache_control`` as
claims.

An Anthropic client (the ``anthropic`` SDK, LangChain's ``ChatAnthropic``, Claude Code pointed
at a self-hosted model) sends a Messages request; the gateway turns it into the chat completion
it means and runs it through the one completion pipeline (claims, tenants, the ledger, the
engine's refusals), then answers in the Messages API's own shapes: a ``message`` object, or its
server-sent events (``message_start``, ``content_block_*``, ``message_delta``,
``message_stop``), and errors as ``{"type": "error", "error": {...}}``.

**Cache breakpoints become claims.** ``cache_control`` on a tool, a system block or a content
block (at most 4), or once at the top level (automatic: the last block), with ``ttl`` ``"5m"``
(the default) or ``"1h"``, asks the engine to keep the prompt up to it. A claim on the prompt
holds every prefix of it, so the breakpoints are honoured by one ``expiring`` claim on the
whole prompt (``@prompt``), its TTL the longest breakpoint's, capped by the tenant's
``max_ttl_s`` and the engine's longest TTL; each breakpoint it covers is reported with that
claim's decision. A call that reads a prompt an earlier call claimed (its leading messages are
that prompt's, with the same tools; the same prompt sent again too) refreshes it, as Anthropic
refreshes a cache entry on each read: the earlier claim is let go as the call goes, and the
call's own claim holds it from now. Breakpoints that do not reach the end of the
prompt (only the system prompt marked, say) cannot be held on their own here and are refused,
with the reason, never dropped. What became of each breakpoint is in the answer's
``agentclaims.cache_control`` and its ``x-agentclaims-cache-control`` header.

``usage`` is the engine's: ``cache_read_input_tokens`` the prompt tokens served from its
prefix cache, ``cache_creation_input_tokens`` the rest where a breakpoint's claim now holds
them (else 0), ``input_tokens`` what remains, as Anthropic counts them.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from agentclaims import _json
from agentclaims.contract import ClaimId, OwnerScope
from agentclaims.errors import UnknownClaim, UsageError
from agentclaims.gateway.params import json_object, tenant_of
from agentclaims.gateway.streaming import FLUSH, ChunkStream, JSONResponse, chunks_of, joined
from agentclaims.gateway.tenants import Tenant
from agentclaims.protocol import EXTENSION_KEY

if TYPE_CHECKING:
    from agentclaims.gateway.completions import CompletionRoutes

__all__ = ["CACHE_HEADER", "CACHE_OWNER", "MessagesRoute", "to_chat"]

CACHE_HEADER = "x-agentclaims-cache-control"
CACHE_OWNER = "anthropic-cache"
"""The owner scope breakpoint claims are held under (per tenant)."""
TTL_S = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4
CLAIMS_KEPT = 65_536

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


@dataclass(frozen=True, slots=True)
class Breakpoint:
    where: str
    """Where it was set: ``tools[1]``, ``system[0]``, ``messages[3].content[0]`` or ``auto``."""
    ttl_s: float
    at_end: bool
    """It marks the last block of the prompt (then the claim on the prompt is its own)."""


@dataclass(slots=True)
class Converted:
    """A Messages request as the chat completion it means."""

    chat: dict[str, Any]
    breakpoints: list[Breakpoint] = field(default_factory=list)
    model: str = ""
    written: bool = False
    """A breakpoint's claim was accepted: what the call computed is held (cache creation)."""
    block_size: int = 0
    """The KV side's block size: a claim on the prompt holds its full blocks only."""
    held_ttl_s: float | None = None
    """The TTL its claim asks (the longest breakpoint's, capped by the tenant and engine)."""
    boundaries: list[str] = field(default_factory=list)
    """A digest of the prompt up to each chat message (tools first): the same leading
    messages, the same digests, whatever engine serves them (the last: the whole prompt)."""


def _fail(name: str, why: str) -> UsageError:
    return UsageError(name, why)


def _ttl(control: object, where: str) -> float:
    name = f"{where}.cache_control" if where else "cache_control"
    if not isinstance(control, Mapping) or control.get("type") != "ephemeral":
        raise _fail(name, f'must be {{"type": "ephemeral"}}, got {control!r}')
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_S:
        raise _fail(f"{name}.ttl", f'must be "5m" or "1h", got {ttl!r}')
    return TTL_S[ttl]


def _text_of(blocks: object, where: str, marks: list[tuple[str, float]]) -> str:
    """The text of a string or a list of text blocks (their breakpoints into ``marks``)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _fail(where, f"must be a string or a list of content blocks, got {blocks!r}")
    parts = []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        if not isinstance(block, Mapping) or block.get("type") != "text":
            raise _fail(at, "only text blocks are supported here")
        text = block.get("text")
        if not isinstance(text, str):
            raise _fail(f"{at}.text", f"must be a string, got {text!r}")
        if block.get("cache_control") is not None:
            marks.append((at, _ttl(block["cache_control"], at)))
        parts.append(text)
    return "".join(parts)


def _message(raw: object, i: int, marks: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """One Messages-API message as the chat messages it means (tool results each a ``tool``
    message, tool uses the assistant's ``tool_calls``)."""
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise _fail(where, f"expected an object, got {raw!r}")
    role, content = raw.get("role"), raw.get("content")
    if role not in ("user", "assistant"):
        raise _fail(f"{where}.role", f'must be "user" or "assistant", got {role!r}')
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list) or not content:
        raise _fail(f"{where}.content", "must be a string or a non-empty list of blocks")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(block, Mapping):
            raise _fail(at, f"expected an object, got {block!r}")
        kind = block.get("type")
        if block.get("cache_control") is not None:
            marks.append((at, _ttl(block["cache_control"], at)))
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _fail(f"{at}.text", "must be a string")
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise _fail(at, "a tool_use block needs a string id and name")
            if not isinstance(block.get("input", {}), Mapping):
                raise _fail(f"{at}.input", f"must be an object, got {block.get('input')!r}")
            arguments = json.dumps(block.get("input") or {}, separators=(",", ":"))
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise _fail(f"{at}.tool_use_id", "must be a string")
            result = _text_of(block.get("content", ""), f"{at}.content", marks)
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            raise _fail(f"{at}.type", f"{kind!r} blocks are not supported in a {role} message")
    if role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    elif texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def to_chat(body: Mapping[str, Any]) -> Converted:
    """The chat completion a Messages request means, and its cache breakpoints; ``UsageError``
    naming the first bad field (the Messages API's own checks)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "must be a non-empty string")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _fail("max_tokens", f"must be an integer >= 1, got {max_tokens!r}")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _fail("messages", "must be a non-empty list")
    marks: list[tuple[str, float]] = []
    chat_messages: list[dict[str, Any]] = []
    tools = body.get("tools")
    chat_tools = []
    if tools is not None:
        if not isinstance(tools, list):
            raise _fail("tools", "must be a list")
        for i, spec in enumerate(tools):
            if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
                raise _fail(f"tools[{i}]", "needs a string name")
            if spec.get("type") not in (None, "custom"):  # web search, code execution, ...
                raise _fail(
                    f"tools[{i}].type", f"server tools are not served here: {spec['type']!r}"
                )
            if spec.get("cache_control") is not None:
                marks.append((f"tools[{i}]", _ttl(spec["cache_control"], f"tools[{i}]")))
            function = {"name": spec["name"], "parameters": spec.get("input_schema") or {}}
            if isinstance(spec.get("description"), str):
                function["description"] = spec["description"]
            chat_tools.append({"type": "function", "function": function})
    system = body.get("system")
    if system is not None:
        chat_messages.append({"role": "system", "content": _text_of(system, "system", marks)})
    for i, raw in enumerate(raw_messages):
        chat_messages.extend(_message(raw, i, marks))
    last_block = _last_block(body)
    auto = body.get("cache_control")
    if auto is not None:
        marks.append(("auto", _ttl(auto, "")))
    if len(marks) > MAX_BREAKPOINTS:
        raise _fail(
            "cache_control",
            f"a maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided, "
            f"found {len(marks)}",
        )
    chat: dict[str, Any] = {"model": model, "messages": chat_messages, "max_tokens": max_tokens}
    _sampling(body, chat)
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _fail("stop_sequences", "must be a list of strings")
        chat["stop"] = stop
    if chat_tools:
        chat["tools"] = chat_tools
        choice = body.get("tool_choice")
        if choice is not None:
            chat["tool_choice"] = _tool_choice(choice)
    thinking = body.get("thinking")
    if thinking is not None and not (
        isinstance(thinking, Mapping) and thinking.get("type") == "disabled"
    ):
        raise _fail("thinking", "extended thinking is not served here")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _fail("stream", f"must be true or false, got {stream!r}")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if body.get(EXTENSION_KEY) is not None:
        chat[EXTENSION_KEY] = body[EXTENSION_KEY]
    breakpoints = [Breakpoint(w, t, w in ("auto", last_block)) for w, t in marks]
    return Converted(chat, breakpoints, model, boundaries=_boundaries(chat))


def _sampling(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    """The sampling fields into ``chat``, checked as the Messages API checks them
    (``temperature`` and ``top_p`` in [0, 1], ``top_k`` an integer >= 0), and ``metadata``
    (an object; not used here)."""
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise _fail(name, f"must be a number in [0, 1], got {value!r}")
        chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise _fail("top_k", f"must be an integer >= 0, got {top_k!r}")
        chat["top_k"] = top_k
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise _fail("metadata", f"expected an object, got {metadata!r}")
    if metadata is not None and not isinstance(metadata.get("user_id", ""), str | None):
        raise _fail("metadata.user_id", f"must be a string, got {metadata['user_id']!r}")


def _boundaries(chat: Mapping[str, Any]) -> list[str]:
    """The chained digest of the prompt after each of its messages (the tools first)."""
    digest = hashlib.sha256(_json.dumps(chat.get("tools") or []))
    out = []
    for message in chat["messages"]:
        digest.update(_json.dumps(message))
        out.append(digest.copy().hexdigest()[:32])
    return out


def _last_block(body: Mapping[str, Any]) -> str:
    """Where the prompt's last block is (a breakpoint there marks the whole prompt)."""
    messages = body["messages"]
    i = len(messages) - 1
    content = messages[i].get("content") if isinstance(messages[i], Mapping) else None
    if isinstance(content, list) and content:
        return f"messages[{i}].content[{len(content) - 1}]"
    return f"messages[{i}]"


def _tool_choice(choice: object) -> object:
    if not isinstance(choice, Mapping):
        raise _fail("tool_choice", f"expected an object, got {choice!r}")
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _fail("tool_choice.name", f"must be a string, got {choice.get('name')!r}")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _fail("tool_choice.type", f'must be "auto", "any", "tool" or "none", got {kind!r}')


def error_response(
    status: int,
    message: str,
    extra: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An error in the Messages API's shape (the gateway's ``agentclaims`` details beside)."""
    kind = _ERROR_TYPES.get(status, "overloaded_error" if status in (409, 503) else "api_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    if extra:
        body[EXTENSION_KEY] = dict(extra)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def anthropic_path(request: Request) -> bool:
    """Whether a call went to the Messages API (``/v1/messages`` and below it): an Anthropic
    client's, answered in that API's error shape whatever refuses it (its key, the gateway
    stopping, a body too large, a route not served such as ``/v1/messages/count_tokens``)."""
    path: str = request.url.path
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_error(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    """The gateway's error ``body`` (``{"error": {"type", "message", ...}}``) in the Messages
    API's shape, the gateway's own error beside it under ``agentclaims.error``."""
    error = body.get("error")
    error = dict(error) if isinstance(error, Mapping) else {"message": "the request failed"}
    # a usage error's message names its field already
    return error_response(status, str(error.get("message")), {"error": error}, headers)


class BreakpointClaims:
    """The breakpoint claims held per tenant, by the digest of the prompt each holds
    (``Converted.boundaries``): a later call whose prompt starts with one refreshes it."""

    def __init__(self) -> None:
        self._by_prefix: OrderedDict[tuple[str | None, str], str] = OrderedDict()

    def held(self, tenant: Tenant | None, prefix_ids: Sequence[str]) -> list[tuple[str, str]]:
        """The claims (prefix id, claim id) a call reading ``prefix_ids`` reads."""
        name = None if tenant is None else tenant.name
        return [(p, self._by_prefix[(name, p)]) for p in prefix_ids if (name, p) in self._by_prefix]

    def forget(self, tenant: Tenant | None, prefix_id: str) -> None:
        self._by_prefix.pop((None if tenant is None else tenant.name, prefix_id), None)

    def record(self, tenant: Tenant | None, prefix_id: str, claim_id: str) -> None:
        key = (None if tenant is None else tenant.name, prefix_id)
        self._by_prefix[key] = claim_id
        self._by_prefix.move_to_end(key)
        while len(self._by_prefix) > CLAIMS_KEPT:
            self._by_prefix.popitem(last=False)


class MessagesRoute:
    """``POST /v1/messages`` over the gateway's completion pipeline."""

    def __init__(self, completions: CompletionRoutes) -> None:
        self.completions = completions
        self.claims = BreakpointClaims()

    async def messages(self, request: Request) -> Response:
        """A Messages call; a bad one raises, and the gateway answers it as every error is
        answered (counted, 413 for a body too large), in this API's shape (``anthropic_error``)."""
        body = await json_object(request)
        converted = to_chat(body)
        tenant = tenant_of(request)
        claim = await self._claim(converted, tenant)
        if claim is not None:
            ext = dict(converted.chat.get(EXTENSION_KEY) or {})
            ext["claims"] = [*(ext.get("claims") or []), claim]
            converted.chat[EXTENSION_KEY] = ext
            await self._refresh(converted, tenant)
        response = await self.completions.completion_of(request, "chat", converted.chat)
        if response.status_code != 200:
            return _error_from(response)
        claim_id = None if claim is None else claim["claim_id"]
        converted.held_ttl_s = None if claim is None else claim["ttl_s"]
        converted.block_size = int(getattr(self.completions.kv, "block_size", 0) or 0)
        if isinstance(response, ChunkStream):
            return self._stream(response, converted, claim_id, tenant)
        answer = _json.loads(bytes(response.body))
        extension = answer.get(EXTENSION_KEY) or {}
        report = await self._report(converted, claim_id, extension, tenant)
        message = _message_of(answer, converted)
        out = JSONResponse(message)
        out.headers[CACHE_HEADER] = _header(report)
        return out

    async def _claim(self, converted: Converted, tenant: Tenant | None) -> dict[str, Any] | None:
        """The claim the breakpoints ask for: ``expiring`` on the prompt, the longest TTL
        (capped by the tenant and the engine); ``None`` when no breakpoint reaches the end."""
        ends = [b for b in converted.breakpoints if b.at_end]
        if not ends:
            return None
        ttl = max(b.ttl_s for b in converted.breakpoints)
        ask = getattr(self.completions.kv, "max_claim_ttl", None)
        engine_max = await ask() if ask is not None else None
        for cap in (None if tenant is None else tenant.max_ttl_s, engine_max):
            if cap is not None and cap > 0:
                ttl = min(ttl, cap)
        return {
            "claim_id": f"ccl-{uuid.uuid4().hex[:16]}",
            "object_id": "@prompt",
            "owner_scope": CACHE_OWNER,
            "protection_mode": "expiring",
            "ttl_s": ttl,
        }

    async def _report(
        self,
        converted: Converted,
        claim_id: str | None,
        extension: dict[str, Any],
        tenant: Tenant | None,
    ) -> list[dict[str, Any]]:
        """What became of each breakpoint (into ``extension["cache_control"]``); the call's
        claim, accepted, is the one its prompt is held by from now (``_refresh``)."""
        decision = next(
            (d for d in extension.get("decisions") or () if d.get("claim_id") == claim_id), None
        )
        accepted = decision is not None and decision.get("decision") != "rejected"
        report: list[dict[str, Any]] = []
        for bp in converted.breakpoints:
            entry: dict[str, Any] = {"breakpoint": bp.where, "asked_ttl_s": bp.ttl_s}
            if converted.held_ttl_s is not None:
                entry["ttl_s"] = converted.held_ttl_s  # what its claim holds it for
            if claim_id is None:
                entry.update(
                    decision="refused",
                    reason="the breakpoint does not reach the end of the prompt: only a whole "
                    "prompt is held here",
                )
            elif decision is None:
                entry.update(claim_id=claim_id, decision="refused", reason="no decision came back")
            elif not accepted:
                entry.update(
                    claim_id=claim_id,
                    decision="refused",
                    reason=decision.get("reason") or "refused",
                )
            else:
                entry.update(claim_id=claim_id, decision=decision["decision"])
                if not bp.at_end:
                    entry["covered_by_prompt"] = True  # a prefix of the prompt held
            report.append(entry)
        if accepted and converted.boundaries:
            self.claims.record(tenant, converted.boundaries[-1], str(claim_id))
        extension["cache_control"] = report
        converted.written = accepted
        return report

    async def _refresh(self, converted: Converted, tenant: Tenant | None) -> None:
        """The claims held on prompts this call's prompt starts with (itself included: the
        same prompt sent again) let go before it runs, as OpenAI's key lets its previous claim
        go: the call's own claim holds their blocks from now, within the tenant's limits."""
        read = self.claims.held(tenant, converted.boundaries)
        for prefix, old in read:
            await self._let_go(old, tenant)
            self.claims.forget(tenant, prefix)
        if read:  # the tenant's books count them gone before the call's claim is gated
            await self.completions.service.sync()

    async def _let_go(self, claim_id: str, tenant: Tenant | None) -> None:
        ns = self.completions.service.namespace
        scope = OwnerScope(ns.inner(CACHE_OWNER, tenant))
        try:
            await self.completions.kv.release_claim(ClaimId(ns.inner(claim_id, tenant)), scope)
        except UnknownClaim:
            return

    def _stream(
        self,
        response: ChunkStream,
        converted: Converted,
        claim_id: str | None,
        tenant: Tenant | None,
    ) -> Response:
        route = self

        async def events() -> AsyncIterator[bytes]:
            msg_id = f"msg_{uuid.uuid4().hex[:24]}"
            started = False
            block: tuple[int, str] | None = None  # (index, "text" | "tool_use")
            index = -1
            tools: dict[int, int] = {}  # the chat's tool call index -> our block index
            finish: str | None = None
            matched: object = None
            usage: dict[str, Any] = {}
            extension: dict[str, Any] = {}
            async for data in chunks_of(response):
                if data is None:  # those that came together go on together
                    yield FLUSH
                    continue
                if not started:
                    started = True
                    yield _event("message_start", {"message": _start(msg_id, converted.model)})
                usage = data.get("usage") or usage
                if isinstance(data.get(EXTENSION_KEY), Mapping):
                    extension = dict(data[EXTENSION_KEY])
                for choice in data.get("choices") or ():
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    if text:
                        if block is None or block[1] != "text":
                            if block is not None:
                                yield _event("content_block_stop", {"index": block[0]})
                            index += 1
                            block = (index, "text")
                            yield _event(
                                "content_block_start",
                                {"index": index, "content_block": {"type": "text", "text": ""}},
                            )
                        yield _event(
                            "content_block_delta",
                            {"index": index, "delta": {"type": "text_delta", "text": text}},
                        )
                    for call in delta.get("tool_calls") or ():
                        position = call.get("index", 0)
                        if position not in tools:
                            if block is not None:
                                yield _event("content_block_stop", {"index": block[0]})
                            index += 1
                            tools[position] = index
                            block = (index, "tool_use")
                            function = call.get("function") or {}
                            yield _event(
                                "content_block_start",
                                {
                                    "index": index,
                                    "content_block": {
                                        "type": "tool_use",
                                        "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:20]}",
                                        "name": function.get("name", ""),
                                        "input": {},
                                    },
                                },
                            )
                        partial = (call.get("function") or {}).get("arguments")
                        if partial:
                            yield _event(
                                "content_block_delta",
                                {
                                    "index": tools[position],
                                    "delta": {"type": "input_json_delta", "partial_json": partial},
                                },
                            )
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                        matched = choice.get("stop_reason")
            if not started:
                yield _event("message_start", {"message": _start(msg_id, converted.model)})
            if block is not None:
                yield _event("content_block_stop", {"index": block[0]})
            await route._report(converted, claim_id, extension, tenant)
            extension["usage"] = usage
            yield _event(
                "message_delta",
                {
                    "delta": _stopped(finish, matched),
                    "usage": _usage(usage, converted),
                    EXTENSION_KEY: extension,
                },
            )
            yield _event("message_stop", {})

        return StreamingResponse(
            joined(events()), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )


def _event(kind: str, body: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _json.dumps({"type": kind, **body}) + b"\n\n"


def _start(msg_id: str, model: str) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _usage(usage: Mapping[str, Any], converted: Converted) -> dict[str, int]:
    """The chat usage as the Messages API counts it: cache creation, where a breakpoint's
    claim was accepted (``written``), the tokens this call computed that the claim holds (the
    prompt's full blocks: a partial last block is computed again by the next call, input)."""
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    cached = min(cached, prompt)
    size = converted.block_size
    held = prompt - prompt % size if size > 0 else prompt
    created = max(0, held - cached) if converted.written else 0
    return {
        "input_tokens": prompt - cached - created,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
    }


def _message_of(answer: Mapping[str, Any], converted: Converted) -> dict[str, Any]:
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:20]}",
                "name": function.get("name", ""),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    extension = answer.get(EXTENSION_KEY) or {}
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": converted.model,
        "content": content,
        **_stopped(choice.get("finish_reason"), choice.get("stop_reason")),
        "usage": _usage(answer.get("usage") or {}, converted),
        EXTENSION_KEY: extension,
    }


def _stopped(finish: object, matched: object) -> dict[str, Any]:
    """The Messages API's ``stop_reason`` and ``stop_sequence`` of a chat's finish (and the
    stop string it ended at, where the engine says: vLLM's ``stop_reason``)."""
    if finish == "stop" and isinstance(matched, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": _STOP.get(str(finish or "stop"), "end_turn"), "stop_sequence": None}


def _error_from(response: Response) -> Response:
    """A chat pipeline's error (OpenAI's shape) in the Messages API's."""
    try:
        body = _json.loads(bytes(response.body))
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, Mapping) else None
    message = err.get("message") if isinstance(err, Mapping) else None
    out = error_response(
        response.status_code,
        message or "the request failed",
        body if isinstance(body, Mapping) else None,
    )
    for name in ("retry-after", "retry-after-ms", "x-should-retry", "x-agentclaims-router-safe"):
        if name in response.headers:
            out.headers[name] = response.headers[name]
    return out


def _header(report: Sequence[Mapping[str, Any]]) -> str:
    """The breakpoints' decisions as a header: ``<where>=<decision>``, comma-separated."""
    text = ", ".join(f"{r['breakpoint']}={r['decision']}" for r in report) or "none"
    return text.encode("ascii", "replace").decode()[:300]
