"""``VllmKV``: the gateway's KV side on a real vLLM server running the agentclaims connector.

The gateway stays the one server implementation; with ``--kv vllm`` its KV side is this class,
which is also the text side (vLLM writes the replies). For each completion it::

    strips any client kv_transfer_params (only the gateway may speak to the connector)
    -> tokens from vLLM's /tokenize (the chat template applied by vLLM itself)
    -> its own chained block hashes and prefix ids (never vLLM's hashes: they are seeded per
       process), the prompt prefix registered for later claims by id
    -> the request's claims as signed ``hold`` operations, forwarded with the request
    -> the connector's answer: decisions, claim events (re-sequenced into the gateway's
       stream), or a refusal (finish reason ``abort``) turned into the claim-scoped outcome

A claim sent with a request names its ``@prompt`` or its ``@sequence`` (prompt and reply: every
full block the request leaves cached, held when it finishes): it rides on the request, no
engine request of its own. A release waits for the next request the gateway sends to vLLM, any
session's or tenant's (the gateway is the only signer), and rides on it; while vLLM idles it
evicts nothing, so the wait loses nothing. One that finds no request within ``ride_bound_s``
(50 ms by default) goes on its own: over the connector's channel (a local socket, no engine
request) where the gateway reaches it, else on a one-token request. Renewals, harm judgements
and the answer of a streamed request (vLLM sends none in a stream) take the channel at once.
A claim on an already served prefix (``POST /v1/claims``) re-runs that prefix for one token
with a ``hold``: its blocks are prefix-cache hits, held when the request finishes.

With ``kv_events`` (vLLM's ZMQ KV events endpoint) an observer joins vLLM's own block events to
the gateway's hashes: per-block residency, materialization seen in vLLM's cache, losses after a
claim's end, and harm (fail closed) if a held block is ever removed. A fresh instance for the
conformance suite is every hold revoked and vLLM's prefix cache reset; without ``kv_events``
residency is known only for held claims (an unheld prefix reports 0: fail closed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentclaims_vllm.ops import Op, Release, Renew, RevokeAll

from agentclaims.contract import (
    BACKEND_RESTART,
    ArbiterAction,
    BlockHash,
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    ClaimState,
    EventName,
    Feasibility,
    OwnerScope,
    PrefixId,
    RequestId,
)
from agentclaims.engine.blocks import hash_token_blocks
from agentclaims.errors import (
    BackendError,
    BackendUnavailable,
    ContractViolation,
    OperationNotExposed,
    UsageError,
)
from agentclaims.kernel import (
    identity_problem,
    resolve_request_claims,
)
from agentclaims.lowering.served import CONNECTOR_DESCRIPTOR
from agentclaims.protocol import (
    CLAIMS_RIDE_ON_REQUESTS,
    PROMPT_OBJECT,
    RENEW_AS_IS,
    SEQUENCE_OBJECT,
    SHEDS_BY_HINTS,
    ActiveOutcome,
    ActiveRequest,
    ClaimDecision,
    ClaimView,
    CompletionCall,
    EventPage,
    Renewal,
    ServeResult,
    Written,
)
from agentclaims.protocol.writer import check_body
from agentclaims.vllm.client import ConnectorAnswer, ConnectorClient
from agentclaims.vllm.liveness import EngineLiveness
from agentclaims.vllm.mirror import ClaimMirror
from agentclaims.vllm.observer import KVEventsObserver
from agentclaims.vllm.payloads import (
    KINDS,
    client_payload,
    forwarded,
    hold_op,
    prompt_ids,
    sequence_ids,
)
from agentclaims.vllm.prompts import PromptBook
from agentclaims.vllm.riding import RidingOps
from agentclaims.vllm.streamed import UpstreamStream
from agentclaims.vllm.upstream import Upstream

__all__ = ["VllmKV"]

log = logging.getLogger("agentclaims.vllm")

_CONTRACT_EVENTS = {e.value for e in EventName}
_STOCK_DESCRIPTOR = Path(__file__).parents[2] / "integrations" / "descriptors" / "vllm-stock.yaml"
"""Stock vLLM's descriptor (every held mode rejected), where the repository is at hand; else
the vLLM KV side without a connector serves none (every mode unknown: fail closed)."""


class _Stamp:
    """What the vLLM side's events say of where they come from (an ``EventSource``)."""

    __slots__ = ("_kv",)

    clock = staticmethod(time.time_ns)

    def __init__(self, kv: VllmKV) -> None:
        self._kv = kv

    @property
    def run_id(self) -> str:
        return self._kv.run_id

    @property
    def policy_name(self) -> str:
        return "vllm+agentclaims" if self._kv.connector else "vllm"

    @property
    def num_blocks(self) -> int:
        return self._kv.usable_blocks


