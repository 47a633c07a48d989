"""``CompletionForwarder``: how a completion goes to vLLM with its claims, and its answer back.

The ``ReplyWriter`` work of ``VllmKV``: a body checked (``prepare``), its claims resolved
(fail closed) and signed as ``hold`` operations with whatever rides on it (``RidingOps``), the
request forwarded (whole, or streamed as vLLM produces it), and vLLM's answer turned into the
request's KV life: the prompt and the sequence named, the claims decided from the connector's
answer (``ClaimMirror``), or the claim-scoped refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any

from agentclaims_vllm.ops import Op

from agentclaims.contract import (
    ArbiterAction,
    BlockHash,
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    Feasibility,
    RequestId,
)
from agentclaims.engine.blocks import pack_tokens
from agentclaims.errors import BackendUnavailable, UsageError
from agentclaims.kernel import resolve_request_claims
from agentclaims.protocol import (
    EXTENSION_KEY,
    SEQUENCE_OBJECT,
    ActiveOutcome,
    CompletionCall,
    ServeResult,
    Written,
)
from agentclaims.protocol.writer import ID_PREFIX, CompletionKind, PlainReply, check_body
from agentclaims.vllm.client import ConnectorAnswer, ConnectorClient
from agentclaims.vllm.payloads import (
    KINDS,
    client_payload,
    forwarded,
    hold_op,
    packed_sequence,
    prompt_ids,
)
from agentclaims.vllm.streamed import UpstreamStream
from agentclaims.vllm.upstream import Upstream

if TYPE_CHECKING:
    from agentclaims.vllm.link import VllmLink
    from agentclaims.vllm.liveness import EngineLiveness
    from agentclaims.vllm.mirror import ClaimMirror
    from agentclaims.vllm.prompts import PromptBook

__all__ = ["CompletionForwarder"]

_UNLOCKED = contextlib.nullcontext()


def vllm_request_id(kind: CompletionKind, request_id: str) -> str:
    """What vLLM calls a request it was sent with ``request_id`` (its answer's id, and its
    engine's, which adds ``-<n>`` suffixes): OpenAI's prefix for the kind, then the id."""
    return f"{ID_PREFIX[kind]}-{request_id}"


def named(
    outgoing: dict[str, Any],
    mirror: ClaimMirror,
    kind: CompletionKind,
    request_id: str | None,
    cache_salt: str | None,
) -> None:
    """The gateway's request id (known in ``mirror`` by vLLM's name for it from now on) and
    vLLM's own per-request salt (a tenant's blocks are its own) on ``outgoing``."""
    if request_id is not None:
        outgoing["request_id"] = request_id
        mirror.name_request(vllm_request_id(kind, request_id), request_id)
    if cache_salt:
        outgoing["cache_salt"] = cache_salt


def blocks_served(
    block_size: int, cached_tokens: int, hashes: Sequence[BlockHash]
) -> tuple[int, int]:
    """Of a served prompt's full blocks (``hashes``): the leading ones vLLM's cache held, and
    the ones it computed."""
    hit = cached_tokens // block_size
    return hit, max(0, len(hashes) - hit)


def refused_error(liveness: EngineLiveness, status: int, data: Any) -> Exception:
    """The error vLLM's answer other than 200 is: the dead engine's, a 5xx, or vLLM refusing
    the request (a 400 the client can act on)."""
    message = (data.get("error") or {}).get("message") if isinstance(data, dict) else data
    if liveness.dead is not None:
        return liveness.error()
    if status >= 500:
        return BackendUnavailable(f"vLLM answered HTTP {status}: {message}")
    return UsageError("body", f"vLLM refused the request: {message}")


def refused_result(
    rid: RequestId,
    answer: ConnectorAnswer,
    prompt_pid: str | None,
    events_seq: int,
    hashes: Sequence[BlockHash],
) -> ServeResult:
    """A request the connector refused (or vLLM aborted): the refusal's outcome, naming the
    claims in the way and the blocks short."""
    refused = answer.refused or {}
    outcome = ActiveOutcome(
        rid,
        ArbiterAction.REFUSE_ACTIVE,
        Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE,
        blocking_claim_ids=tuple(ClaimId(c) for c in refused.get("blocking_claim_ids", ())),
        shortfall_blocks=int(refused.get("shortfall_blocks") or 0),
        retry_after_s=refused.get("retry_after_s"),
    )
    return ServeResult(
        outcome, {"prompt": prompt_pid}, events_seq=events_seq, block_hashes=tuple(hashes)
    )


def book(
    prompts: PromptBook,
    tokens: bytes,
    hashes: list[BlockHash],
    prompt_pid: str | None,
    sequence: bytes | None,
    seq_hashes: list[BlockHash],
    cache_salt: str | None,
) -> tuple[str | None, str | None]:
    """The prompt (unless ``prompt_pid`` names it already) and the sequence (both packed) in
    the prompt book: their prefix ids. A reply that completes no block past the prompt names the
    prompt's own prefix: the book knows it already (``register``)."""
    if prompt_pid is None:
        prompt_pid = prompts.register(tokens, cache_salt, hashes)[1]
    seq_pid = prompts.register(sequence, cache_salt, seq_hashes)[1] if sequence else None
    return prompt_pid, seq_pid


