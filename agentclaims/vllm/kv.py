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
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentclaims_vllm.ops import Op, Release, RevokeAll

from agentclaims.contract import (
    BACKEND_RESTART,
    BlockHash,
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    OwnerScope,
    PrefixId,
)
from agentclaims.errors import (
    BackendError,
    BackendUnavailable,
    OperationNotExposed,
    UsageError,
)
from agentclaims.kernel import counts_by_mode_and_state
from agentclaims.lowering.served import CONNECTOR_DESCRIPTOR
from agentclaims.protocol import (
    CLAIMS_RIDE_ON_REQUESTS,
    PROMPT_OBJECT,
    RENEW_AS_IS,
    SEQUENCE_OBJECT,
    SHEDS_BY_HINTS,
    ActiveRequest,
    ClaimDecision,
    ClaimView,
    CompletionCall,
    EventPage,
    Renewal,
    ServeResult,
    Written,
)
from agentclaims.vllm.claims_api import ClaimsApi
from agentclaims.vllm.client import ConnectorAnswer, ConnectorClient
from agentclaims.vllm.engine_queue import EngineQueue
from agentclaims.vllm.forwarding import CompletionForwarder
from agentclaims.vllm.instance import InstanceReset
from agentclaims.vllm.liveness import EngineLiveness
from agentclaims.vllm.mirror import ClaimMirror
from agentclaims.vllm.observer import KVEventsObserver
from agentclaims.vllm.prompts import MAX_TOKENS, PromptBook
from agentclaims.vllm.riding import RidingOps
from agentclaims.vllm.sight import CacheSight
from agentclaims.vllm.streamed import UpstreamStream
from agentclaims.vllm.upstream import Upstream

__all__ = ["VllmKV"]

log = logging.getLogger("agentclaims.vllm")

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


async def pool_blocks(http: Upstream) -> int:
    """vLLM's KV blocks less its null block, from its ``/metrics`` (``cache_config_info``)."""
    _, text = await http.get_text("/metrics", timeout_s=10.0)
    found = re.search(r'num_gpu_blocks="(\d+)"', text)
    return max(0, int(found.group(1)) - 1) if found else 0


async def max_model_len(http: Upstream) -> int | None:
    """vLLM's longest request, as its ``/v1/models`` says (``None``: it does not)."""
    status, data = await http.get("/v1/models")
    models = (data.get("data") if status == 200 and isinstance(data, dict) else None) or [{}]
    value = models[0].get("max_model_len")
    return int(value) if isinstance(value, int) else None


async def tokenize(http: Upstream, model: str, kind: str, body: Mapping[str, Any]) -> list[int]:
    """The prompt's token ids as vLLM (serving ``model``) will see them: its ``/tokenize``
    with the chat template and tools of a chat, or a completion's prompt (token ids as they
    are); ``UsageError`` naming the field vLLM cannot tokenize."""
    request: dict[str, Any] = {"model": model}
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
    status, data = await http.post("/tokenize", request)
    if status != 200 or not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        message = (data.get("error") or {}).get("message") if isinstance(data, dict) else data
        raise UsageError(
            "messages" if kind == "chat" else "prompt", f"vLLM cannot tokenize it: {message}"
        )
    return [int(t) for t in data["tokens"]]


