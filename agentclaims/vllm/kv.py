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
import contextlib
import dataclasses
import itertools
import logging
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentclaims_vllm.ops import Hold, Op, Release, Renew, RevokeAll

from agentclaims.contract import (
    BACKEND_RESTART,
    ArbiterAction,
    BlockHash,
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    ClaimState,
    Decision,
    EventName,
    Feasibility,
    OwnerScope,
    PrefixId,
    RequestId,
    backend_restart_end,
    owned_claim,
    prefix_id_of,
)
from agentclaims.engine.blocks import hash_token_blocks
from agentclaims.errors import (
    BackendError,
    BackendUnavailable,
    ContractViolation,
    OperationNotExposed,
    ServiceUnavailable,
    UsageError,
)
from agentclaims.kernel import (
    EVENTS_KEPT,
    Claim,
    EventLog,
    harm,
    identity_problem,
    refuse,
    resolve_request_claims,
    submitted,
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
from agentclaims.vllm.client import ConnectorAnswer, ConnectorClient
from agentclaims.vllm.observer import KVEventsObserver
from agentclaims.vllm.streamed import UpstreamStream
from agentclaims.vllm.upstream import Upstream

__all__ = ["VllmKV"]

log = logging.getLogger("agentclaims.vllm")

_CONTRACT_EVENTS = {e.value for e in EventName}
_STOCK_DESCRIPTOR = Path(__file__).parents[2] / "integrations" / "descriptors" / "vllm-stock.yaml"
"""Stock vLLM's descriptor (every held mode rejected), where the repository is at hand; else
the vLLM KV side without a connector serves none (every mode unknown: fail closed)."""
_KINDS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


_NEVER_S = 1e9
"""``next_use_s`` of a closed agent's hold (finite: the op travels as JSON)."""


class _Claim(Claim):
    """A claim as the gateway mirrors it from the connector's answers and events."""

    __slots__ = ("expires_at_ns", "hashes", "held_blocks", "lost")

    def __init__(
        self,
        spec: ClaimSpec,
        state: ClaimState,
        held_blocks: int,
        *,
        hashes: tuple[BlockHash, ...] = (),
        end_reason: str | None = None,
    ) -> None:
        super().__init__(spec, state)
        self.held_blocks = held_blocks
        self.end_reason = end_reason
        self.expires_at_ns: int | None = None
        self.hashes = hashes
        """The claimed blocks' hashes (the gateway's), head first: what the observer joins."""
        self.lost: set[BlockHash] = set()
        """Claimed blocks seen leaving vLLM's cache after the claim ended (each counted once)."""

    @property
    def held(self) -> bool:
        """The connector holds its blocks (as far as the gateway has heard)."""
        live = self.state in (ClaimState.ACCEPTED, ClaimState.MATERIALIZED)
        return live and self.held_blocks > 0


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


def _prompt_ids(data: Mapping[str, Any]) -> list[int] | None:
    """The prompt's token ids in a vLLM answer asked for them (``return_token_ids``)."""
    ids = data.get("prompt_token_ids")
    if ids is None:
        ids = (data.get("choices") or [{}])[0].get("prompt_token_ids")
    if isinstance(ids, list) and set(map(type, ids)) <= {int}:  # one pass, in C
        return ids
    return None


def _sequence_ids(
    data: Mapping[str, Any], prompt: Sequence[int] | None, block_size: int
) -> list[int] | None:
    """The full blocks of prompt + reply that vLLM computed (so cached): the reply's last
    token never had its KV computed, so it ends no block. ``None`` without the reply's ids."""
    reply = (data.get("choices") or [{}])[0].get("token_ids")
    if prompt is None or not isinstance(reply, list):
        return None
    tokens = [*prompt, *(int(t) for t in reply)]
    full = (len(tokens) - 1) // block_size * block_size
    return tokens[:full] if full else None


def _forwarded(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The client's body as it goes to vLLM: never a client's ``kv_transfer_params`` (the
    gateway signs its own), the ``agentclaims`` object or its ``cache_salt`` (the tenant's is
    set instead); the model is vLLM's own."""
    out = {
        k: v
        for k, v in body.items()
        if k not in ("kv_transfer_params", "agentclaims", "cache_salt")
    }
    out["model"] = model
    return out


def _client_payload(data: Mapping[str, Any], *, keep_token_ids: bool) -> dict[str, Any]:
    """The answer as the client sees it: never the connector's receipt; token ids only when
    the client asked for them."""
    out = {k: v for k, v in data.items() if k != "kv_transfer_params"}
    if not keep_token_ids:
        out.pop("prompt_token_ids", None)
        out["choices"] = [
            {k: v for k, v in c.items() if k not in ("token_ids", "prompt_token_ids")}
            for c in out.get("choices") or []
        ]
    return out


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
        self._prefixes: OrderedDict[str, tuple[tuple[int, ...], str | None]] = OrderedDict()
        """prefix id -> its tokens and the cache salt they were served under."""
        self._max_prefixes = max_prefixes
        self._claims: dict[str, _Claim] = {}
        self.run_id = uuid.uuid4().hex[:12]
        self._events = EventLog(_Stamp(self), EVENTS_KEPT)
        """The last ``EVENTS_KEPT`` events for readers (one further back reads as a gap)."""
        self._lock = asyncio.Lock()
        self._requests = itertools.count(1)
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
            self.observer.on_removed = self._blocks_lost
        self.connector = True
        """Whether the agentclaims connector answers in this vLLM (stock vLLM: no claim held)."""
        self.usable_blocks = 0
        """vLLM's pool, in blocks (its null block excluded), known once started."""
        self.fault: str | None = None
        """Set when a held claim was harmed (a connector bug): no claim is accepted after it."""
        self._last_stored: tuple[BlockHash, ...] = ()
        self._request_ids: OrderedDict[str, str] = OrderedDict()
        """vLLM's request id (``cmpl-<ours>``) -> the gateway's, for the connector's events."""
        self.limits: dict[str, Any] = {}
        """The connector's limits as it last answered: ``cap_blocks``, ``max_ttl_s``,
        ``max_defer_s`` (what a hold may take, how long a request may be deferred)."""
        self._judging: set[asyncio.Task[None]] = set()
        self.completions = 0
        """Completions forwarded to vLLM for clients (streamed or not): the agents' calls."""
        self.engine_dead: str | None = None
        """Why vLLM's engine is known dead (its 500, a refused connection, ``/health`` 503):
        every request answers 503 with it until a vLLM answers ``/health`` again."""
        self._kv_events = kv_events
        self._probed_at = 0.0
        self._http.on_engine_dead = self._engine_died
        self.ride_bound_s = float(ride_bound_s)
        """How long a pending operation (a release) waits for a request to ride on."""
        self._riding: list[tuple[Op, float]] = []
        """Pending operations (each naming its tenant) and when each was queued."""
        self._flush: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self.ops_rode = 0
        """Operations that rode on a request going to vLLM anyway."""
        self.ops_standalone = 0
        """Operations sent on their own (the channel, or a one-token request)."""
        self.ride_waits: deque[float] = deque(maxlen=4096)
        """How long recent pending operations waited before they went (either way)."""
        self.ride_wait_sum = 0.0
        self.ride_wait_count = 0

    async def start(self) -> None:
        """Once, before anything else: end every hold the connector still has from an earlier
        gateway (this one has no record of them: a restart, a crash). Each ends with its
        ``resident_claim_expired`` (reason ``revoked: gateway_restart``), read into this
        gateway's stream: no claim disappears silently. While vLLM's engine is dead: a
        ``BackendUnavailable`` naming why, until a vLLM answers again (then once more)."""
        started = self._started
        if started is not None and started.done() and self.engine_dead is None:
            started.result()  # every request asks: the started one returns at once
            return
        if self.engine_dead is not None:
            await self._revive()
        if self._started is None:
            self._started = asyncio.ensure_future(self._revoke_orphans())
        await asyncio.shield(self._started)

    async def _revoke_orphans(self) -> None:
        version = (await self._get("/version")).get("version")
        self.runtime_version = str(version) if version else None
        self.usable_blocks = await self._pool_blocks()
        if self.observer is not None:
            self.observer.on_stored = self._blocks_stored
            await self.observer.start()
        client = await self._connector_ready()
        client.skip_events((await client.complete([1], max_tokens=1)).last_seq)  # history before
        answer = await client.operate([RevokeAll("gateway_restart")])
        self.connector = bool(answer.results)  # stock vLLM ignores the operations
        if not self.connector:
            self.lowering = _STOCK_DESCRIPTOR if _STOCK_DESCRIPTOR.is_file() else None
        async with self._lock:
            self._absorb(answer)

    # ------------------------------------------------------------------ a dead engine
    def _engine_died(self, seen: str, refused: bool = False) -> None:
        """vLLM's engine is gone (``seen``: how the gateway knows; ``refused``: a refused
        connection, which says so only of a vLLM this side had started on). Fail closed, once: every
        live claim ends with its event (a materialized one ``resident_claim_harmed``, cause
        ``backend_restart``: its blocks went with the engine; one not yet seen resident
        ``resident_claim_expired``, reason ``backend_restart``), and every request answers
        503 until a vLLM answers ``/health`` again."""
        if self.engine_dead is not None:
            return
        if refused and not (
            self._started and self._started.done() and not self._started.exception()
        ):
            return  # never served here: nothing of it was known, nothing is lost
        self.engine_dead = seen
        self._riding.clear()  # its holds went with it
        self._started = None  # a vLLM that comes back is started afresh (orphans, pool, version)
        self._probed_at = time.monotonic()
        detail = self._dead_reason()
        log.error("agentclaims: %s; every claim on it ends (%s)", detail, BACKEND_RESTART)
        for claim in self._claims.values():
            if not claim.state.live:
                continue
            name, claim.state, data = backend_restart_end(claim.state is ClaimState.MATERIALIZED)
            claim.end_reason = "harmed" if claim.state is ClaimState.HARMED else BACKEND_RESTART
            claim.held_blocks = 0
            if claim.state is ClaimState.HARMED:  # its predicate held, and went with the engine
                data |= {
                    "predicate": "leading_prefix_at_least",
                    "predicate_before": True,
                    "predicate_after": False,
                }
            self._emit(name, claim.spec.claim_id, None, **data, detail=detail)

    def _dead_reason(self) -> str:
        """Why the engine is dead, with the signal where ``agentclaims vllm serve`` (its state
        file beside the KV events endpoint) has named it."""
        reason = f"vLLM's engine is dead ({self.engine_dead})"
        if self._kv_events is not None:
            from agentclaims.vllm.supervise import read_state

            state = read_state(self._kv_events) or {}
            if state.get("state") == "dead" and state.get("reason"):
                reason += f": {state['reason']}"
        return reason

    async def _revive(self) -> None:
        """While dead: ask vLLM's ``/health`` (at most once a second); a 200 means a vLLM is
        back (a restart: nothing of the old one's claims survives), else 503 as before."""
        now = time.monotonic()
        if now - self._probed_at >= 1.0:
            self._probed_at = now
            with contextlib.suppress(BackendUnavailable):
                status, _ = await self._http.request("GET", "/health", timeout_s=5.0)
                if status == 200 and self.engine_dead is not None:
                    log.warning("agentclaims: vLLM at %s answers again", self.upstream)
                    self.engine_dead = None
                    return
        raise self._dead_error()

    def _dead_error(self) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"{self._dead_reason()}; every claim held there has ended ({BACKEND_RESTART})"
        )

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
                "detail": self._dead_reason() if self.engine_dead else str(exc),
            }
        if status == 503:  # vLLM's answer for a dead engine (EngineDeadError)
            self._engine_died(f"vLLM at {self.upstream} /health: HTTP 503")
        if self.engine_dead is not None:
            again = "; vLLM answers again" if status == 200 else ""
            return {"usable": False, "detail": self._dead_reason() + again}
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
    def _register(
        self, tokens: Sequence[int], salt: str | None, hashes: list[BlockHash] | None = None
    ) -> tuple[list[BlockHash], str | None]:
        """Remember ``tokens`` under their prefix id (``hashes``: their block hashes, when
        already known): the hashes and the id (``None`` without a full block)."""
        if hashes is None:
            hashes = hash_token_blocks(tokens, self.block_size, cache_salt=salt)
        if not hashes:
            return hashes, None
        pid = prefix_id_of(hashes)
        self._prefixes[pid] = (tuple(tokens[: len(hashes) * self.block_size]), salt)
        self._prefixes.move_to_end(pid)
        while len(self._prefixes) > self._max_prefixes:
            self._prefixes.popitem(last=False)
        return hashes, pid

    def _emit(
        self, name: EventName, claim_id: str | None, request_id: str | None, **data: Any
    ) -> None:
        claim = self._claims.get(claim_id) if claim_id else None
        self._events.emit(
            name,
            claim=claim,
            claim_id=claim_id if claim is None else None,
            request_id=request_id,
            **data,
        )

    def _our_request(self, vllm_id: Any) -> str | None:
        """The gateway's request id for vLLM's (which adds ``cmpl-`` and ``-<n>`` suffixes)."""
        if not isinstance(vllm_id, str):
            return None
        candidate = vllm_id
        while candidate:
            if candidate in self._request_ids:
                return self._request_ids[candidate]
            head, sep, _ = candidate.rpartition("-")
            if not sep:
                break
            candidate = head
        return vllm_id

    def _absorb(self, answer: ConnectorAnswer) -> None:
        """The connector's new events, in the gateway's stream; claim states follow them."""
        receipt = (answer.raw.get("kv_transfer_params") or {}).get("agentclaims") or {}
        for key in ("cap_blocks", "max_ttl_s", "max_defer_s"):
            if key in receipt:
                self.limits[key] = receipt[key]
        for raw in answer.events:
            name = raw.get("event")
            if name not in _CONTRACT_EVENTS:
                continue
            cid = raw.get("claim_id")
            data = {
                k: v
                for k, v in raw.items()
                if k not in ("seq", "event", "claim_id", "timestamp_ns", "request_id")
            }
            if name == EventName.RESIDENT_CLAIM_MATERIALIZED.value and self.observer is not None:
                continue  # seen in vLLM's own cache instead (_confirm)
            claim = self._claims.get(cid) if cid else None
            if claim is not None:
                if name == EventName.RESIDENT_CLAIM_EXPIRED.value:
                    claim.state, claim.end_reason = ClaimState.EXPIRED, str(raw.get("reason"))
                    claim.held_blocks = 0
                elif name == EventName.RESIDENT_CLAIM_DEMOTED.value:
                    claim.state, claim.held_blocks = ClaimState.DEMOTED, 0
            self._emit(EventName(name), cid, self._our_request(raw.get("request_id")), **data)

    # ------------------------------------------------------------------ completions
    # ------------------------------------------------------------------ ReplyWriter
    streams = True
    """vLLM's tokens pass through the gateway as it produces them."""

    @property
    def model_name(self) -> str:
        return self._model or "vllm"

    def prepare(self, call: CompletionCall) -> CompletionCall:
        """vLLM checks the body itself (its 400 is the client's); the kind is checked here."""
        if call.kind not in _KINDS:
            raise UsageError("kind", f"unknown completion kind {call.kind!r}")
        return call

    async def write(self, call: CompletionCall) -> Written:
        """Forward one completion with its claims; the upstream payload and the KV life
        (``request_id``: the gateway's name for it, in its outcome and events)."""
        self.prepare(call)
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
        forwarded = _forwarded(body, client.model)
        if request_id is not None:
            forwarded["request_id"] = request_id
            self._request_ids[f"cmpl-{request_id}"] = request_id
            while len(self._request_ids) > self._max_prefixes:
                self._request_ids.popitem(last=False)
        if cache_salt:  # vLLM's own per-request salt: a tenant's blocks are its own
            forwarded["cache_salt"] = cache_salt
        wants_ids = bool(body.get("return_token_ids"))
        on_reply, gated, riding, envelope = self._envelope(client, specs, tenant)
        if tokens is None or on_reply:
            forwarded["return_token_ids"] = True  # the prompt's and the reply's token ids
        forwarded["kv_transfer_params"] = {"agentclaims": envelope}
        self.completions += 1
        try:
            status, data = await self._http.post(_KINDS[kind], forwarded)
        except BackendUnavailable:
            self._requeue(riding)
            # vLLM closed the connection under the request (a dying API server does): ask its
            # /health, which says whether the engine is dead (503, or no vLLM listening)
            await self.health()
            if self.engine_dead is not None:
                raise self._dead_error() from None
            raise
        if status != 200 or not isinstance(data, dict):
            self._requeue(riding)  # it may not have reached the connector: again, harmlessly
            raise self._refused(status, data)
        payload = _client_payload(data, keep_token_ids=wants_ids)
        result = await self._answered(
            client, data, tokens, hashes, prompt_pid, specs, gated, on_reply, cache_salt
        )
        return Written(payload, result)

    def _refused(self, status: int, data: Any) -> Exception:
        """The error vLLM's answer other than 200 is: the dead engine's, a 5xx, or vLLM
        refusing the request (a 400 the client can act on)."""
        message = (data.get("error") or {}).get("message") if isinstance(data, dict) else data
        if self.engine_dead is not None:
            return self._dead_error()
        if status >= 500:
            return BackendUnavailable(f"vLLM answered HTTP {status}: {message}")
        return UsageError("body", f"vLLM refused the request: {message}")

    async def stream(self, call: CompletionCall) -> UpstreamStream:
        """Forward one streamed completion: its chunks pass on as vLLM produces them
        (``agentclaims.vllm.streamed``), its KV life (prompt and sequence named, cached
        tokens, its claims' decisions) once it ends. vLLM sends no connector answer in a
        stream: the gateway reads it over the connector's channel (``streams_claims``); a
        request with claims where there is none is answered whole (``write``)."""
        self.prepare(call)
        kind, body, claims = call.kind, call.body, call.claims
        owner, cache_salt = call.owner_scope, call.cache_salt
        await self.start()
        if claims and not self.streams_claims:
            raise UsageError("stream", "no channel to the connector: claims need stream false")
        tokens, hashes, prompt_pid, specs = await self._claims_of(
            kind, body, claims, owner, cache_salt
        )
        client = await self._connector_ready()
        forwarded = _forwarded(body, client.model)
        forwarded["stream"] = True
        forwarded["return_token_ids"] = True  # the prompt's and the reply's, to name them
        options = dict(body.get("stream_options") or {})
        forwarded["stream_options"] = {**options, "include_usage": True}
        if cache_salt:
            forwarded["cache_salt"] = cache_salt
        on_reply, gated, riding, envelope = self._envelope(client, specs, owner or "default")
        forwarded["kv_transfer_params"] = {"agentclaims": envelope}
        self.completions += 1
        try:
            upstream = await self._http.stream(_KINDS[kind], forwarded)
        except BackendUnavailable:
            self._requeue(riding)
            await self.health()  # a dying server's refused connection: is the engine dead?
            if self.engine_dead is not None:
                raise self._dead_error() from None
            raise
        if upstream.status != 200:
            self._requeue(riding)
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
                hashes, prompt_pid = self._register(tokens, cache_salt)
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
            self._hold_op(spec, all_blocks=spec.claim_id in on_reply)
            for spec in specs
            if spec.claim_id not in gated
        ]
        riding = self._take_riding()
        return on_reply, gated, riding, client.envelope([*riding, *holds], tenant)

    # ------------------------------------------------------------------ riding operations
    def _queue(self, op: Op) -> None:
        """An operation (naming its tenant) waits for the next request to vLLM, at most
        ``ride_bound_s``; then it goes on its own (``_flush_riding``)."""
        self._riding.append((op, time.monotonic()))
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_later(self.ride_bound_s, self._flush_due)

    def _take_riding(self) -> list[Op]:
        """Every pending operation, for the request about to go (counted as riding)."""
        if not self._riding:
            return []
        taken, self._riding = self._riding, []
        self.ops_rode += len(taken)
        return self._waited(taken)

    def _waited(self, taken: Sequence[tuple[Op, float]]) -> list[Op]:
        now = time.monotonic()
        for _, queued in taken:
            wait = now - queued
            self.ride_waits.append(wait)
            self.ride_wait_sum += wait
            self.ride_wait_count += 1
        return [op for op, _ in taken]

    def _requeue(self, ops: Sequence[Op]) -> None:
        """Operations whose request may not have reached the connector go again (a release
        or renewal applied twice changes nothing the second time)."""
        self.ops_rode -= len(ops)
        for op in ops:
            self._queue(op)

    async def _operate(self, ops: Sequence[Op]) -> ConnectorAnswer:
        """``ops`` (each naming its tenant) sent now, over the channel where there is one, with
        every pending operation going first: whatever reaches the connector carries them."""
        riding = self._take_riding()
        try:
            return await (await self._connector_ready()).operate([*riding, *ops])
        except BaseException:
            self._requeue(riding)
            raise

    async def _settle_riding(self) -> None:
        """Pending operations applied now (a reader of the event stream or of residency sees
        what they did, not what it will be within the ride bound)."""
        if self._riding and self.engine_dead is None:
            await self._flush_riding()
        if self._flushing:  # one the bound set off, still on its way
            await asyncio.gather(*list(self._flushing), return_exceptions=True)

    def _flush_due(self) -> None:
        self._flush = None
        if not self._riding:
            return
        task = asyncio.ensure_future(self._flush_riding())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush_riding(self) -> None:
        """The pending operations no request took within the bound, on their own."""
        if not self._riding or self.engine_dead is not None:
            return
        taken, self._riding = self._riding, []
        ops = self._waited(taken)
        self.ops_standalone += len(ops)
        try:
            answer = await (await self._connector_ready()).operate(ops)
        except (BackendError, BackendUnavailable) as exc:
            log.warning("agentclaims: %d pending claim operations not applied: %r", len(ops), exc)
            return  # a dead engine ends every claim itself; else its TTLs end the holds
        async with self._lock:
            self._absorb(answer)

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
            tokens = _prompt_ids(data)
        if tokens is not None and prompt_pid is None:
            hashes = hash_token_blocks(tokens, self.block_size, cache_salt=cache_salt)
        sequence = _sequence_ids(data, tokens, self.block_size)
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
                hashes, prompt_pid = self._register(tokens, cache_salt, hashes)
            seq_pid = self._register(sequence, cache_salt, seq_hashes)[1] if sequence else None
            specs = [
                dataclasses.replace(spec, object_id=seq_pid, footprint_blocks=len(seq_hashes))
                if spec.claim_id in on_reply and seq_pid is not None
                else spec
                for spec in specs
            ]
            self._absorb(answer)
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

    def _hold_op(self, spec: ClaimSpec, *, all_blocks: bool = False) -> Hold:
        """The connector's ``hold``; ``all_blocks``: every full block the request leaves
        cached, its reply's included (``@sequence``: known only when it finishes)."""
        hint = spec.reuse_hint
        next_use = None
        if hint is not None and (hint.expected_s is not None or hint.closed):
            # the connector sheds soft holds farthest predicted next use first
            next_use = _NEVER_S if hint.closed else hint.expected_s
        return Hold(
            spec.claim_id,
            spec.protection_mode.value,
            "all" if all_blocks else spec.footprint_blocks,
            spec.ttl_s,
            next_use,
        )

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
            exists=self._claims.__contains__,
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
        rid = RequestId(self._our_request(answer.request_id) or answer.request_id)
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
                events_seq=self._events.seq,
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
            self._refuse(spec, gated[spec.claim_id], rid)
            if spec.claim_id in gated
            else self._decide(spec, answer, seq_hashes if spec.claim_id in on_reply else hashes)
            for spec in specs
        )
        return ServeResult(
            outcome,
            {"prompt": prompt_pid, "sequence": seq_pid, "messages": []},
            decisions,
            events_seq=self._events.seq,
            cached_tokens=answer.cached_tokens,
            block_hashes=tuple(hashes),
            deferred_s=answer.deferred_s,
        )

    def _gated(self, spec: ClaimSpec) -> str | None:
        if self.fault is not None:
            return self.fault
        if not self.connector and spec.protection_mode.value != "best_effort":
            return (
                f"no agentclaims connector answers in this vLLM: {spec.protection_mode.value} "
                "cannot be held (stock prefix caching only)"
            )
        return None if self.claim_gate is None else self.claim_gate(spec)

    def _refuse(self, spec: ClaimSpec, reason: str, request_id: str | None) -> ClaimDecision:
        """A claim refused before it reached vLLM: its events and decision, as the engine's."""
        claim = self._claims[spec.claim_id] = _Claim(spec, ClaimState.SUBMITTED, 0)
        submitted(self._events, claim, request_id)
        return refuse(self._events, claim, reason, request_id)

    def _decide(
        self, spec: ClaimSpec, answer: ConnectorAnswer, hashes: Sequence[BlockHash]
    ) -> ClaimDecision:
        try:
            result = answer.result_of(spec.claim_id)
        except KeyError:
            result = {
                "decision": "rejected",
                "reason": "the connector did not answer for this claim",
            }
        accepted = result.get("decision") == "accepted"
        state = ClaimState(result.get("state", "refused")) if accepted else ClaimState.REFUSED
        claim = _Claim(
            spec,
            state,
            int(result.get("blocks") or 0),
            hashes=tuple(hashes[: spec.footprint_blocks]),
            end_reason=None if accepted else str(result.get("reason")),
        )
        self._claims[spec.claim_id] = claim
        if claim.held and self.observer is not None:
            claim.state = ClaimState.ACCEPTED
            self._confirm(claim)
        state = claim.state
        return ClaimDecision(
            ClaimId(spec.claim_id),
            Decision.ACCEPTED if accepted else Decision.REJECTED,
            state,
            None if accepted else ArbiterAction.REFUSE_RESIDENCY_CLAIM,
            None if accepted else str(result.get("reason")),
        )

    # ------------------------------------------------------------------ the KV-events join
    def _confirm(self, claim: _Claim) -> None:
        """An accepted hold is materialized once vLLM's own events show every claimed block
        stored (the connector holds them; this is the engine saying they are cached)."""
        observer = self.observer
        if observer is None or claim.state is not ClaimState.ACCEPTED or not claim.held:
            return
        wanted = claim.spec.footprint_blocks
        if len(claim.hashes) != wanted or observer.leading_run(claim.hashes) < wanted:
            return  # not every claimed block is known, or not all seen cached yet
        claim.state = ClaimState.MATERIALIZED
        self._emit(
            EventName.RESIDENT_CLAIM_MATERIALIZED,
            claim.spec.claim_id,
            None,
            blocks=len(claim.hashes),
            seen="vllm_kv_events",
        )

    def _blocks_stored(self, stored: set[BlockHash]) -> None:
        for claim in self._claims.values():
            if claim.state is ClaimState.ACCEPTED and stored.intersection(claim.hashes):
                self._confirm(claim)

    def _blocks_lost(self, lost: set[BlockHash], why: str) -> None:
        """vLLM dropped blocks: after a claim's end they are counted as losses after release;
        a claim the gateway still believes held is judged once the connector's latest events
        are in (it may have shed or expired it meanwhile), and is harmed if it still holds."""
        suspects = []
        for cid, claim in self._claims.items():
            hit = lost.intersection(claim.hashes) - claim.lost
            if not hit:
                continue
            if claim.held:
                suspects.append(cid)
            elif claim.state in (ClaimState.EXPIRED, ClaimState.DEMOTED):
                self._count_lost(claim, hit, why)
        if suspects:
            task = asyncio.ensure_future(self._judge(suspects, lost, why))
            self._judging.add(task)
            task.add_done_callback(self._judging.discard)

    def _count_lost(self, claim: _Claim, hit: set[BlockHash], why: str) -> None:
        claim.lost |= hit
        self._emit(
            EventName.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE,
            claim.spec.claim_id,
            None,
            blocks=len(hit),
            positions=[i for i, h in enumerate(claim.hashes) if h in hit],
            cause=why,
        )

    async def _judge(self, claim_ids: Sequence[str], lost: set[BlockHash], why: str) -> None:
        answer = None
        with contextlib.suppress(BackendError, BackendUnavailable):  # else: judged as known
            answer = await self._operate([])
        harmed = []
        async with self._lock:
            if answer is not None:
                self._absorb(answer)
            for cid in claim_ids:
                claim = self._claims.get(cid)
                hit = set() if claim is None else lost.intersection(claim.hashes) - claim.lost
                if claim is None or not hit:
                    continue
                if claim.held:
                    self._harm(claim, hit, why)
                    harmed.append(claim)
                elif claim.state in (ClaimState.EXPIRED, ClaimState.DEMOTED):
                    self._count_lost(claim, hit, why)
        for claim in harmed:  # hand back whatever the connector still holds for it
            with contextlib.suppress(BackendError, BackendUnavailable):
                await self._connector.operate(
                    [Release(claim.spec.claim_id)], claim.spec.owner_scope
                )

    def _harm(self, claim: _Claim, hit: set[BlockHash], why: str) -> None:
        """A held claim's block left vLLM's cache: the connector failed its one job. The claim
        is harmed, with the cause, and the KV side fails closed (no claim accepted after)."""
        cid = claim.spec.claim_id
        positions = [i for i, h in enumerate(claim.hashes) if h in hit]
        cause = f"vLLM dropped held block(s) {positions} ({why}) while the connector held them"
        claim.lost |= hit
        self.fault = f"claim {cid}: {cause}: a connector bug; claims are suspended"
        log.error("agentclaims: %s", self.fault)
        if claim.state is ClaimState.MATERIALIZED:
            claim.held_blocks = 0
            after = 0 if self.observer is None else self.observer.leading_run(claim.hashes)
            harm(
                self._events,
                claim,
                cause,
                connector_bug=True,
                predicate="leading_prefix_at_least",
                leading_run_after=after,
                positions=positions,
            )

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
        if spec.claim_id in self._claims:
            raise UsageError("claim_id", f"claim {spec.claim_id!r} already exists")
        await self.model()
        mismatch = identity_problem(spec.cache_identity, self.identity())
        if mismatch is not None:
            async with self._lock:
                return self._refuse(spec, mismatch, None)
        known = self._prefixes.get(spec.object_id)
        if known is None:
            raise UsageError("object_id", f"unknown prefix {spec.object_id!r}: serve it first")
        reason = self._gated(spec)
        if reason is not None:
            async with self._lock:
                return self._refuse(spec, reason, None)
        client = await self._connector_ready()
        tokens, salt = known
        answer = await client.complete(
            tokens, [self._hold_op(spec)], max_tokens=1, tenant=spec.owner_scope, cache_salt=salt
        )
        hashes = hash_token_blocks(list(tokens), self.block_size, cache_salt=salt)
        if answer.served:
            self._last_stored = tuple(hashes)
            await self._seen_stored(hashes[: spec.footprint_blocks])
        async with self._lock:
            self._absorb(answer)
            return self._decide(spec, answer, hashes)

    def _owned(self, claim_id: str, owner_scope: str) -> _Claim:
        return owned_claim(self._claims, claim_id, owner_scope)

    @staticmethod
    def _end(claim: _Claim) -> None:
        """A released claim the connector did not hold (demoted, best effort) ends here."""
        if claim.end_reason is None:
            claim.state, claim.end_reason, claim.held_blocks = ClaimState.EXPIRED, "released", 0

    def _view(self, claim: _Claim) -> ClaimView:
        held = claim.held_blocks
        return claim.view(
            present_blocks=held,
            holds=claim.state is ClaimState.MATERIALIZED and held >= claim.spec.footprint_blocks,
            expires_at_ns=claim.expires_at_ns,
        )

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        return self._view(self._owned(claim_id, owner_scope))

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        await self.start()
        claim = self._owned(claim_id, owner_scope)
        ttl = renewal.ttl_s if renewal.ttl_s is not None else claim.spec.ttl_s
        if renewal.duration_steps is not None:
            raise UsageError(
                "duration_steps", "vLLM claims count seconds (ttl_s), not engine steps"
            )
        answer = await self._operate([Renew(claim_id, ttl, owner_scope)])
        async with self._lock:
            self._absorb(answer)
        result = next(
            (r for r in answer.results if r.get("op") == "renew" and r.get("claim_id") == claim_id),
            None,
        )
        if result is None or not result.get("ok"):
            reason = "no answer" if result is None else result.get("reason")
            raise UsageError("claim_id", f"claim {claim_id!r} cannot be renewed: {reason}")
        return self._view(claim)

    async def release_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        if self.engine_dead is None:  # else its claims have all ended: nothing to hand back
            await self.start()
        claim = self._owned(claim_id, owner_scope)
        if claim.held:  # the hand-back rides on the next request to vLLM (``_queue``)
            self._queue(Release(claim_id, owner_scope))
        if claim.state in (ClaimState.MATERIALIZED, ClaimState.ACCEPTED, ClaimState.DEMOTED):
            self._end(claim)  # its resident_claim_expired follows from the connector
        return self._view(claim)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        if self.engine_dead is None:  # a dead engine's events stay readable: they say so
            await self.start()
            await self._settle_riding()
        if self._judging:
            await asyncio.gather(*list(self._judging), return_exceptions=True)
        async with self._lock:
            return self._events.page(since, limit=limit, id_prefix=id_prefix)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        """Leading blocks known resident: those vLLM's events show cached (with the observer),
        and those of held claims (unknown is 0: fail closed)."""
        out = dict.fromkeys(prefix_ids, 0)
        if self.engine_dead is not None:
            return out  # its cache went with it
        await self._settle_riding()
        if self.observer is not None:
            await self._settle()
            for pid in out:
                known = self._prefixes.get(pid)
                if known is not None:
                    tokens, salt = known
                    hashes = hash_token_blocks(list(tokens), self.block_size, cache_salt=salt)
                    out[pid] = self.observer.leading_run(hashes)
        for claim in self._claims.values():
            pid = PrefixId(claim.spec.object_id)
            if pid in out and claim.state is ClaimState.MATERIALIZED:
                out[pid] = max(out[pid], claim.held_blocks)
        return out

    def metrics(self) -> dict[str, Any]:
        """What the gateway's ``/v1/stats`` and ``/metrics`` add for this KV side: the engine
        requests it made, the agents' completions and its own claim operations (``/metrics``:
        ``agentclaims_engine_requests_total{kind}``), and their ratio."""
        operations = self._connector.requests
        waits = sorted(self.ride_waits)
        return {
            "engine_requests": {"completion": self.completions, "operation": operations},
            "engine_requests_per_completion": round(
                (self.completions + operations) / self.completions, 4
            )
            if self.completions
            else None,
            "claim_operations": {
                "rode": self.ops_rode,
                "standalone": self.ops_standalone,
                "channel": self._connector.channel_ops,
            },
            "claim_operation_wait_s": {
                "count": self.ride_wait_count,
                "sum": round(self.ride_wait_sum, 6),
                "p50": round(waits[len(waits) // 2], 6) if waits else None,
                "max": round(waits[-1], 6) if waits else None,
                "bound": self.ride_bound_s,
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
            # the connector holds claimed blocks and sheds soft holds farthest predicted next
            # use first, each a demotion; vLLM's own free queue ranks nothing (LRU)
            SHEDS_BY_HINTS: self.connector,
            "special_object_ids": [PROMPT_OBJECT, SEQUENCE_OBJECT],
            CLAIMS_RIDE_ON_REQUESTS: self.connector,
            "connector_channel": self._connector.channel is not None,
            "usable_blocks": self.usable_blocks,
            "max_model_len": await self._max_model_len(),
            **{f"hold_{k}": v for k, v in self.limits.items()},
            "kv_events": None if self.observer is None else self.observer.stats(),
            "fault": self.fault,
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
        if self._judging:
            await asyncio.gather(*list(self._judging), return_exceptions=True)

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
            {c.spec.owner_scope for c in self._claims.values() if c.held} - {owner_scope}
        )
        if others:
            raise ContractViolation(f"a fresh instance would drop live claims of {others}")
        client = await self._connector_ready()
        held = await self._operate([])  # pending releases go first: what is left is held
        async with self._lock:
            self._absorb(held)
            ours = sum(c.held_blocks for c in self._claims.values() if c.held)
        if held.held_blocks > ours:  # another gateway on this vLLM holds claims too
            raise ContractViolation(
                f"a fresh instance would drop live claims: the connector holds "
                f"{held.held_blocks} blocks, this gateway's claims {ours}"
            )
        self._riding.clear()  # the revocation below ends every hold they would release
        answer = await client.operate([RevokeAll("fresh_instance")])
        async with self._lock:
            self._absorb(answer)
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
            self._claims.clear()
            # a fresh instance's stream: the numbers go on, the past is gone (read as a gap)
            self._events = EventLog(_Stamp(self), EVENTS_KEPT, first_seq=self._events.seq)
            self._last_stored = ()
        return self.identity()

    async def step(self, n: int = 1) -> None:
        raise OperationNotExposed(self.name, "step (vLLM claims count seconds: ttl_s)")

    async def aclose(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._riding:  # nothing pending is lost: hand it back before closing
            with contextlib.suppress(BackendError, BackendUnavailable):
                await self._flush_riding()
        if self._flushing:
            await asyncio.gather(*list(self._flushing), return_exceptions=True)
        await self._connector.aclose()
        if self.observer is not None:
            await self.observer.aclose()
        await self._http.aclose()