def resolve(
    claims: Sequence[Mapping[str, Any]],
    owner: str | None,
    prompt_pid: str | None,
    prompt: Sequence[BlockHash],
    *,
    identity: CacheIdentity,
    exists: Callable[[str], bool],
) -> list[ClaimSpec]:
    """Each claim of a request (``owner``'s; its prompt's prefix id and hashes), checked
    before anything is sent (fail closed). On vLLM a claim names the request's own prompt
    (``@prompt``, or its prefix id) or its prompt and reply (``@sequence``: its blocks are
    known when the request ends); ``exists``: whether a claim id is taken already."""

    def known(prefix_id: str) -> Sequence[BlockHash] | None:
        if prefix_id == prompt_pid:
            return prompt
        raise UsageError(
            "object_id",
            "on vLLM a claim sent with a request names that request's prompt "
            "(@prompt) or its prompt and reply (@sequence)",
        )

    resolved = resolve_request_claims(
        claims,
        identity=identity,
        owner_scope=owner,
        prompt=prompt,
        sequence=None,
        known=known,
        exists=exists,
    )
    return [r.spec for r in resolved]  # a refusal there: the connector says it too


class CompletionForwarder:
    """The completions ``kv`` forwards to vLLM over ``http`` (``lock``: the mirror's and the
    prompt book's), and how many went."""

    def __init__(
        self,
        kv: VllmLink,
        http: Upstream,
        lock: asyncio.Lock,
        gate: Callable[[ClaimSpec], str | None],
    ) -> None:
        self._kv = kv
        self._http = http
        self._lock = lock
        self._gate = gate
        self.block_size = kv.block_size
        self._mirror = kv.mirror
        self._prompts = kv.prompts
        self._riding = kv.riding
        self._liveness = kv.liveness
        self._sight = kv.sight
        self.completions = 0
        """Completions forwarded to vLLM for clients (streamed or not): the agents' calls."""
        self.bare = 0
        """Of them, plain OpenAI calls that went without an envelope (``_envelope``)."""
        self.prompt_tokens = 0
        """Prompt tokens of the completions vLLM served (its usage)."""
        self.cached_tokens = 0
        """Of them, those vLLM's prefix cache served (its ``cached_tokens``)."""
        self.streamed = [0, 0]
        """Streamed chunks passed on to clients, and the batches they went in (chunks that
        came from vLLM together go on together: ``UpstreamStream.batches``)."""
        self._pool: tuple[float, dict[str, Any]] | None = None
        """The pool's figures the connector last gave, and when (``monotonic``)."""

    def figures(self) -> dict[str, Any]:
        """For ``/v1/stats``: the plain OpenAI calls with nothing riding (forwarded as they
        came, nothing signed), and the streamed chunks passed on, in how many writes."""
        chunks, writes = self.streamed
        return {"bare_completions": self.bare, "streamed": {"chunks": chunks, "writes": writes}}

    def prepare(self, call: CompletionCall) -> CompletionCall:
        """The body's shape checked here, before anything changes (a release it carries
        included); vLLM checks the rest itself (its 400 is the client's)."""
        check_body(call.kind, call.body)
        return call

    async def write(self, call: CompletionCall) -> Written:
        """Forward one completion (``prepare`` checked it) with its claims; the upstream
        payload and the KV life (``request_id``: the gateway's name for it, in its outcome and
        events)."""
        kind, body, claims = call.kind, call.body, call.claims
        owner, cache_salt, request_id = call.owner_scope, call.cache_salt, call.request_id
        client = await self._ready()
        if body.get("stream"):
            raise UsageError(
                "stream",
                "streaming through the vLLM KV side is not supported yet; send stream: false",
            )
        tokens, hashes, prompt_pid, specs = await self._claims_of(
            kind, body, claims, owner, cache_salt
        )
        tenant = owner or "default"
        outgoing = forwarded(body, client.model, call.priority)
        named(outgoing, self._mirror, kind, request_id, cache_salt)
        wants_ids = bool(body.get("return_token_ids"))
        on_reply, gated, riding, envelope = self._envelope(client, specs, tenant, body)
        if tokens is None or on_reply:
            outgoing["return_token_ids"] = True  # the prompt's and the reply's token ids
        if envelope is not None:
            outgoing["kv_transfer_params"] = {"agentclaims": envelope}
        self.completions += 1
        data = await self._post(kind, outgoing, riding)
        payload = client_payload(data, keep_token_ids=wants_ids)
        if request_id is not None:  # vLLM's id is its prefix, then ours: ours, as named
            payload["id"] = request_id
        result = await self._answered(
            client, data, tokens, hashes, prompt_pid, specs, gated, on_reply, cache_salt
        )
        return Written(payload, result)

    async def plain(
        self,
        kind: CompletionKind,
        body: Mapping[str, Any],
        *,
        cache_salt: str | None = None,
        request_id: str | None = None,
        fresh_pool_s: float | None = None,
        priority: int | None = None,
    ) -> PlainReply | Written | None:
        """A plain OpenAI call (not streamed, no prompt-cache fields, no ``agentclaims``
        object or one that carries nothing: ``fresh_pool_s`` given, the pool's figures its
        answer gives may be that old; ``prepare`` checked it; ``cache_salt`` and
        ``request_id``: its tenant's; ``priority``: its place in vLLM's queue), written with
        the least work that books it: ``None`` while an operation waits to ride or the
        figures are older (``write`` carries it, its answer brings new ones). The request
        goes as ``write`` sends one without claims or envelope; an answer the connector
        spoke to (a refusal, a deferral, events) or that vLLM aborted is booked as ``write``
        books it (``Written``), any other is a ``PlainReply``: the same prompt and sequence
        named, the same served outcome."""
        client = await self._ready()
        if self._riding:  # after the start's waits: what was queued meanwhile rides too
            return None
        pool = self._pool
        if fresh_pool_s is not None and (pool is None or monotonic() - pool[0] > fresh_pool_s):
            return None
        outgoing = forwarded(body, client.model, priority)
        outgoing["return_token_ids"] = True  # the prompt's and the reply's token ids
        named(outgoing, self._mirror, kind, request_id, cache_salt)
        self.completions += 1
        self.bare += 1
        data = await self._post(kind, outgoing, [])
        payload = client_payload(data, keep_token_ids=bool(body.get("return_token_ids")))
        if request_id is not None:  # vLLM's id is its prefix, then ours: ours, as named
            payload["id"] = request_id
        choice = (data.get("choices") or [{}])[0]
        ids = prompt_ids(data)
        if (
            ids is None
            or choice.get("finish_reason") == "abort"
            or (data.get("kv_transfer_params") or {}).get(EXTENSION_KEY)
        ):
            result = await self._answered(client, data, None, [], None, [], {}, set(), cache_salt)
            return Written(payload, result)
        tokens = pack_tokens(ids)
        sequence = packed_sequence(data, tokens, self.block_size)
        hashes, seq_hashes = self._prompts.chains(tokens, sequence, cache_salt)
        self._sight.last_stored = tuple(hashes)
        usage = data.get("usage") or {}
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        self._count_served(int(usage.get("prompt_tokens") or len(ids)), cached)
        hit, computed = blocks_served(self.block_size, cached, hashes)
        async with self._lock if self._lock.locked() else _UNLOCKED:
            prompt_pid, seq_pid = book(
                self._prompts, tokens, hashes, None, sequence, seq_hashes, cache_salt
            )
            return PlainReply(
                payload,
                self._mirror.our_request(str(data.get("id"))) or str(data.get("id")),
                hit_blocks=hit,
                computed_blocks=computed,
                prompt=prompt_pid,
                sequence=seq_pid,
                events_seq=self._mirror.events.seq,
                pool=None if fresh_pool_s is None or self._pool is None else self._pool[1],
            )

    async def _ready(self) -> ConnectorClient:
        """The side started (at once when it is; again after vLLM's engine died) and the
        connector's client, its model named."""
        await self._kv.start()
        return await self._kv.connector_ready()

    async def _post(
        self, kind: CompletionKind | str, outgoing: dict[str, Any], riding: list[Op]
    ) -> dict[str, Any]:
        """``outgoing`` sent to vLLM: its answer, or the error vLLM's failure is (``riding``:
        the operations it carried, put back when it may not have reached the connector)."""
        try:
            status, data = await self._http.post(KINDS[kind], outgoing)
        except BackendUnavailable:
            self._riding.put_back(riding)
            # vLLM closed the connection under the request (a dying API server does): ask its
            # /health, which says whether the engine is dead (503, or no vLLM listening)
            await self._kv.health()
            if self._liveness.dead is not None:
                raise self._liveness.error() from None
            raise
        if status != 200 or not isinstance(data, dict):
            self._riding.put_back(riding)  # it may not have reached the connector: again
            raise refused_error(self._liveness, status, data)
        return data

    async def stream(self, call: CompletionCall) -> UpstreamStream:
        """Forward one streamed completion: its chunks pass on as vLLM produces them
        (``agentclaims.vllm.streamed``), its KV life (prompt and sequence named, cached
        tokens, its claims' decisions) once it ends. vLLM sends no connector answer in a
        stream: the gateway reads it over the connector's channel (``streams_claims``); a
        request with claims where there is none is answered whole (``write``). ``prepare``
        checked the call."""
        kind, body, claims = call.kind, call.body, call.claims
        owner, cache_salt = call.owner_scope, call.cache_salt
        client = await self._ready()
        if claims and not self._kv.streams_claims:
            raise UsageError("stream", "no channel to the connector: claims need stream false")
        tokens, hashes, prompt_pid, specs = await self._claims_of(
            kind, body, claims, owner, cache_salt
        )
        outgoing = forwarded(body, client.model, call.priority)
        outgoing["stream"] = True
        outgoing["return_token_ids"] = True  # the prompt's and the reply's, to name them
        options = dict(body.get("stream_options") or {})
        outgoing["stream_options"] = {**options, "include_usage": True}
        named(outgoing, self._mirror, kind, call.request_id, cache_salt)
        on_reply, gated, riding, envelope = self._envelope(client, specs, owner or "default", body)
        if envelope is not None:
            outgoing["kv_transfer_params"] = {"agentclaims": envelope}
        self.completions += 1
        try:
            upstream = await self._http.stream(KINDS[kind], outgoing)
        except BackendUnavailable:
            self._riding.put_back(riding)
            await self._kv.health()  # a dying server's refused connection: is the engine dead?
            if self._liveness.dead is not None:
                raise self._liveness.error() from None
            raise
        if upstream.status != 200:
            self._riding.put_back(riding)
            raise refused_error(self._liveness, upstream.status, upstream.body())

        async def settle(data: dict[str, Any]) -> ServeResult:
            kept = (
                await client.answer_of(envelope["nonce"], owner)
                if envelope is not None and envelope["ops"]
                else None
            )
            if kept is not None:  # the connector's answer, read over its channel
                data = {**data, "kv_transfer_params": {"agentclaims": kept}}
            return await self._answered(
                client, data, tokens, hashes, prompt_pid, specs, gated, on_reply, cache_salt
            )

        return UpstreamStream(
            upstream,
            keep_token_ids=bool(body.get("return_token_ids")),
            include_usage=options.get("include_usage") is True,
            settle=settle,
            tally=self.streamed,
        )

    async def _claims_of(
        self,
        kind: str,
        body: Mapping[str, Any],
        claims: Sequence[Mapping[str, Any]],
        owner: str | None,
        cache_salt: str | None,
    ) -> tuple[bytes | None, list[BlockHash], str | None, list[ClaimSpec]]:
        """A request's claims checked (fail closed) before it goes: its prompt's tokens
        (packed),
        hashes and prefix id when a claim names the prompt (``@prompt`` or its id: vLLM's
        ``/tokenize`` first); a request whose claims all name ``@sequence`` (the SDK's: what
        the call leaves cached) needs none before it runs, and saves that round trip."""
        if not claims:
            return None, [], None, []
        on_reply_only = all(
            isinstance(c, Mapping) and c.get("object_id") == SEQUENCE_OBJECT for c in claims
        )
        ids = None if on_reply_only else await self._kv.tokenize(kind, body)
        tokens = None if ids is None else pack_tokens(ids)
        hashes: list[BlockHash] = []
        prompt_pid: str | None = None
        async with self._lock:
            if tokens is not None:
                hashes, prompt_pid = self._prompts.register(tokens, cache_salt)
            specs = resolve(
                claims,
                owner,
                prompt_pid,
                hashes,
                identity=self._kv.identity(),
                exists=self._mirror.claims.__contains__,
            )
        return tokens, hashes, prompt_pid, specs

    def _envelope(
        self,
        client: ConnectorClient,
        specs: Sequence[ClaimSpec],
        tenant: str,
        body: Mapping[str, Any],
    ) -> tuple[set[str], dict[str, str], list[Op], dict[str, Any] | None]:
        """What a request to vLLM carries: its claims on ``@sequence`` (held when it ends),
        the claims refused here (the reason, by claim id), the pending operations that ride on
        it (taken: put them back if it does not go), and the signed envelope of them all.

        A plain OpenAI call (no ``agentclaims`` object) that carries no operation goes without
        an envelope, as vLLM's own: nothing is signed, and vLLM's answer tells the gateway what
        it needs (the token ids, the cached tokens; the connector answers a refusal or a
        deferral of any request). A call with the object that comes this way carries one, so
        its answer brings the connector's events and new pool figures (the SDK plans with
        them); one that carries nothing while the figures are fresh takes ``plain``."""
        on_reply = {s.claim_id for s in specs if s.object_id == SEQUENCE_OBJECT}
        gated = {spec.claim_id: reason for spec in specs if (reason := self._gate(spec))}
        holds = [
            hold_op(spec, all_blocks=spec.claim_id in on_reply)
            for spec in specs
            if spec.claim_id not in gated
        ]
        riding = self._riding.take()
        ops = [*riding, *holds]
        if not ops and EXTENSION_KEY not in body:
            self.bare += 1
            return on_reply, gated, riding, None
        return on_reply, gated, riding, client.envelope(ops, tenant)

    async def _answered(
        self,
        client: ConnectorClient,
        data: Mapping[str, Any],
        tokens: bytes | None,
        hashes: list[BlockHash],
        prompt_pid: str | None,
        specs: list[ClaimSpec],
        gated: Mapping[str, str],
        on_reply: set[str],
        cache_salt: str | None,
    ) -> ServeResult:
        """The KV life of vLLM's answer ``data`` (read whole, or put together from a stream):
        the prompt and sequence named, the claims decided from the connector's answer
        (``tokens``: the prompt's, packed, where a claim named it before it went)."""
        answer = client._answer(data)
        if answer.pool is not None:
            self._pool = (monotonic(), dict(answer.pool))
        if tokens is None:
            ids = prompt_ids(data)
            tokens = None if ids is None else pack_tokens(ids)
        sequence = packed_sequence(data, tokens, self.block_size)
        seq_hashes: list[BlockHash] = []
        if tokens is not None:
            hashes, seq_hashes = self._prompts.chains(tokens, sequence, cache_salt, hashes)
        if answer.served and tokens is not None:
            self._sight.last_stored = tuple(hashes)
            footprint = max(
                (s.footprint_blocks for s in specs if s.claim_id not in on_reply), default=0
            )
            await self._sight.seen_stored([*hashes[:footprint], *(seq_hashes if on_reply else ())])
        # nothing below awaits: where no one holds the lock, it needs no taking
        async with self._lock if self._lock.locked() else _UNLOCKED:
            seq_pid: str | None = None
            if tokens is not None:
                prompt_pid, seq_pid = book(
                    self._prompts, tokens, hashes, prompt_pid, sequence, seq_hashes, cache_salt
                )
            specs = [
                dataclasses.replace(spec, object_id=seq_pid, footprint_blocks=len(seq_hashes))
                if spec.claim_id in on_reply and seq_pid is not None
                else spec
                for spec in specs
            ]
            self._mirror.absorb(answer)
            return self._result(
                answer,
                specs,
                prompt_pid,
                hashes,
                gated,
                sequence=(seq_pid, seq_hashes),
                on_reply=on_reply,
            )

    def _count_served(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A served completion's prompt, for the prefix hit ratio (``/metrics``)."""
        self.prompt_tokens += max(0, prompt_tokens)
        self.cached_tokens += max(0, min(cached_tokens, prompt_tokens))

    def _result(
        self,
        answer: ConnectorAnswer,
        specs: Sequence[ClaimSpec],
        prompt_pid: str | None,
        hashes: Sequence[BlockHash],
        gated: Mapping[str, str],
        *,
        sequence: tuple[str | None, Sequence[BlockHash]] = (None, ()),
        on_reply: frozenset[str] | set[str] = frozenset(),
    ) -> ServeResult:
        seq_pid, seq_hashes = sequence
        rid = RequestId(self._mirror.our_request(answer.request_id) or answer.request_id)
        if answer.refused is not None or answer.finish_reason == "abort":
            return refused_result(rid, answer, prompt_pid, self._mirror.events.seq, hashes)
        self._count_served(answer.prompt_tokens, answer.cached_tokens)
        hit, computed = blocks_served(self.block_size, answer.cached_tokens, hashes)
        outcome = ActiveOutcome(
            rid,
            ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT,
            Feasibility.FEASIBLE,
            hit_blocks=hit,
            computed_blocks=computed,
        )
        decisions = tuple(
            self._mirror.refuse(spec, gated[spec.claim_id], rid)
            if spec.claim_id in gated
            else self._mirror.decide(
                spec, answer, seq_hashes if spec.claim_id in on_reply else hashes
            )
            for spec in specs
        )
        return ServeResult(
            outcome,
            {"prompt": prompt_pid, "sequence": seq_pid, "messages": []},
            decisions,
            events_seq=self._mirror.events.seq,
            cached_tokens=answer.cached_tokens,
            block_hashes=tuple(hashes),
            deferred_s=answer.deferred_s,
            pool=None if answer.pool is None else dict(answer.pool),
        )