class VllmKV:
    """The claims protocol (and serving) on vLLM + the agentclaims connector."""

    name = "vllm"

    def __init__(
        self,
        upstream: str,
        claims_key: str,
        *,
        model: str | None = None,
        block_size: int = 32,
        timeout_s: float = 120.0,
        max_prefixes: int = 100_000,
        kv_events: str | None = None,
        kv_events_replay: str | None = None,
        events_python: str | None = None,
        ride_bound_s: float = 0.05,
    ) -> None:
        if not (isinstance(ride_bound_s, int | float) and 0 <= ride_bound_s <= 10):
            raise UsageError(
                "ride_bound_s", f"must be within [0, 10] seconds, got {ride_bound_s!r}"
            )
        self._http = Upstream(upstream, timeout_s=timeout_s)  # checks the URL
        self.upstream = self._http.base_url
        self.block_size = block_size
        self._model = model
        self._key = claims_key
        self._connector = ConnectorClient(self.upstream, claims_key, model="", client=self._http)
        """One client, one cursor on the connector's event stream, whatever the tenant."""
        self.prompts = PromptBook(block_size, max_prefixes)
        """The prompts served here, by prefix id (their tokens and cache salt)."""
        self.run_id = uuid.uuid4().hex[:12]
        self._lock = asyncio.Lock()
        self._started: asyncio.Task[None] | None = None
        self.runtime_version: str | None = None
        """vLLM's version (from its /version), known once started."""
        self.lowering: Path | None = CONNECTOR_DESCRIPTOR
        """What the gateway checks and serves as this KV side's lowering."""
        self.claim_gate: Callable[[ClaimSpec], str | None] | None = None
        """Asked about every claim before it is sent: a reason refuses it here (tenant limits)."""
        self.observer: KVEventsObserver | None = None
        """vLLM's KV events joined to the gateway's block hashes (``kv_events``): per-block
        residency, materialization seen in vLLM's own cache, and harm if a held block goes."""
        if kv_events is not None:
            from agentclaims.vllm.launch import vllm_python

            self.observer = KVEventsObserver(
                kv_events,
                python=vllm_python(events_python),
                block_size=block_size,
                replay=kv_events_replay,
            )
        self.mirror = ClaimMirror(
            _Stamp(self),
            self._lock,
            ask=lambda: self.riding.send_now([]),
            release=self._release_now,
            observer=self.observer,
            max_requests=max_prefixes,
        )
        """What this gateway knows of its claims on vLLM, and their events."""
        self.connector = True
        """Whether the agentclaims connector answers in this vLLM (stock vLLM: no claim held)."""
        self.usable_blocks = 0
        """vLLM's pool, in blocks (its null block excluded), known once started."""
        self._last_stored: tuple[BlockHash, ...] = ()
        self.completions = 0
        """Completions forwarded to vLLM for clients (streamed or not): the agents' calls."""
        self.liveness = EngineLiveness(self._http, kv_events)
        """Whether vLLM's engine is known dead (its 500, a refused connection, ``/health``
        503): every request answers 503 with why until a vLLM answers ``/health`` again."""
        self._http.on_engine_dead = self._engine_died
        self.riding = RidingOps(float(ride_bound_s), self._send, self._absorb_locked, self._alive)
        """Claim operations waiting to ride on the next request to vLLM."""

    async def start(self) -> None:
        """Once, before anything else: end every hold the connector still has from an earlier
        gateway (this one has no record of them: a restart, a crash). Each ends with its
        ``resident_claim_expired`` (reason ``revoked: gateway_restart``), read into this
        gateway's stream: no claim disappears silently. While vLLM's engine is dead: a
        ``BackendUnavailable`` naming why, until a vLLM answers again (then once more)."""
        started = self._started
        if started is not None and started.done() and self.liveness.dead is None:
            started.result()  # every request asks: the started one returns at once
            return
        if self.liveness.dead is not None:
            await self.liveness.revive()
        if self._started is None:
            self._started = asyncio.ensure_future(self._revoke_orphans())
        await asyncio.shield(self._started)

    async def _revoke_orphans(self) -> None:
        version = (await self._get("/version")).get("version")
        self.runtime_version = str(version) if version else None
        self.usable_blocks = await self._pool_blocks()
        if self.observer is not None:
            self.observer.on_stored = self.mirror.blocks_stored
            await self.observer.start()
        client = await self._connector_ready()
        client.skip_events((await client.complete([1], max_tokens=1)).last_seq)  # history before
        answer = await client.operate([RevokeAll("gateway_restart")])
        self.connector = bool(answer.results)  # stock vLLM ignores the operations
        if not self.connector:
            self.lowering = _STOCK_DESCRIPTOR if _STOCK_DESCRIPTOR.is_file() else None
        async with self._lock:
            self.mirror.absorb(answer)

    @property
    def engine_dead(self) -> str | None:
        """Why vLLM's engine is known dead (``None`` while it is not)."""
        return self.liveness.dead

    # ------------------------------------------------------------------ a dead engine
    def _engine_died(self, seen: str, refused: bool = False) -> None:
        """vLLM's engine is gone (``seen``: how the gateway knows; ``refused``: a refused
        connection, which says so only of a vLLM this side had started on). Fail closed, once: every
        live claim ends with its event (a materialized one ``resident_claim_harmed``, cause
        ``backend_restart``: its blocks went with the engine; one not yet seen resident
        ``resident_claim_expired``, reason ``backend_restart``), and every request answers
        503 until a vLLM answers ``/health`` again."""
        if self.liveness.dead is not None:
            return
        if refused and not (
            self._started and self._started.done() and not self._started.exception()
        ):
            return  # never served here: nothing of it was known, nothing is lost
        detail = self.liveness.died(seen)
        self.riding.clear()  # its holds went with it
        self._started = None  # a vLLM that comes back is started afresh (orphans, pool, version)
        log.error("agentclaims: %s; every claim on it ends (%s)", detail, BACKEND_RESTART)
        self.mirror.end_all(detail)

    async def _pool_blocks(self) -> int:
        """vLLM's KV blocks less its null block, from its ``/metrics`` (``cache_config_info``)."""
        _, text = await self._http.get_text("/metrics", timeout_s=10.0)
        found = re.search(r'num_gpu_blocks="(\d+)"', text)
        return max(0, int(found.group(1)) - 1) if found else 0

    # ------------------------------------------------------------------ upstream plumbing
    async def model(self) -> str:
        if self._model is None:
            data = await self._get("/v1/models")
            models = data.get("data") or []
            if not models:
                raise BackendError(f"vLLM at {self.upstream} serves no model")
            self._model = str(models[0]["id"])
        return self._model

    async def health(self) -> dict[str, Any]:
        """Whether vLLM answers its ``/health`` (for the gateway's own ``/health``)."""
        try:
            status, _ = await self._http.request("GET", "/health", timeout_s=5.0)
        except BackendUnavailable as exc:
            return {
                "usable": False,
                "detail": self.liveness.reason() if self.liveness.dead else str(exc),
            }
        if status == 503:  # vLLM's answer for a dead engine (EngineDeadError)
            self._engine_died(f"vLLM at {self.upstream} /health: HTTP 503")
        if self.liveness.dead is not None:
            again = "; vLLM answers again" if status == 200 else ""
            return {"usable": False, "detail": self.liveness.reason() + again}
        return {"usable": status == 200, "detail": f"vLLM /health: HTTP {status}"}

    async def _get(self, path: str) -> dict[str, Any]:
        status, data = await self._http.get(path)
        if status != 200 or not isinstance(data, dict):
            raise BackendError(f"vLLM {path}: HTTP {status}")
        return data

    async def _max_model_len(self) -> int | None:
        models = (await self._get("/v1/models")).get("data") or [{}]
        value = models[0].get("max_model_len")
        return int(value) if isinstance(value, int) else None

    async def _connector_ready(self) -> ConnectorClient:
        self._connector.model = await self.model()
        return self._connector

    async def tokenize(self, kind: str, body: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids as vLLM will see them."""
        request: dict[str, Any] = {"model": await self.model()}
        if kind == "chat":
            request["messages"] = body.get("messages")
            request["add_generation_prompt"] = True
            if body.get("tools"):
                request["tools"] = body["tools"]
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return list(prompt)
            request["prompt"] = prompt
        status, data = await self._http.post("/tokenize", request)
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            message = (data.get("error") or {}).get("message") if isinstance(data, dict) else data
            raise UsageError(
                "messages" if kind == "chat" else "prompt", f"vLLM cannot tokenize it: {message}"
            )
        return [int(t) for t in data["tokens"]]

    # ------------------------------------------------------------------ prefixes and events
    # ------------------------------------------------------------------ completions
    # ------------------------------------------------------------------ ReplyWriter
    streams = True
    """vLLM's tokens pass through the gateway as it produces them."""

    @property
    def model_name(self) -> str:
        return self._model or "vllm"

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
        await self.start()
        if body.get("stream"):
            raise UsageError(
                "stream",
                "streaming through the vLLM KV side is not supported yet; send stream: false",
            )
        tokens, hashes, prompt_pid, specs = await self._claims_of(
            kind, body, claims, owner, cache_salt
        )
        tenant = owner or "default"
        client = await self._connector_ready()
        outgoing = forwarded(body, client.model)
        if request_id is not None:
            outgoing["request_id"] = request_id
            self.mirror.name_request(f"cmpl-{request_id}", request_id)
        if cache_salt:  # vLLM's own per-request salt: a tenant's blocks are its own
            outgoing["cache_salt"] = cache_salt
        wants_ids = bool(body.get("return_token_ids"))
        on_reply, gated, riding, envelope = self._envelope(client, specs, tenant)
        if tokens is None or on_reply:
            outgoing["return_token_ids"] = True  # the prompt's and the reply's token ids
        outgoing["kv_transfer_params"] = {"agentclaims": envelope}
        self.completions += 1
        try:
            status, data = await self._http.post(KINDS[kind], outgoing)
        except BackendUnavailable:
            self.riding.put_back(riding)
            # vLLM closed the connection under the request (a dying API server does): ask its
            # /health, which says whether the engine is dead (503, or no vLLM listening)
            await self.health()
            if self.liveness.dead is not None:
                raise self.liveness.error() from None
            raise
        if status != 200 or not isinstance(data, dict):
            self.riding.put_back(riding)  # it may not have reached the connector: again, harmlessly
            raise self._refused(status, data)
        payload = client_payload(data, keep_token_ids=wants_ids)
        result = await self._answered(
            client, data, tokens, hashes, prompt_pid, specs, gated, on_reply, cache_salt
        )
        return Written(payload, result)

    def _refused(self, status: int, data: Any) -> Exception:
        """The error vLLM's answer other than 200 is: the dead engine's, a 5xx, or vLLM
        refusing the request (a 400 the client can act on)."""
        message = (data.get("error") or {}).get("message") if isinstance(data, dict) else data
        if self.liveness.dead is not None:
            return self.liveness.error()
        if status >= 500:
            return BackendUnavailable(f"vLLM answered HTTP {status}: {message}")
        return UsageError("body", f"vLLM refused the request: {message}")

    async def stream(self, call: CompletionCall) -> UpstreamStream:
        """Forward one streamed completion: its chunks pass on as vLLM produces them
        (``agentclaims.vllm.streamed``), its KV life (prompt and sequence named, cached
        tokens, its claims' decisions) once it ends. vLLM sends no connector answer in a
        stream: the gateway reads it over the connector's channel (``streams_claims``); a
        request with claims where there is none is answered whole (``write``). ``prepare``
        checked the call."""
        kind, body, claims = call.kind, call.body, call.claims
        owner, cache_salt = call.owner_scope, call.cache_salt
        await self.start()
        if claims and not self.streams_claims:
            raise UsageError("stream", "no channel to the connector: claims need stream false")
        tokens, hashes, prompt_pid, specs = await self._claims_of(
            kind, body, claims, owner, cache_salt
        )
        client = await self._connector_ready()
        outgoing = forwarded(body, client.model)
        outgoing["stream"] = True
        outgoing["return_token_ids"] = True  # the prompt's and the reply's, to name them
        options = dict(body.get("stream_options") or {})
        outgoing["stream_options"] = {**options, "include_usage": True}
        if cache_salt:
            outgoing["cache_salt"] = cache_salt
        on_reply, gated, riding, envelope = self._envelope(client, specs, owner or "default")
        outgoing["kv_transfer_params"] = {"agentclaims": envelope}
        self.completions += 1
        try:
            upstream = await self._http.stream(KINDS[kind], outgoing)
        except BackendUnavailable:
            self.riding.put_back(riding)
            await self.health()  # a dying server's refused connection: is the engine dead?
            if self.liveness.dead is not None:
                raise self.liveness.error() from None
            raise
        if upstream.status != 200:
            self.riding.put_back(riding)
            raise self._refused(upstream.status, upstream.body())

        async def settle(data: dict[str, Any]) -> ServeResult:
            kept = await client.answer_of(envelope["nonce"], owner) if envelope["ops"] else None
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
        )

    @property
    def streams_claims(self) -> bool:
        """Whether a streamed request may carry claims: the connector's answer, which vLLM
        sends in no stream, is read over its channel."""
        return self._connector.channel is not None

    async def _claims_of(
        self,
        kind: str,
        body: Mapping[str, Any],
        claims: Sequence[Mapping[str, Any]],
        owner: str | None,
        cache_salt: str | None,
    ) -> tuple[list[int] | None, list[BlockHash], str | None, list[ClaimSpec]]:
        """A request's claims checked (fail closed) before it goes: its prompt's tokens,
        hashes and prefix id when a claim names the prompt (``@prompt`` or its id: vLLM's
        ``/tokenize`` first); a request whose claims all name ``@sequence`` (the SDK's: what
        the call leaves cached) needs none before it runs, and saves that round trip."""
        if not claims:
            return None, [], None, []
        on_reply_only = all(
            isinstance(c, Mapping) and c.get("object_id") == SEQUENCE_OBJECT for c in claims
        )
        tokens = None if on_reply_only else await self.tokenize(kind, body)
        hashes: list[BlockHash] = []
        prompt_pid: str | None = None
        async with self._lock:
            if tokens is not None:
                hashes, prompt_pid = self.prompts.register(tokens, cache_salt)
            specs = self._resolve(claims, owner, prompt_pid, hashes)
        return tokens, hashes, prompt_pid, specs

    def _envelope(
        self, client: ConnectorClient, specs: Sequence[ClaimSpec], tenant: str
    ) -> tuple[set[str], dict[str, str], list[Op], dict[str, Any]]:
        """What a request to vLLM carries: its claims on ``@sequence`` (held when it ends),
        the claims refused here (the reason, by claim id), the pending operations that ride on
        it (taken: put them back if it does not go), and the signed envelope of them all."""
        on_reply = {s.claim_id for s in specs if s.object_id == SEQUENCE_OBJECT}
        gated = {spec.claim_id: reason for spec in specs if (reason := self._gated(spec))}
        holds = [
            hold_op(spec, all_blocks=spec.claim_id in on_reply)
            for spec in specs
            if spec.claim_id not in gated
        ]
        riding = self.riding.take()
        return on_reply, gated, riding, client.envelope([*riding, *holds], tenant)

    # ------------------------------------------------------------------ riding operations
    async def _send(self, ops: Sequence[Op]) -> ConnectorAnswer:
        """``ops`` (each naming its tenant) to the connector now, over its channel where
        there is one."""
        return await (await self._connector_ready()).operate(ops)

    async def _absorb_locked(self, answer: ConnectorAnswer) -> None:
        async with self._lock:
            self.mirror.absorb(answer)

    def _alive(self) -> bool:
        return self.liveness.dead is None

    async def _release_now(self, claim_id: str, tenant: str) -> object:
        return await self._connector.operate([Release(claim_id)], tenant)

    async def _answered(
        self,
        client: ConnectorClient,
        data: Mapping[str, Any],
        tokens: list[int] | None,
        hashes: list[BlockHash],
        prompt_pid: str | None,
        specs: list[ClaimSpec],
        gated: Mapping[str, str],
        on_reply: set[str],
        cache_salt: str | None,
    ) -> ServeResult:
        """The KV life of vLLM's answer ``data`` (read whole, or put together from a stream):
        the prompt and sequence named, the claims decided from the connector's answer."""
        answer = client._answer(data)
        if tokens is None:
            tokens = prompt_ids(data)
        if tokens is not None and prompt_pid is None:
            hashes = hash_token_blocks(tokens, self.block_size, cache_salt=cache_salt)
        sequence = sequence_ids(data, tokens, self.block_size)
        seq_hashes = (
            hash_token_blocks(  # the prompt's full blocks start the sequence: hashed once
                sequence,
                self.block_size,
                cache_salt=cache_salt,
                known=hashes[: len(sequence) // self.block_size],
            )
            if sequence
            else []
        )
        if answer.served and tokens is not None:
            self._last_stored = tuple(hashes)
            footprint = max(
                (s.footprint_blocks for s in specs if s.claim_id not in on_reply), default=0
            )
            await self._seen_stored([*hashes[:footprint], *(seq_hashes if on_reply else ())])
        async with self._lock:
            if tokens is not None and prompt_pid is None:
                hashes, prompt_pid = self.prompts.register(tokens, cache_salt, hashes)
            seq_pid = (
                self.prompts.register(sequence, cache_salt, seq_hashes)[1] if sequence else None
            )
            specs = [
                dataclasses.replace(spec, object_id=seq_pid, footprint_blocks=len(seq_hashes))
                if spec.claim_id in on_reply and seq_pid is not None
                else spec
                for spec in specs
            ]
            self.mirror.absorb(answer)
            return self._result(
                answer,
                specs,
                prompt_pid,
                hashes,
                gated,
                sequence=(seq_pid, seq_hashes),
                on_reply=on_reply,
            )

    async def _seen_stored(self, hashes: Sequence[BlockHash], timeout_s: float = 1.0) -> None:
        """Wait (bounded) until the observer has seen ``hashes`` stored: vLLM's events of a
        request it answered come on another channel, a little later."""
        if self.observer is not None and hashes:
            await self.observer.wait_resident(hashes, timeout_s)

    def _resolve(
        self,
        claims: Sequence[Mapping[str, Any]],
        owner: str | None,
        prompt_pid: str | None,
        prompt: Sequence[BlockHash],
    ) -> list[ClaimSpec]:
        """Each claim of the request, checked before anything is sent (fail closed). On vLLM
        a claim names the request's own prompt (``@prompt``, or its prefix id) or its prompt
        and reply (``@sequence``: its blocks are known when the request ends)."""

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
            identity=self.identity(),
            owner_scope=owner,
            prompt=prompt,
            sequence=None,
            known=known,
            exists=self.mirror.claims.__contains__,
        )
        return [spec for spec, _ in resolved]

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
        bs = self.block_size
        seq_pid, seq_hashes = sequence
        rid = RequestId(self.mirror.our_request(answer.request_id) or answer.request_id)
        if answer.refused is not None or answer.finish_reason == "abort":
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
                outcome,
                {"prompt": prompt_pid},
                events_seq=self.mirror.events.seq,
                block_hashes=tuple(hashes),
            )
        hit = answer.cached_tokens // bs
        outcome = ActiveOutcome(
            rid,
            ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT,
            Feasibility.FEASIBLE,
            hit_blocks=hit,
            computed_blocks=max(0, len(hashes) - hit),
        )
        decisions = tuple(
            self.mirror.refuse(spec, gated[spec.claim_id], rid)
            if spec.claim_id in gated
            else self.mirror.decide(
                spec, answer, seq_hashes if spec.claim_id in on_reply else hashes
            )
            for spec in specs
        )
        return ServeResult(
            outcome,
            {"prompt": prompt_pid, "sequence": seq_pid, "messages": []},
            decisions,
            events_seq=self.mirror.events.seq,
            cached_tokens=answer.cached_tokens,
            block_hashes=tuple(hashes),
            deferred_s=answer.deferred_s,
        )

    def _gated(self, spec: ClaimSpec) -> str | None:
        if self.mirror.fault is not None:
            return self.mirror.fault
        if not self.connector and spec.protection_mode.value != "best_effort":
            return (
                f"no agentclaims connector answers in this vLLM: {spec.protection_mode.value} "
                "cannot be held (stock prefix caching only)"
            )
        return None if self.claim_gate is None else self.claim_gate(spec)

    # ------------------------------------------------------------------ claims protocol
    def identity(self) -> CacheIdentity:
        return CacheIdentity(
            cache_key_domain=f"vllm:{self.upstream}",
            model_id=self._model or "vllm",
            tokenizer_id=f"vllm:{self._model or 'served-model'}",
            salt_namespace="default",
            block_size=self.block_size,
        )

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        """Claim an already served prefix: re-run it for one token with a ``hold``."""
        await self.start()
        if block_hashes is not None:
            raise OperationNotExposed(self.name, "claims by block hashes (vLLM's are its own)")
        if spec.claim_id in self.mirror.claims:
            raise UsageError("claim_id", f"claim {spec.claim_id!r} already exists")
        await self.model()
        mismatch = identity_problem(spec.cache_identity, self.identity())
        if mismatch is not None:
            async with self._lock:
                return self.mirror.refuse(spec, mismatch, None)
        known = self.prompts.get(spec.object_id)
        if known is None:
            raise UsageError("object_id", f"unknown prefix {spec.object_id!r}: serve it first")
        reason = self._gated(spec)
        if reason is not None:
            async with self._lock:
                return self.mirror.refuse(spec, reason, None)
        client = await self._connector_ready()
        tokens, salt = known
        answer = await client.complete(
            tokens, [hold_op(spec)], max_tokens=1, tenant=spec.owner_scope, cache_salt=salt
        )
        hashes = hash_token_blocks(list(tokens), self.block_size, cache_salt=salt)
        if answer.served:
            self._last_stored = tuple(hashes)
            await self._seen_stored(hashes[: spec.footprint_blocks])
        async with self._lock:
            self.mirror.absorb(answer)
            return self.mirror.decide(spec, answer, hashes)

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        return self.mirror.view(self.mirror.owned(claim_id, owner_scope))

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        await self.start()
        claim = self.mirror.owned(claim_id, owner_scope)
        ttl = renewal.ttl_s if renewal.ttl_s is not None else claim.spec.ttl_s
        if renewal.duration_steps is not None:
            raise UsageError(
                "duration_steps", "vLLM claims count seconds (ttl_s), not engine steps"
            )
        if not claim.state.live:
            raise UsageError("claim_id", f"claim {claim_id!r} has ended ({claim.state.value})")
        if not claim.held:
            # live, and nothing held on vLLM (observational, or shed to ``demoted``): there is
            # no hold to extend, and such a claim ends only by release
            return self.mirror.view(claim)
        answer = await self.riding.send_now([Renew(claim_id, ttl, owner_scope)])
        async with self._lock:
            self.mirror.absorb(answer)
        result = next(
            (r for r in answer.results if r.get("op") == "renew" and r.get("claim_id") == claim_id),
            None,
        )
        if result is None or not result.get("ok"):
            reason = "no answer" if result is None else result.get("reason")
            raise UsageError("claim_id", f"claim {claim_id!r} cannot be renewed: {reason}")
        return self.mirror.view(claim)

    async def release_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        if self.liveness.dead is None:  # else its claims have all ended: nothing to hand back
            await self.start()
        claim = self.mirror.owned(claim_id, owner_scope)
        if claim.held:  # the hand-back rides on the next request to vLLM (``RidingOps``)
            self.riding.queue(Release(claim_id, owner_scope))
        if claim.state in (ClaimState.MATERIALIZED, ClaimState.ACCEPTED, ClaimState.DEMOTED):
            self.mirror.end(claim)  # its resident_claim_expired follows from the connector
        return self.mirror.view(claim)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        if self.liveness.dead is None:  # a dead engine's events stay readable: they say so
            await self.start()
            await self.riding.settle()
        if self.mirror.judging:
            await asyncio.gather(*list(self.mirror.judging), return_exceptions=True)
        async with self._lock:
            return self.mirror.events.page(since, limit=limit, id_prefix=id_prefix)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        """Leading blocks known resident: those vLLM's events show cached (with the observer),
        and those of held claims (unknown is 0: fail closed)."""
        out = dict.fromkeys(prefix_ids, 0)
        if self.liveness.dead is not None:
            return out  # its cache went with it
        await self.riding.settle()
        if self.observer is not None:
            await self._settle()
            for pid in out:
                known = self.prompts.get(pid)
                if known is not None:
                    tokens, salt = known
                    hashes = hash_token_blocks(list(tokens), self.block_size, cache_salt=salt)
                    out[pid] = self.observer.leading_run(hashes)
        for claim in self.mirror.claims.values():
            pid = PrefixId(claim.spec.object_id)
            if pid in out and claim.state is ClaimState.MATERIALIZED:
                out[pid] = max(out[pid], claim.held_blocks)
        return out

    def metrics(self) -> dict[str, Any]:
        """What the gateway's ``/v1/stats`` and ``/metrics`` add for this KV side: the engine
        requests it made, the agents' completions and its own claim operations (``/metrics``:
        ``agentclaims_engine_requests_total{kind}``), and their ratio."""
        operations = self._connector.requests
        riding = self.riding
        return {
            "engine_requests": {"completion": self.completions, "operation": operations},
            "engine_requests_per_completion": round(
                (self.completions + operations) / self.completions, 4
            )
            if self.completions
            else None,
            "claim_operations": {
                "rode": riding.rode,
                "standalone": riding.standalone,
                "channel": self._connector.channel_ops,
            },
            **riding.metrics(),
        }

    async def descriptor(self) -> dict[str, Any]:
        await self.start()
        await self.model()
        return {
            "kv_side": self.name,
            "upstream": self.upstream,
            "cache_identity": self.identity().to_dict(),
            "block_size": self.block_size,
            "lowering": "agentclaims connector (integrations/vllm)"
            if self.connector
            else "none: stock vLLM (no agentclaims connector answers)",
            "connector": self.connector,
            # the connector holds claimed blocks and sheds soft holds farthest predicted next
            # use first, each a demotion; vLLM's own free queue ranks nothing (LRU)
            SHEDS_BY_HINTS: self.connector,
            "special_object_ids": [PROMPT_OBJECT, SEQUENCE_OBJECT],
            CLAIMS_RIDE_ON_REQUESTS: self.connector,
            "connector_channel": self._connector.channel is not None,
            "usable_blocks": self.usable_blocks,
            "max_model_len": await self._max_model_len(),
            **{f"hold_{k}": v for k, v in self.mirror.limits.items()},
            "kv_events": None if self.observer is None else self.observer.stats(),
            "fault": self.mirror.fault,
            "limits": [
                "running requests can be preempted (their blocks recomputed)",
                "the partial last block is never held",
                "one engine core's pool: data-parallel ranks each have their own",
                "claims are lost on a vLLM restart, sleep or prefix-cache reset",
            ],
        }

    async def serve(self, request: ActiveRequest) -> ServeResult:
        if request.block_hashes is not None:
            raise OperationNotExposed(
                self.name, "serve by block hashes (vLLM hashes its own tokens)"
            )
        tokens = [t for seg in request.segments for t in seg]
        body = {
            "prompt": tokens,
            "max_tokens": max(1, len(request.reply_tokens)),
            "temperature": 0,
            "ignore_eos": True,
        }
        written = await self.write(
            CompletionCall(
                "completion",
                body,
                request.claims,
                request.owner_scope,
                request.cache_salt,
                request.request_id,
            )
        )
        return written.result

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """Whether each block (the gateway's hash) is in vLLM's prefix cache, from its events."""
        if self.observer is None:
            raise OperationNotExposed(
                self.name, "block_residency (start the gateway with --kv-events ENDPOINT)"
            )
        await self.start()
        await self._settle()
        return self.observer.resident(block_hashes)

    async def _settle(self) -> None:
        """Let vLLM's events catch up with its answers: the last served prompt's blocks seen
        stored (what came before them is then in too: one ordered stream), and a quiet moment."""
        assert self.observer is not None
        await self.observer.wait_resident(self._last_stored, 0.5)
        await self.observer.quiet()
        if self.mirror.judging:
            await asyncio.gather(*list(self.mirror.judging), return_exceptions=True)

    # ------------------------------------------------------------------ InstanceControl
    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        """vLLM's pool made empty: every hold revoked (each with its event), the prefix cache
        reset (``/reset_prefix_cache``: vLLM started with ``agentclaims vllm serve
        --dev-mode``), and the gateway's claims and event log begun again (the sequence goes
        on). The pool's size is vLLM's own: ``usable_blocks`` must be it (the descriptor's
        ``usable_blocks``). Refused while another owner holds a live claim."""
        await self.start()
        if isinstance(usable_blocks, bool) or usable_blocks != self.usable_blocks:
            raise UsageError(
                "usable_blocks",
                f"vLLM's pool is fixed at start: {self.usable_blocks} usable blocks, "
                f"got {usable_blocks!r}",
            )
        others = sorted(
            {c.spec.owner_scope for c in self.mirror.claims.values() if c.held} - {owner_scope}
        )
        if others:
            raise ContractViolation(f"a fresh instance would drop live claims of {others}")
        client = await self._connector_ready()
        held = await self.riding.send_now([])  # pending releases go first: what is left is held
        async with self._lock:
            self.mirror.absorb(held)
            ours = sum(c.held_blocks for c in self.mirror.claims.values() if c.held)
        if held.held_blocks > ours:  # another gateway on this vLLM holds claims too
            raise ContractViolation(
                f"a fresh instance would drop live claims: the connector holds "
                f"{held.held_blocks} blocks, this gateway's claims {ours}"
            )
        self.riding.clear()  # the revocation below ends every hold they would release
        answer = await client.operate([RevokeAll("fresh_instance")])
        async with self._lock:
            self.mirror.absorb(answer)
        clears = 0 if self.observer is None else self.observer.clears
        status, data = await self._http.post("/reset_prefix_cache", {})
        if status == 404:
            raise OperationNotExposed(
                self.name,
                "fresh_instance (vLLM's /reset_prefix_cache: start it with "
                "`agentclaims vllm serve --dev-mode`)",
            )
        if status != 200:
            raise BackendError(f"vLLM could not reset its prefix cache: HTTP {status}: {data}")
        if self.observer is not None:  # vLLM publishes the clear with its next step's events
            await client.operate([])
            await self.observer.cleared(clears, timeout_s=2.0)
        async with self._lock:
            self.mirror.restart()
            self._last_stored = ()
        return self.identity()

    async def step(self, n: int = 1) -> None:
        raise OperationNotExposed(self.name, "step (vLLM claims count seconds: ttl_s)")

    async def aclose(self) -> None:
        await self.riding.aclose()
        await self._connector.aclose()
        if self.observer is not None:
            await self.observer.aclose()
        await self._http.aclose()