def _prefix_tokens(value: object) -> int:
    """The most tokens the prompt book keeps (``max_prefix_tokens``): a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError("max_prefix_tokens", f"must be a positive integer, got {value!r}")
    return value


def _ride_bound(value: object) -> float:
    """How long a claim operation waits for a request to ride on (``ride_bound_s``)."""
    if isinstance(value, bool) or not (isinstance(value, int | float) and 0 <= value <= 10):
        raise UsageError("ride_bound_s", f"must be within [0, 10] seconds, got {value!r}")
    return float(value)


class VllmKV:
    """The claims protocol (and serving) on vLLM + the agentclaims connector: its start, the
    engine's life, the upstream plumbing; completions, the claims API and a fresh instance
    are ``CompletionForwarder``'s, ``ClaimsApi``'s and ``InstanceReset``'s."""

    name = "vllm"
    orders_by_priority = False  # vLLM's queue by priority? as its connector says at the start

    def __init__(
        self,
        upstream: str,
        claims_key: str,
        *,
        model: str | None = None,
        block_size: int = 32,
        timeout_s: float = 120.0,
        max_prefixes: int = 100_000,
        max_prefix_tokens: int = MAX_TOKENS,
        kv_events: str | None = None,
        kv_events_replay: str | None = None,
        events_python: str | None = None,
        ride_bound_s: float = 0.05,
    ) -> None:
        ride_bound_s = _ride_bound(ride_bound_s)
        self._http = Upstream(upstream, timeout_s=timeout_s)  # checks the URL
        self.upstream = self._http.base_url
        self.block_size, self._model = block_size, model
        self.engine_queue = EngineQueue(self._http.get_text)  # vLLM's queue and prefill times
        self._key = claims_key
        self._connector = ConnectorClient(self.upstream, claims_key, model="", client=self._http)
        """One client, one cursor on the connector's event stream, whatever the tenant."""
        self.prompts = PromptBook(block_size, max_prefixes, _prefix_tokens(max_prefix_tokens))
        """The prompts served here by prefix id (tokens, cache salt): at most ``max_prefixes``
        and ``max_prefix_tokens`` tokens in all, the least recently served forgotten first."""
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
                python=vllm_python(events_python, flag="--vllm-python"),
                block_size=block_size,
                replay=kv_events_replay,
            )
        self.mirror = ClaimMirror(
            _Stamp(self),
            self._lock,
            ask=lambda: self.riding.send_now([]),
            release=lambda claim_id, tenant: self._connector.operate([Release(claim_id)], tenant),
            observer=self.observer,
            max_requests=max_prefixes,
        )
        """What this gateway knows of its claims on vLLM, and their events."""
        self.connector = True
        """Whether the agentclaims connector answers in this vLLM (stock vLLM: no claim held)."""
        self.usable_blocks = 0
        """vLLM's pool, in blocks (its null block excluded), known once started."""
        self.liveness = EngineLiveness(self._http, kv_events)
        """Whether vLLM's engine is known dead (its 500, a refused connection, ``/health``
        503): every request answers 503 with why until a vLLM answers ``/health`` again."""
        self._http.on_engine_dead = self._engine_died
        self.riding = RidingOps(ride_bound_s, self._send, self._absorb_locked, self._alive)
        """Claim operations waiting to ride on the next request to vLLM."""
        self.sight = CacheSight(self.observer, self.mirror)
        """What vLLM's KV events showed of its cache (the last prompt stored), and waits on them."""
        self.forwarder = CompletionForwarder(self, self._http, self._lock, self._gated)
        """How a completion goes to vLLM and its answer comes back (``ReplyWriter``)."""
        self.plain = self.forwarder.plain
        """A plain call written with the least work (the completion pipeline's lean way)."""
        self.claims_api = ClaimsApi(self, self._lock, self._gated)
        """Claims on served prefixes, renewals, releases, events and residency."""
        self.instance_reset = InstanceReset(self, self._http, self._lock)
        """A fresh instance (``InstanceControl``)."""

    async def start(self) -> None:
        """Once, before anything else: end every hold the connector still has from an earlier
        gateway (a restart, a crash), each with its ``resident_claim_expired`` (reason
        ``revoked: gateway_restart``) in this gateway's stream: none disappears silently. While
        vLLM's engine is dead: a ``BackendUnavailable`` naming why, until vLLM answers again."""
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
        self.usable_blocks = await pool_blocks(self._http)
        if self.observer is not None:
            self.observer.on_stored = self.mirror.blocks_stored
            await self.observer.start()
        client = await self.connector_ready()
        client.skip_events((await client.complete([1], max_tokens=1)).last_seq)  # history before
        answer = await client.operate([RevokeAll("gateway_restart")])
        self.connector = bool(answer.results)  # stock vLLM ignores the operations
        self.orders_by_priority = bool(answer.reply and answer.reply.scheduling == "priority")
        if not self.connector:
            self.lowering = _STOCK_DESCRIPTOR if _STOCK_DESCRIPTOR.is_file() else None
        async with self._lock:
            self.mirror.absorb(answer)
            self.mirror.check_key(answer)  # a refused envelope: not the connector's key

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

    async def connector_ready(self) -> ConnectorClient:
        """The connector's client, its model named (vLLM's served model, asked once)."""
        self._connector.model = await self.model()
        return self._connector

    async def tokenize(self, kind: str, body: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids as vLLM will see them."""
        return await tokenize(self._http, await self.model(), kind, body)

    # ------------------------------------------------------------------ ReplyWriter
    streams = True
    """vLLM's tokens pass through the gateway as it produces them."""

    @property
    def model_name(self) -> str:
        return self._model or "vllm"

    def prepare(self, call: CompletionCall) -> CompletionCall:
        """The body's shape checked before anything changes (vLLM checks the rest)."""
        return self.forwarder.prepare(call)

    async def write(self, call: CompletionCall) -> Written:
        """Forward one completion with its claims (``CompletionForwarder``)."""
        return await self.forwarder.write(call)

    async def stream(self, call: CompletionCall) -> UpstreamStream:
        """Forward one streamed completion (``CompletionForwarder``)."""
        return await self.forwarder.stream(call)

    @property
    def streams_claims(self) -> bool:
        """Whether a streamed request may carry claims: the connector's answer, which vLLM
        sends in no stream, is read over its channel."""
        return self._connector.channel is not None

    @property
    def completions(self) -> int:
        """Completions forwarded to vLLM for clients (streamed or not): the agents' calls."""
        return self.forwarder.completions

    # ------------------------------------------------------------------ riding operations
    async def _send(self, ops: Sequence[Op]) -> ConnectorAnswer:
        """``ops`` (each naming its tenant) to the connector now (its channel where it has one)."""
        return await (await self.connector_ready()).operate(ops)

    async def _absorb_locked(self, answer: ConnectorAnswer) -> None:
        async with self._lock:
            self.mirror.absorb(answer)

    def _alive(self) -> bool:
        return self.liveness.dead is None

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
        return await self.claims_api.submit_claim(spec, block_hashes)

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        return await self.claims_api.get_claim(claim_id, owner_scope)

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        return await self.claims_api.renew_claim(claim_id, owner_scope, renewal)

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        return await self.claims_api.release_claim(claim_id, owner_scope, done=done)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        return await self.claims_api.events(since, id_prefix=id_prefix, limit=limit)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        """Leading blocks known resident (``ClaimsApi.residency``; unknown is 0)."""
        return await self.claims_api.residency(prefix_ids)

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """Whether each block (the gateway's hash) is in vLLM's prefix cache, from its events."""
        return await self.claims_api.block_residency(block_hashes)

    def _pool_figures(self) -> dict[str, int]:
        """vLLM's pool as the connector's answers describe it: usable blocks, the caps on what
        holds may take, and the blocks the gateway's live claims hold there."""
        out: dict[str, int] = {}
        if self.usable_blocks:
            out["usable_blocks"] = int(self.usable_blocks)
        cap = self.mirror.limits.get("cap_blocks")
        if isinstance(cap, int):
            out["hard_cap_blocks"] = cap
        out["claimed_blocks"] = sum(c.held_blocks for c in self.mirror.claims.values() if c.held)
        return out

    async def max_claim_ttl(self) -> float | None:
        """The longest TTL the connector gives a hold, as it last answered (the side started
        first: its start asks the connector once)."""
        await self.start()
        value = self.mirror.limits.get("max_ttl_s")
        return float(value) if isinstance(value, int | float) else None

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
            **self.forwarder.figures(),  # bare completions, streamed chunks
            "claim_operations": {
                "rode": riding.rode,
                "standalone": riding.standalone,
                "channel": self._connector.channel_ops,
            },
            **riding.metrics(),
            # every request the connector held back or refused for claims' blocks, whoever's
            "request_verdicts": dict(self.mirror.verdicts),
            # what the connector's answers said: its pool's limits and what claims hold in it
            "pool": self._pool_figures(),
            "claims": counts_by_mode_and_state(self.mirror.claims.values()),
            # what vLLM's answers said of its prefix cache: the gateway's hit ratio
            "requests": {
                "prompt_tokens": self.forwarder.prompt_tokens,
                "cached_tokens": self.forwarder.cached_tokens,
            },
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
            # the connector holds claimed blocks and sheds soft holds farthest expected next
            # use first, each a demotion; vLLM's own free queue ranks nothing (LRU)
            SHEDS_BY_HINTS: self.connector,
            "special_object_ids": [PROMPT_OBJECT, SEQUENCE_OBJECT],
            CLAIMS_RIDE_ON_REQUESTS: self.connector,
            "connector_channel": self._connector.channel is not None,
            "usable_blocks": self.usable_blocks,
            "max_model_len": await max_model_len(self._http),
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

    # ------------------------------------------------------------------ InstanceControl
    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        """vLLM's pool made empty, every hold revoked and the prefix cache reset
        (``InstanceReset``). Refused while another owner holds a live claim."""
        return await self.instance_reset.fresh_instance(usable_blocks, owner_scope)

    async def step(self, n: int = 1) -> None:
        raise OperationNotExposed(self.name, "step (vLLM claims count seconds: ttl_s)")

    async def aclose(self) -> None:
        await self.riding.aclose()
        await self._connector.aclose()
        if self.observer is not None:
            await self.observer.aclose()
        await self._http.aclose()
