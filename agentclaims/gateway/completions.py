"""``CompletionRoutes``: both completion endpoints, one pipeline.

The call checked (nothing changes on bad input), the claims it releases let go, the reply
written with its KV life by the ``ReplyWriter`` (streamed as the engine produces it where it
can), the service's books kept (``Service.served``), and the claims' decisions and the
gateway's instance in the answer's ``agentclaims`` object; a request the KV side did not serve
is its claim-scoped refusal.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agentclaims._json import loads
from agentclaims.contract import (
    ArbiterAction,
    ClaimId,
    Feasibility,
    OwnerScope,
    RequestId,
)
from agentclaims.errors import ContractViolation, UnknownClaim, UsageError
from agentclaims.gateway.extension import Extension, Instance
from agentclaims.gateway.hosted import HEADER as CACHE_HEADER
from agentclaims.gateway.hosted import PromptCache, PromptCacheClaims, header_value
from agentclaims.gateway.hosted import outcome as hosted_outcome
from agentclaims.gateway.limits import EVENTS_PER_ANSWER
from agentclaims.gateway.params import claim_owners, json_object, optional_str, tenant_of
from agentclaims.gateway.queueing import Promotions, engine_orders
from agentclaims.gateway.service import Service
from agentclaims.gateway.sides import KVSide
from agentclaims.gateway.streaming import (
    ChunkStream,
    JSONResponse,
    respond,
    stream_requested,
    unstreamed,
)
from agentclaims.gateway.tenants import Tenant
from agentclaims.protocol import (
    EXTENSION_KEY,
    ROUTER_SAFE_HEADER,
    ActiveOutcome,
    ServeResult,
    refusal_error,
)
from agentclaims.protocol.writer import (
    ID_PREFIX,
    CompletionCall,
    CompletionKind,
    PlainWrite,
    ReplyStream,
    ReplyWriter,
    Written,
)

__all__ = ["CompletionRoutes"]


class CompletionRoutes:
    """``/v1/chat/completions`` and ``/v1/completions`` over a KV side and its reply writer
    (``errors``: the gateway's error counts, refusals included)."""

    def __init__(
        self,
        kv: KVSide,
        writer: ReplyWriter,
        service: Service,
        instance: Instance,
        errors: Counter[str],
        promotions: Promotions,
    ) -> None:
        self.kv = kv
        self.writer = writer
        self.service = service
        self.instance = instance
        self.errors = errors
        self._fields = instance.fields  # in every answer: read once
        self._plain: PlainWrite | None = getattr(writer, "plain", None)  # for plain calls
        self.promotions = promotions
        """Which calls go ahead in the engine's queue (``agentclaims.gateway.queueing``)."""
        self.cache_claims = PromptCacheClaims()  # each prompt_cache_key's latest claim

    async def chat_completions(self, request: Request) -> Response:
        return await self._completion(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._completion(request, "completion")

    async def _completion(self, request: Request, kind: CompletionKind) -> Response:
        return await self.completion_of(request, kind, await json_object(request))

    async def completion_of(
        self, request: Request, kind: CompletionKind, body: dict[str, Any]
    ) -> Response:
        """Both completion endpoints (and the APIs translated into them, ``/v1/messages``):
        the call checked (nothing changes on bad input), the claims it releases let go, the
        reply with its KV life and claims' decisions, streamed where it can; a workflow's call
        goes ahead in the engine's queue where it is worth it (``promotions``)."""
        workflow = engine_orders(self.writer) and (raw := body.get(EXTENSION_KEY)) is not None
        held = workflow and releases_held(self.writer, self.service, raw, tenant_of(request))
        priority = self.promotions.take(workflow, held)
        response: Response | None = None
        try:
            response = await self._completion_of(request, kind, body, priority)
            return response
        finally:  # answered, or its first token came; a promoted call charged its prefill
            computed = None if priority is None else computed_tokens(response)
            self.promotions.give_back(workflow, priority, computed)

    async def _completion_of(
        self, request: Request, kind: CompletionKind, body: dict[str, Any], priority: int | None
    ) -> Response:
        tenant = tenant_of(request)
        ext = Extension.parse(body)
        if self._plain is not None and ext.carries_nothing and _plain_call(body):
            lean = await self._lean(request, kind, body, tenant, ext, priority)
            if lean is not None:
                return lean
        cache = PromptCache.parse(body)  # OpenAI's fields, checked as OpenAI checks them
        owner = self.service.owner(ext.default_owner, tenant)
        cached = await self._cache_claim(cache, tenant)
        if cached is not None:
            ext = replace(ext, claims=(*ext.claims, cached.claim))
        call = self.writer.prepare(
            CompletionCall(
                kind,
                body,
                claims=tuple(self.service.claims(ext.claims, owner, tenant)),
                owner_scope=owner,
                cache_salt=self.service.namespace.salt(optional_str(body, "cache_salt"), tenant),
                request_id=self.service.namespace.request_id(
                    ext.request_id, tenant, ID_PREFIX[kind]
                ),
                admit=ext.admit,
                node=ext.node,
                priority=priority,
            )
        )
        streamed = stream_requested(body)  # (#13) a bad stream field is refused up front
        released = await self._release(ext, owner, tenant)
        if cached is not None:
            await self._release_cache_claim(cached, tenant)
        writer = self.writer
        hosted = _Hosted(cache, cached)
        if streamed and writer.streams and (not call.claims or writer.streams_claims):
            return await self._stream(request, call, tenant, released, ext, hosted)
        # a reply written whole (a scripted one, or claims whose answer vLLM sends only in an
        # answer read whole): the gateway then streams it itself (#13)
        written = await writer.write(replace(call, body=unstreamed(body)) if streamed else call)
        owners = claim_owners(call.claims, owner)
        return await self.answer(
            request, body, written, owners, tenant, owner, released, streamed, ext, hosted
        )

    async def _lean(
        self,
        request: Request,
        kind: CompletionKind,
        body: dict[str, Any],
        tenant: Tenant | None,
        ext: Extension,
        priority: int | None,
    ) -> Response | None:
        """A call that carries nothing but OpenAI's fields, or the SDK's ``agentclaims``
        object with nothing in it to carry (``Extension.carries_nothing``), written by the
        writer's plain way (``CompletionForwarder.plain``: vLLM's answer booked without the
        objects a claim's outcome needs) and answered as ``answer`` answers a served call
        with no claims, its tenant's books kept; ``None`` where an operation waits to ride on
        it, or where the SDK's call would be answered with pool figures older than
        ``LEAN_POOL_FRESH_S`` (``write`` carries it: this call is then answered the general
        way)."""
        assert self._plain is not None
        self.writer.prepare(CompletionCall(kind, body))  # nothing sent on a bad body
        ns = self.service.namespace
        sdk = body.get(EXTENSION_KEY) is not None  # the SDK's object: figures and events
        owner = self.service.owner(ext.default_owner, tenant)
        reply = await self._plain(
            kind,
            body,
            cache_salt=ns.salt(None, tenant),
            request_id=ns.request_id(ext.request_id, tenant, ID_PREFIX[kind]),
            priority=priority,
            **({"fresh_pool_s": LEAN_POOL_FRESH_S} if sdk else {}),
        )
        if reply is None:
            return None
        if isinstance(reply, Written):  # the connector spoke to it: booked the general way
            return await self.answer(request, body, reply, {}, tenant, owner, [], False, ext)
        self.service.bind([owner], tenant)
        prefix_ids: dict[str, Any] = {"prompt": reply.prompt, "sequence": reply.sequence}
        prefix_ids["messages"] = []
        events_seq = await self.service.served_plain(
            reply.request_id, prefix_ids, tenant, reply.events_seq
        )
        shown = ns.shown(reply.request_id, tenant)
        outcome = _SERVED | {
            "request_id": shown,
            "hit_blocks": reply.hit_blocks,
            "computed_blocks": reply.computed_blocks,
        }
        payload = reply.payload
        if tenant is not None and isinstance(payload.get("id"), str):
            payload["id"] = ns.shown_text(payload["id"], tenant)
        extension = self.extension_of(outcome, prefix_ids, [], events_seq, pool=reply.pool)
        if sdk:  # its events, from what the gateway heard (the connector's within a second)
            await self._add_to_answer(extension, ext, None, tenant)
        payload[EXTENSION_KEY] = extension
        return JSONResponse(payload)

    async def _cache_claim(
        self, cache: PromptCache | None, tenant: Tenant | None
    ) -> _CacheClaim | None:
        """The claim a call's ``prompt_cache_key`` asks for (``agentclaims.gateway.hosted``)."""
        if cache is None:
            return None
        ask = getattr(self.kv, "max_claim_ttl", None)  # where the side caps TTLs by refusing
        engine_max = await ask() if ask is not None else None
        planned = self.cache_claims.plan(cache, tenant, engine_max)
        if planned is None:
            return None
        claim, previous = planned  # namespaced for the tenant with the call's other claims
        return _CacheClaim(claim, previous)

    async def _release_cache_claim(self, cached: _CacheClaim, tenant: Tenant | None) -> None:
        """The key's previous claim goes with this call (its prompt starts with its prefix),
        off the tenant's books before the call's is gated; one not held here is no error."""
        if cached.previous is None:
            return
        ns = self.service.namespace
        with contextlib.suppress(UnknownClaim):
            scope = OwnerScope(ns.inner(cached.claim["owner_scope"], tenant))
            await self.kv.release_claim(ClaimId(ns.inner(cached.previous, tenant)), scope)
        await self.service.sync()

    async def _add_to_answer(
        self,
        extension: dict[str, Any],
        ext: Extension | None,
        hosted: _Hosted | None,
        tenant: Tenant | None,
    ) -> dict[str, Any] | None:
        """Into a served call's ``agentclaims`` object: the events after the caller's cursor
        (``events_since``: the page ``GET /v1/events`` would give, its session's only), and
        what became of its prompt-cache parameters (``prompt_cache``, remembered for the
        key's next call; returned, for the answer's header)."""
        if ext is not None and ext.events_since is not None:
            page = await self.service.events(
                ext.events_since, limit=EVENTS_PER_ANSWER, id_prefix=ext.session_id, tenant=tenant
            )
            extension["events"] = page.to_dict()
        if hosted is None or hosted.cache is None:
            return None
        cached = hosted.claim
        shown = None if cached is None else cached.claim_id
        ttl_s = None if cached is None else cached.claim["ttl_s"]
        report = hosted_outcome(hosted.cache, shown, extension.get("decisions", ()), ttl_s)
        if shown is not None:
            accepted = report["decision"] != "refused"
            self.cache_claims.decided(hosted.cache, tenant, shown, accepted)
        extension["prompt_cache"] = report
        return report

    async def answer(
        self,
        request: Request,
        body: Mapping[str, Any],
        written: Written,
        owners: Mapping[str, str],
        tenant: Tenant | None,
        owner: str | None,
        released: Sequence[Mapping[str, Any]],
        streamed: bool,
        ext: Extension | None = None,
        hosted: _Hosted | None = None,
    ) -> Response:
        """A reply written whole, answered: the service's books kept, then the claim-scoped
        refusal, or the payload with its ``agentclaims`` object (JSON, or server-sent events
        the gateway streams itself, #13), the caller's new events in it where it asked."""
        result = await self.service.served(written.result, owners, tenant, owner)
        if not result.outcome.served:
            return self._refusal(request, result)
        payload = dict(written.payload)
        if isinstance(payload.get("id"), str):  # it names the request: as the caller named it
            payload["id"] = self.service.namespace.shown_text(payload["id"], tenant)
        if ext is not None and ext.release_when_done and not calls_tools(payload):
            released = [*released, *await released_when_done(self, result, owners, tenant)]
        extension = self._extension(result, released)
        report = await self._add_to_answer(extension, ext, hosted, tenant)
        payload[EXTENSION_KEY] = extension
        response = respond(body, payload, streamed)
        if report is not None:
            response.headers[CACHE_HEADER] = header_value(report)
        return response

    async def _release(
        self, ext: Extension, owner: str | None, tenant: Tenant | None
    ) -> list[dict[str, Any]]:
        """Let go of the claims a completion names in ``agentclaims.release`` (its owner's),
        before it runs; their ids and states, for its answer. Each is checked first: another
        owner's is refused and nothing changes. One this gateway does not know (the call
        reached another instance than the claim's, say) is held nowhere here: ``unknown``,
        not an error, so a release never costs the call it rides on."""
        if not ext.release:
            return []
        if owner is None:
            raise UsageError(
                f"{EXTENSION_KEY}.release", "needs the owner scope (or session id) of its claims"
            )
        scope = OwnerScope(owner)
        known = []
        for shown in ext.release:
            cid = ClaimId(self.service.namespace.inner(shown, tenant))
            try:
                await self.kv.get_claim(cid, scope)
            except UnknownClaim:
                continue
            known.append(cid)
        done = {ClaimId(self.service.namespace.inner(c, tenant)) for c in ext.release_done}
        states: dict[str, str] = {}
        for cid in known:
            view = await self.kv.release_claim(cid, scope, done=cid in done)
            states[cid] = view.state.value
        await self.service.sync()
        return [
            {
                "claim_id": shown,
                "state": states.get(self.service.namespace.inner(shown, tenant), "unknown"),
            }
            for shown in ext.release
        ]

    async def _stream(
        self,
        request: Request,
        call: CompletionCall,
        tenant: Tenant | None,
        released: Sequence[Mapping[str, Any]] = (),
        ext: Extension | None = None,
        hosted: _Hosted | None = None,
    ) -> Response:
        """A streamed completion on the upstream engine: its chunks passed on as it produces
        them, then one chunk more with the ``agentclaims`` object (its usage and its claims'
        decisions inside). A request the engine ends before its first token (refused) is the
        claim-scoped refusal, not a stream; a client that leaves early closes the engine's
        stream (it aborts)."""
        owner = call.owner_scope
        owners = claim_owners(call.claims, owner)
        streamed = await self.writer.stream(call)
        try:
            early = await streamed.start()
            if early is not None:
                early = await self.service.served(early, owners, tenant, owner)
                if not early.outcome.served:
                    await streamed.aclose()
                    return self._refusal(request, early)
        except BaseException:
            await streamed.aclose()
            raise

        # where the gateway named the request, its chunks carry that id as the caller knows it
        # (vLLM's carry its own prefix before it)
        named = call.request_id
        shown_id = None if named is None else self.service.namespace.shown(named, tenant)

        async def batches() -> AsyncIterator[list[dict[str, Any]]]:
            try:
                # a chunk that may be the last (a finish reason, or the usage chunk) waits for
                # the next: the last one carries the ``agentclaims`` object, so the stream is
                # chunk for chunk the engine's, as OpenAI shapes it
                last: dict[str, Any] | None = None
                when_done, tools = ext is not None and ext.release_when_done, False
                async for batch in streamed.batches():  # those that came together, in one
                    out: list[dict[str, Any]] = []
                    for chunk in batch:
                        if shown_id is not None and "id" in chunk:
                            chunk["id"] = shown_id
                        if when_done and not tools:
                            tools = calls_tools(chunk)
                        if last is not None:
                            out.append(last)
                            last = None
                        if _may_end(chunk):
                            last = chunk
                        else:
                            out.append(chunk)
                    if out:
                        yield out
                result = early or await self.service.served(
                    _settled(streamed), owners, tenant, owner
                )
                done: Sequence[Mapping[str, Any]] = released
                if when_done and not tools:
                    done = [*released, *await released_when_done(self, result, owners, tenant)]
                extension = {**self._extension(result, done), "usage": streamed.usage}
                await self._add_to_answer(extension, ext, hosted, tenant)
                if last is None:  # no finishing chunk came (never from vLLM): one of its own
                    last = {**streamed.shape, "choices": []}
                yield [{**last, EXTENSION_KEY: extension}]
            finally:
                await streamed.aclose()

        return ChunkStream(batches())

    def _extension(
        self, result: ServeResult, released: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """The ``agentclaims`` object of an upstream engine's answer."""
        return self.extension_of(
            result.outcome.to_dict(),
            result.prefix_ids,
            [d.to_dict() for d in result.decisions] if result.decisions else [],
            result.events_seq,
            deferred_s=result.deferred_s,
            pool=result.pool,
            released=released,
        )

    def extension_of(
        self,
        outcome: dict[str, Any],
        prefix_ids: Mapping[str, Any],
        decisions: list[dict[str, Any]],
        events_seq: int,
        *,
        deferred_s: float = 0.0,
        pool: Mapping[str, Any] | None = None,
        released: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """The ``agentclaims`` object from its parts in their JSON form (the plain-call route
        writes a served outcome's without its objects)."""
        return {
            "request_id": outcome["request_id"],
            "outcome": outcome,
            "prefix_ids": prefix_ids,
            "decisions": decisions,
            "events_seq": events_seq,
            **({"deferred_s": deferred_s} if deferred_s else {}),
            **({"pool": pool} if pool is not None else {}),
            **({"released": list(released)} if released else {}),
            **self._fields,
        }

    def _refusal(self, request: Request, result: ServeResult) -> Response:
        """A request the KV side did not serve: its claim-scoped refusal (409, or 503 where
        the router may retry it elsewhere), counted."""
        status, headers, err = refusal_error(
            result.outcome, result.prefix_ids, router_safe=self.router_safe(request)
        )
        err["error"].update(self.instance.fields)
        self.errors[err["error"]["type"]] += 1
        if result.outcome.feasibility is Feasibility.INFEASIBLE_EXCEEDS_CAPACITY:
            headers = {**headers, NO_RETRY_HEADER: "false"}  # the OpenAI and Anthropic clients'
        return JSONResponse(err, status_code=status, headers=headers)

    def router_safe(self, request: Request) -> bool:
        """Whether a deferral answers 409 (behind a router: ``--behind-router``, or the client's
        ``X-Agentclaims-Router-Safe: 1``), not 503."""
        return self.instance.behind_router or request.headers.get(ROUTER_SAFE_HEADER) == "1"


@dataclass(frozen=True, slots=True)
class _CacheClaim:
    """The claim a call's ``prompt_cache_key`` made (its dict as the client would send it:
    ids and owner as the client sees them), and the key's previous claim it lets go of."""

    claim: Mapping[str, Any]
    previous: str | None

    @property
    def claim_id(self) -> str:
        return str(self.claim["claim_id"])


@dataclass(frozen=True, slots=True)
class _Hosted:
    """A call's prompt-cache parameters and the claim they made, for its answer."""

    cache: PromptCache | None
    claim: _CacheClaim | None


NO_RETRY_HEADER = "x-should-retry"
"""``false`` on a refusal no retry can turn into an answer (the request is larger than the
pool): the official clients retry a 409 by themselves otherwise, twice, each refused again."""
_PROMPT_CACHE_FIELDS = frozenset({"cache_salt", "prompt_cache_key", "prompt_cache_retention"})
"""Fields that ask the general way for something (a salt inside the tenant's, a claim)."""
_SERVED = ActiveOutcome(
    RequestId(""), ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT, Feasibility.FEASIBLE
).to_dict()
"""A served outcome's JSON form, from the type itself: a lean call's fills in its request
and block counts."""


LEAN_POOL_FRESH_S = 1.0
"""How old the pool figures a lean call of the SDK's is answered with may be: older, the call
goes with an envelope, so its answer brings new ones (the SDK plans with them)."""


def _plain_call(body: Mapping[str, Any]) -> bool:
    """Whether a body asks for nothing beyond OpenAI's completion: no prompt-cache field, not
    streamed (a bad ``stream`` field is refused here, as always); its ``agentclaims`` object,
    if any, is judged by ``Extension.carries_nothing``."""
    return _PROMPT_CACHE_FIELDS.isdisjoint(body) and not stream_requested(body)


def computed_tokens(response: Response | None) -> int | None:
    """The prompt tokens the engine computed for an answer written whole (its ``usage``: the
    prompt's less the cached ones); ``None`` for a stream, an error or an answer without
    them. Read for promoted calls only (``Promotions.cost``)."""
    body = getattr(response, "body", None)
    if response is None or response.status_code != 200 or not isinstance(body, bytes):
        return None
    try:
        usage = loads(body).get("usage") or {}
        prompt = usage["prompt_tokens"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except (ValueError, AttributeError, KeyError, TypeError):
        return None
    if type(prompt) is not int or type(cached) is not int:
        return None
    return max(0, prompt - cached)


def releases_held(writer: object, service: Service, raw: Any, tenant: Tenant | None) -> bool:
    """Whether a call's ``agentclaims`` object ``raw`` releases a claim ``writer``'s engine
    still holds (its ``mirror``): it superseded the claim held across the wait before it, so
    its prefix is cached. Read before the object is checked: anything unreadable is ``False``."""
    release = raw.get("release") if isinstance(raw, Mapping) else None
    mirror = getattr(writer, "mirror", None)
    if not isinstance(release, list) or not release or mirror is None:
        return False
    ns = service.namespace
    return bool(mirror.holds_any(ns.inner(cid, tenant) for cid in release if isinstance(cid, str)))


def calls_tools(answer: Mapping[str, Any]) -> bool:
    """Whether a chat completion (or a streamed chunk of one) calls a tool: a choice's message
    (or delta) with tool calls (or the older ``function_call``), or finished for them. A text
    completion calls none."""
    for choice in answer.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        said = choice.get("message") or choice.get("delta")
        if choice.get("finish_reason") in ("tool_calls", "function_call") or (
            isinstance(said, Mapping) and (said.get("tool_calls") or said.get("function_call"))
        ):
            return True
    return False


async def released_when_done(
    routes: CompletionRoutes,
    result: ServeResult,
    owners: Mapping[str, str],
    tenant: Tenant | None,
) -> list[dict[str, Any]]:
    """The claims a call carried that it held, let go as it is answered without a tool call
    (``Extension.release_when_done``: the agent is done): released ``done``, their ids (as the
    caller named them) and states for the answer's ``released``. One gone meanwhile is
    skipped."""
    ns, out = routes.service.namespace, []
    for decision in result.decisions:
        inner = ns.inner(decision.claim_id, tenant)
        owner = owners.get(inner)
        if not decision.accepted or owner is None:
            continue
        try:
            view = await routes.kv.release_claim(ClaimId(inner), OwnerScope(owner), done=True)
        except UnknownClaim:
            continue
        out.append({"claim_id": decision.claim_id, "state": view.state.value})
    if out:
        await routes.service.sync()
    return out


def _may_end(chunk: Mapping[str, Any]) -> bool:
    """Whether a streamed chunk may be the stream's last: the usage chunk (no choices) or
    one that finishes a choice."""
    choices = chunk.get("choices")
    return not choices or any(c.get("finish_reason") for c in choices)


def _settled(stream: ReplyStream) -> ServeResult:
    """The KV life of a stream its chunks have all been read of."""
    if stream.result is None:
        raise ContractViolation("the reply stream ended without its KV life")
    return stream.result
