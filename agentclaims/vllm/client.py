"""Talk to the agentclaims connector inside a vLLM server: signed claim operations riding on
requests to vLLM's own OpenAI API, or over the connector's own channel, and the connector's
answers read back.

This is the gateway's half of the lowering (the connector is the engine's half): token-id
prompts on ``/v1/completions``, ``kv_transfer_params["agentclaims"]`` signed with the key the
connector was started with, the decisions and claim events from the response's
``kv_transfer_params``. A refused request comes back finished as ``abort`` with the refusal.

Operations that ride on no request (``operate``) go over the connector's channel
(``agentclaims_vllm.channel``: a Unix socket in vLLM's engine core, named in every answer of
the connector) when the gateway runs on the same host, with the same signed envelopes: no
engine request. Elsewhere, or while the channel does not answer, a one-token request carries
them, as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentclaims_vllm.ops import EXTENSION_KEY, Answer, Op, Reply, to_wire

from agentclaims.errors import BackendError, UsageError
from agentclaims.vllm.upstream import Upstream

__all__ = ["SEEN_EVENTS", "ConnectorAnswer", "ConnectorClient"]

log = logging.getLogger("agentclaims.vllm")

_LOOPBACK = ("127.", "localhost", "[::1]")
SEEN_EVENTS = 4096
"""Connector events a client keeps for its readers (the gateway mirrors each as it comes)."""
_CHANNEL_IDLE_S = 60.0
"""A channel connection idle longer than this is opened anew (the connector closes its own
after 300 s idle)."""
_CHANNEL_LINE = 4 << 20


@dataclass(frozen=True, slots=True)
class ConnectorAnswer:
    """One request's outcome as vLLM and the connector report it."""

    request_id: str
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    results: tuple[Mapping[str, Any], ...] = ()
    events: tuple[Mapping[str, Any], ...] = ()
    last_seq: int = 0
    held_blocks: int = 0
    refused: Mapping[str, Any] | None = None
    deferred_s: float = 0.0
    """Seconds the connector's admission hook held the request back for claims' blocks."""
    pool: Mapping[str, Any] | None = None
    """The pool's churn from vLLM's KV events (the connector's ``PoolChurn.figures``), where
    vLLM records them."""
    text: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    reply: Reply | None = field(default=None, repr=False)
    """The connector's answer as it wrote it (``None``: it said nothing)."""

    @property
    def served(self) -> bool:
        return self.refused is None and self.finish_reason != "abort"

    def result_of(self, claim_id: str) -> Mapping[str, Any]:
        for r in self.results:
            if r.get("claim_id") == claim_id:
                return r
        raise KeyError(claim_id)


class ConnectorClient:
    """Signed claim operations against one vLLM server running the connector."""

    def __init__(
        self,
        base_url: str,
        claims_key: str,
        *,
        model: str,
        tenant: str = "default",
        timeout_s: float = 60.0,
        client: Upstream | None = None,
    ) -> None:
        if not claims_key:
            raise UsageError("claims_key", "must be the key the connector was started with")
        self._client = client or Upstream(base_url, timeout_s=timeout_s)
        self.base_url = self._client.base_url
        self.model = model
        self.tenant = tenant
        self._key = claims_key
        self.cursor = 0
        """The last connector event sequence number read (events are asked for after it)."""
        self.requests = 0
        """Engine requests this client made: each a one-token completion of the gateway's own
        (a claim's hold, a release, a renewal, a probe), never an agent's."""
        self.seen: deque[Mapping[str, Any]] = deque(maxlen=SEEN_EVENTS)
        """The connector events read so far, in order (each once): the last ``SEEN_EVENTS``."""
        self.channel_ops = 0
        """Envelopes sent over the connector's channel (no engine request)."""
        self.channel: str | None = None
        """The connector's channel (its socket's path), once an answer named it and this
        gateway can reach it (same host)."""
        self.instance: str | None = None
        """The connector's ``instance``, as its answers name it."""
        self._channel_io: tuple[asyncio.StreamReader, asyncio.StreamWriter, float] | None = None
        self._channel_lock = asyncio.Lock()
        self._local = self.base_url.split("://", 1)[-1].startswith(_LOOPBACK)

    def envelope(
        self, ops: Sequence[Op | Mapping[str, Any]], tenant: str | None = None
    ) -> dict[str, Any]:
        """The signed ``kv_transfer_params["agentclaims"]`` object for ``ops`` (of ``tenant``,
        by default the client's): typed operations (``agentclaims_vllm.ops``), or objects as
        they go on the wire."""
        from agentclaims_vllm.signing import sign

        body = {
            "v": 1,
            "tenant": tenant or self.tenant,
            "nonce": os.urandom(16).hex(),
            "issued_ns": time.time_ns(),  # refused once stale: no replay after a restart
            **({"instance": self.instance} if self.instance is not None else {}),
            "since": self.cursor,
            "ops": [dict(op) if isinstance(op, Mapping) else to_wire(op) for op in ops],
        }
        signed: dict[str, Any] = sign(body, self._key)
        return signed

    async def complete(
        self,
        prompt: Sequence[int],
        ops: Sequence[Op | Mapping[str, Any]] = (),
        *,
        max_tokens: int = 4,
        kv_transfer_params: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
    ) -> ConnectorAnswer:
        """One completion over token ids, carrying ``ops`` (signed), temperature 0; under
        ``cache_salt`` when the prefix was served under one (its blocks are then those)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if cache_salt:
            body["cache_salt"] = cache_salt
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = dict(kv_transfer_params)
        else:  # always signed: the answer then carries the events after the cursor
            body["kv_transfer_params"] = {EXTENSION_KEY: self.envelope(ops, tenant)}
        self.requests += 1
        status, data = await self._client.post("/v1/completions", body)
        if status != 200 or not isinstance(data, dict):
            raise BackendError(f"vLLM answered HTTP {status}: {str(data)[:300]}")
        return self._answer(data)

    def _answer(self, data: Mapping[str, Any]) -> ConnectorAnswer:
        choice = (data.get("choices") or [{}])[0]
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        own = ConnectorAnswer(  # what vLLM's own answer says
            request_id=str(data.get("id")),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            text=str(choice.get("text") or ""),
            raw=data,
        )
        raw = (data.get("kv_transfer_params") or {}).get(EXTENSION_KEY)
        if not raw:  # a plain call's: the connector had nothing to say
            return own
        reply = Reply.from_wire(raw)  # read once, here
        self._learn(reply)
        events = tuple(e for e in reply.events if int(e.get("seq", 0)) > self.cursor)
        if events:
            self.seen.extend(events)
            self.cursor = int(events[-1].get("seq", 0))
        return dataclasses.replace(
            own,
            results=reply.results,
            events=events,
            last_seq=reply.last_seq,
            held_blocks=reply.held_blocks,
            refused=reply.refused,
            deferred_s=float(reply.deferred_s or 0.0),
            pool=reply.pool,
            reply=reply,
        )

    def _learn(self, reply: Reply) -> None:
        """The connector's instance and channel, as its answer names them."""
        instance = reply.instance
        if instance is not None and instance != self.instance:
            self.instance = instance  # a vLLM started again: its channel is another
            self.channel = None
            self._drop_channel()
        path = reply.channel
        if self.channel is None and self._local and path is not None and os.path.exists(path):
            self.channel = path

    async def operate(
        self, ops: Sequence[Op | Mapping[str, Any]], tenant: str | None = None
    ) -> ConnectorAnswer:
        """Apply ``ops`` (release, renew, answer, revoke_all) now: over the connector's
        channel where it answers, else on a one-token request. The answer holds every event
        after the cursor (further pages are fetched while the connector has more than one
        answer carries)."""
        answer = await self._standalone(ops, tenant)
        events = list(answer.events)
        while events and self.cursor < answer.last_seq:
            more = await self._standalone((), None)
            if not more.events:
                break
            events.extend(more.events)
            answer = more
        return dataclasses.replace(answer, events=tuple(events))

    async def _standalone(
        self, ops: Sequence[Op | Mapping[str, Any]], tenant: str | None
    ) -> ConnectorAnswer:
        if self.channel is not None:
            try:
                raw = await self._over_channel(ops, tenant)
                return self._answer({"id": "channel", "kv_transfer_params": {EXTENSION_KEY: raw}})
            except (OSError, ValueError, BackendError) as exc:
                log.warning(
                    "agentclaims: the connector's channel failed (%r); sending the operations "
                    "on a one-token request instead",
                    exc,
                )
                self._drop_channel()
        return await self.complete([1], ops, max_tokens=1, tenant=tenant)

    async def _over_channel(
        self, ops: Sequence[Op | Mapping[str, Any]], tenant: str | None
    ) -> dict[str, Any]:
        """The connector's answer to ``ops`` over its channel (read, not yet taken in)."""
        assert self.channel is not None
        envelope = self.envelope(ops, tenant)
        async with self._channel_lock:
            io = self._channel_io
            if io is None or time.monotonic() - io[2] > _CHANNEL_IDLE_S:
                self._drop_channel()
                reader, writer = await asyncio.open_unix_connection(
                    self.channel, limit=_CHANNEL_LINE
                )
            else:
                reader, writer = io[0], io[1]
            self._channel_io = None  # a failure below leaves no half-read connection behind
            writer.write(json.dumps(envelope, separators=(",", ":")).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), self._client.timeout_s)
            if not line:
                writer.close()
                raise BackendError("the connector's channel closed the connection")
            self._channel_io = (reader, writer, time.monotonic())
        self.channel_ops += 1
        answer = json.loads(line)
        if not isinstance(answer, dict) or not answer.get("ok"):
            reason = answer.get("reason") if isinstance(answer, dict) else answer
            raise BackendError(f"the connector's channel refused the operations: {reason}")
        if answer.get("instance") != self.instance:
            raise BackendError("the channel answers for another connector than vLLM's")
        return answer

    def _drop_channel(self) -> None:
        io, self._channel_io = self._channel_io, None
        if io is not None:
            io[1].close()

    async def answer_of(self, nonce: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The connector's answer for the request whose envelope had ``nonce`` (a streamed
        one: vLLM sends none in a stream), over the channel, with every event after the
        cursor (not yet taken in: ``_answer`` of a body carrying it does); ``None`` when the
        channel has none to give."""
        if self.channel is None:
            return None
        try:
            raw = await self._over_channel([Answer(nonce)], tenant)
        except (OSError, ValueError, BackendError) as exc:
            log.warning("agentclaims: the connector's channel failed (%r)", exc)
            self._drop_channel()
            return None
        found = next((r for r in raw.get("results") or () if r.get("op") == "answer"), None)
        kept = None if found is None else found.get("answer")
        if not isinstance(kept, dict):
            return None
        return {**kept, "events": raw.get("events") or [], "last_seq": raw.get("last_seq")}

    def skip_events(self, last_seq: int) -> None:
        """Read only events after ``last_seq`` from now on (and forget those before)."""
        self.cursor = max(self.cursor, last_seq)
        self.seen = deque(
            (e for e in self.seen if int(e.get("seq", 0)) > last_seq), maxlen=SEEN_EVENTS
        )

    async def aclose(self) -> None:
        self._drop_channel()
        await self._client.aclose()
