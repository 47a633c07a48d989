"""``AgentClaimsConnector``: residency claims enforced inside a stock vLLM, as a KV connector.

Loaded by vLLM's own flag, nothing patched::

    --kv-transfer-config '{"kv_connector": "AgentClaimsConnector",
                           "kv_connector_module_path": "agentclaims_vllm.connector",
                           "kv_role": "kv_producer",
                           "kv_connector_extra_config": {"claims_key": "..."}}'

It moves no KV (the worker-side hooks are no-ops). On the scheduler side it holds references
on claimed prefixes' blocks in vLLM's live ``BlockPool`` (``claims.ClaimBook``), so they are
never evicted, and uses the admission hook (``get_num_new_matched_tokens``) to shed soft holds
or defer a request that would need held blocks. Claim operations ride on requests, in
``kv_transfer_params["agentclaims"]``, signed with ``claims_key`` and accepted once, while fresh, by the instance it names
(``signing``)::

    {"v": 1, "tenant": "t1", "nonce": "...", "issued_ns": 1796420346851586490,
     "instance": "<this connector's, once known>", "since": 17,
     "ops": [{"op": "hold", "claim_id": "c1", "mode": "hard_protected", "blocks": 6,
              "ttl_s": 30, "next_use_s": 2.5},
             {"op": "release", "claim_id": "c0"}, {"op": "renew", "claim_id": "c2", "ttl_s": 9},
             {"op": "revoke_all", "reason": "gateway_restart"}],
     "sig": "<hmac-sha256>"}

``release`` and ``renew`` apply when the request arrives; ``hold`` when it finishes, on its own
leading full blocks (before vLLM frees them). A release of a claim whose prefix the request
itself starts with (an agent's next call letting go of the claim on its last one) applies
once the request has its blocks (vLLM allocated them; or it ended first): the prefix stays
held while the request waits in vLLM's queue, where other requests' allocations would evict
it just before its reuse. An operation may name its own ``tenant`` (the
gateway puts any tenant's pending releases on whichever request goes out next); else the
envelope's. The answer comes back in the response's ``kv_transfer_params["agentclaims"]``: the
decisions, the claim events after ``since``, and ``deferred_s`` when held claims kept the
request waiting before it ran.

What cannot wait for a request (a release on an idle server, a renewal answered now, the
answer of a streamed request, which vLLM does not send in a stream) goes over the connector's
own channel (``channel``): the same signed envelopes on a local socket, applied between two
engine steps under the lock ``ClaimsScheduler`` holds through each step. Every answer names the
channel's path and this connector's ``instance``; ``{"op": "answer", "nonce": N}`` there gives
the answer of the request whose envelope had nonce ``N``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import get_block_hash

from agentclaims_vllm.channel import OpsChannel
from agentclaims_vllm.churn import PoolChurn
from agentclaims_vllm.claims import ClaimBook
from agentclaims_vllm.ops import (
    EXTENSION_KEY,
    Answer,
    Hold,
    MalformedOp,
    Release,
    Renew,
    Reply,
    RevokeAll,
    parse,
)
from agentclaims_vllm.selftest import check_engine, check_pool
from agentclaims_vllm.signing import NonceWindow, verify

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["AgentClaimsConnector"]

logger = init_logger(__name__)
_WATERMARK_BLOCKS = 1
_KEPT_ANSWERS = 4096
"""Answers kept for the channel's ``answer`` operation (a streamed request's), oldest dropped."""


_INBOX_POLL_S = 0.002
"""How often a channel envelope waiting for a step looks whether the lock came free."""


def _is_hold(raw: Any) -> bool:
    return isinstance(raw, dict) and raw.get("op") == Hold.op


def _holds(envelope: Mapping[str, Any]) -> list[Hold | MalformedOp]:
    """The envelope's hold operations, each parsed (or why it cannot be)."""
    out: list[Hold | MalformedOp] = []
    for raw in envelope.get("ops") or ():
        if _is_hold(raw):
            try:
                op = parse(raw)
            except MalformedOp as exc:
                out.append(exc)
                continue
            assert isinstance(op, Hold)
            out.append(op)
    return out


def _hold_refused(claim_id: Any, reason: str) -> dict[str, Any]:
    return {"claim_id": claim_id, "decision": "rejected", "state": "refused", "reason": reason}


def _refused(verdict: Any) -> dict[str, Any]:
    """A request's refusal (``claims.Verdict``) as its answer says it: the outcome's fields."""
    return {
        "action": "refuse_active",
        "feasibility": "infeasible_preserve_resident_and_active",
        "blocking_claim_ids": list(verdict.blocking_claim_ids),
        "shortfall_blocks": verdict.shortfall_blocks,
        "retry_after_s": verdict.retry_after_s,
    }


class _Inbox:
    """One channel envelope on its way to the engine's thread, and its answer."""

    __slots__ = ("answer", "done", "envelope", "tries")

    def __init__(self, envelope: Mapping[str, Any]) -> None:
        self.envelope = envelope
        self.answer: dict[str, Any] = {"ok": False, "reason": "not applied"}
        self.done = threading.Event()
        self.tries = 0


class EnvelopeInbox:
    """Envelopes from the channel (its thread) on their way to the engine's thread: each is
    applied between two engine steps. It waits in the inbox: the engine's thread applies it
    at the top of its next step (``drain``, under the lock it holds through the step), or,
    when the lock is free (the engine idles, or is between steps), the channel's thread
    applies it at once. A lock the engine retakes step after step is never simply waited
    on: that starves."""

    def __init__(self, lock: Any, apply: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
        self._lock = lock
        self._apply = apply
        self._waiting: deque[_Inbox] = deque()

    def handle(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """``envelope`` applied (by whichever thread gets to it first); its answer."""
        item = _Inbox(envelope)
        self._waiting.append(item)
        while not item.done.wait(0 if item.tries == 0 else _INBOX_POLL_S):
            item.tries += 1
            if self._lock.acquire(blocking=False):
                try:
                    self.drain()
                finally:
                    self._lock.release()
        return item.answer

    def drain(self) -> None:
        """Apply every envelope waiting (the caller holds the lock)."""
        while self._waiting:
            item = self._waiting.popleft()
            try:
                item.answer = self._apply(item.envelope)
            except Exception as exc:  # the engine goes on; the caller hears why
                item.answer = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
            item.done.set()


def _leading_cached(pool: BlockPool, block_ids: list[int]) -> list[Any]:
    """The request's blocks from the head while each is a cached full block."""
    out = []
    for block_id in block_ids:
        block = pool.blocks[block_id]
        if block.block_hash is None or block.is_null:
            break
        out.append(block)
    return out


def _reuses(book: ClaimBook, request: Request, claim_id: str) -> bool:
    """Whether ``request`` starts with the first block claim ``claim_id`` holds."""
    hold = book.holds.get(claim_id)
    if hold is None or not hold.blocks or not request.block_hashes:
        return False
    first = hold.blocks[0].block_hash
    return first is not None and get_block_hash(first) == request.block_hashes[0]


def _removed_and_stored(pool: BlockPool) -> tuple[list[Any], list[Any]]:
    """The hashes of the cached blocks vLLM evicted (``BlockRemoved``) and of the blocks it
    stored (``BlockStored``) since it last took its KV events."""
    removed: list[Any] = []
    stored: list[Any] = []
    for event in pool.kv_event_queue:
        if isinstance(event, BlockRemoved):
            removed.extend(event.block_hashes)
        elif isinstance(event, BlockStored):
            stored.extend(event.block_hashes)
    return removed, stored


class _NoMetadata(KVConnectorMetadata):
    """Nothing goes to the workers: this connector moves no KV."""


class _VllmPool:
    """``claims.PoolPort`` over vLLM's block pool."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool

    def hold(self, blocks: Sequence[Any]) -> None:
        self.pool.touch(blocks)

    def unhold(self, blocks: Sequence[Any], *, evict_first: bool = False) -> None:
        tail_first = list(reversed(blocks))  # the first freed is evicted first: tail first
        self.pool.free_blocks(tail_first)  # cached blocks join the free queue at its tail
        if evict_first:  # a finished agent's: to the head instead, the next victims
            queue = self.pool.free_block_queue
            freed = [b for b in tail_first if b.ref_cnt == 0 and b.block_hash is not None]
            for block in freed:
                queue.remove(block)
            queue.prepend_n(freed)

    def num_free(self) -> int:
        return int(self.pool.get_num_free_blocks())


class AgentClaimsConnector(KVConnectorBase_V1):
    """The agentclaims connector (scheduler side does the work; worker side is inert)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._key = str(extra.get("claims_key") or os.environ.get("AGENTCLAIMS_CLAIMS_KEY", ""))
        self._max_ttl_s = float(extra.get("max_ttl_s", 600.0))
        self._max_defer_s = float(extra.get("max_defer_s", 30.0))
        self._soft_reserve_blocks = int(extra.get("soft_reserve_blocks", _WATERMARK_BLOCKS))
        """Blocks soft holds leave free (at least the watermark; at most what hard ones leave,
        a max-length request's): soft holds fill the pool but that, shed for a request that
        needs their room and for running requests' next blocks before each step
        (``relieve``), each only of the blocks still needed."""
        self._quotas = {str(k): int(v) for k, v in (extra.get("tenant_quota_blocks") or {}).items()}
        self._book: ClaimBook | None = None
        self._pool: BlockPool | None = None
        self._churn: PoolChurn | None = None
        """The pool's evictions, from its KV events (``None``: it records none, so the
        answers say nothing of its pressure)."""
        self._nonces = NonceWindow()
        self._ops: dict[str, dict[str, Any]] = {}  # request id -> its verified envelope
        self._receipts: dict[str, list[dict[str, Any]]] = {}  # request id -> op results
        self._staged: dict[str, list[tuple[Release, str]]] = {}
        """request id -> releases (and their tenants) of the prefix it reuses, applied once
        it has its blocks (``update_state_after_alloc``) or ends (``request_finished``)."""
        self._refusals: dict[str, Any] = {}  # request id -> its refusal verdict, to abort
        self._refused_params: dict[str, dict[str, Any]] = {}  # answers of aborted refusals
        self._pending_refusals: dict[str, Any] = {}
        self._asks: dict[str, int] = {}
        """Requests the admission hook found held back (blocks needed), for the next step."""
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """envelope nonce -> its request's answer, for the channel's ``answer`` operation."""
        self.lock = threading.RLock()
        """Held by ``ClaimsScheduler`` through each scheduler step, and by the channel while it
        applies an operation: the book and vLLM's block pool change on one thread at a time."""
        self._inbox = EnvelopeInbox(self.lock, self._apply_envelope)
        """Envelopes from the channel waiting for the next step (or a free lock)."""
        self.instance = uuid.uuid4().hex[:16]
        """This connector's name in its answers (the gateway checks the channel's is the same)."""
        self._channel_path = str(
            extra.get("channel_path")
            or os.path.join(tempfile.gettempdir(), f"agentclaims-vllm-{self.instance}.sock")
        )
        self.channel: OpsChannel | None = None
        if role is KVConnectorRole.SCHEDULER:
            check_engine(vllm_config, kv_cache_config)
            if not self._key:
                raise RuntimeError(
                    "agentclaims connector: no claims_key in kv_connector_extra_config (or "
                    "AGENTCLAIMS_CLAIMS_KEY): claim operations could not be authenticated"
                )
        self._block_size = vllm_config.cache_config.block_size
        self._max_model_len = vllm_config.model_config.max_model_len

    # ------------------------------------------------------------------ binding
    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """vLLM hands over its live block pool, once, before any request (changes state):
        the claim book is made on it, with the caps a max-length request always fits under."""
        check_pool(gpu_block_pool)
        self._pool = gpu_block_pool
        total = gpu_block_pool.num_gpu_blocks - 1  # block 0 is vLLM's null block
        reserve = math.ceil(self._max_model_len / self._block_size) + _WATERMARK_BLOCKS
        self._book = ClaimBook(
            _VllmPool(gpu_block_pool),
            total,
            reserve,
            max_ttl_s=self._max_ttl_s,
            tenant_quota_blocks=self._quotas,
            max_defer_s=self._max_defer_s,
            soft_reserve_blocks=min(reserve, max(_WATERMARK_BLOCKS, self._soft_reserve_blocks)),
        )
        if getattr(gpu_block_pool, "enable_kv_cache_events", False) and hasattr(
            gpu_block_pool, "kv_event_queue"
        ):  # (a vLLM whose pool keeps them elsewhere: its churn is unknown, not a crash)
            self._churn = PoolChurn()
        logger.info(
            "agentclaims connector bound: %d blocks, hard holds capped at %d, all at %d, "
            "max TTL %.0f s",
            total,
            self._book.hard_cap_blocks,
            self._book.cap_blocks,
            self._max_ttl_s,
        )

    @property
    def book(self) -> ClaimBook:
        if self._book is None:
            raise RuntimeError("agentclaims connector: the block pool was never bound")
        return self._book

    # ------------------------------------------------------------------ requests in
    def on_new_request(self, request: Request) -> None:
        """A request arrives (changes state): its signed envelope, if any, is checked (a
        forged, stale or replayed one is refused with an event, nothing else changes), its
        releases and renewals apply now (a release of the prefix the request itself starts
        with is staged until it has its blocks); its holds wait for ``request_finished``."""
        params = request.kv_transfer_params or {}
        envelope = params.get(EXTENSION_KEY)
        if envelope is None:
            return
        rid = request.request_id
        reason = self._rejected(envelope, rid)
        if reason is not None:
            self._receipts[rid] = [{"ok": False, "reason": reason}]
            return
        self._receipts[rid] = self._apply(envelope, request)
        self._ops[rid] = envelope

    def _rejected(self, envelope: Any, request_id: str | None) -> str | None:
        """Why ``envelope`` is not accepted (each refusal an event), or ``None``."""
        reason: str | None
        if not isinstance(envelope, dict) or not verify(envelope, self._key):
            reason = "unsigned or forged claim operations"
        elif envelope.get("instance", self.instance) != self.instance:
            reason = "signed for another connector instance"
        else:
            reason = self._nonces.check(envelope.get("nonce"), envelope.get("issued_ns"))
            if reason is None:
                return None
        self.book.emit("claim_operations_rejected", request_id=request_id, reason=reason)
        return reason

    def _apply(
        self, envelope: Mapping[str, Any], request: Request | None = None
    ) -> list[dict[str, Any]]:
        """The operations of a verified envelope that apply now (all but ``hold``, which
        applies when its request finishes, and a release of the prefix ``request`` reuses,
        which applies once it has its blocks), each under its own tenant or the envelope's."""
        default = str(envelope.get("tenant") or "default")
        results: list[dict[str, Any]] = []
        book = self.book
        for raw in envelope.get("ops") or ():
            if _is_hold(raw):
                continue  # applies when its request finishes (``_holds``)
            try:
                op = parse(raw)
            except MalformedOp as exc:
                results.append({"op": exc.kind, "ok": False, "reason": exc.reason})
                continue
            if isinstance(op, Release):
                if request is not None and _reuses(self.book, request, op.claim_id):
                    self._staged.setdefault(request.request_id, []).append((op, default))
                else:
                    results.append(self._release(op, default))
            elif isinstance(op, Renew):
                results.append(book.renew(op.claim_id, op.tenant or default, op.ttl_s))
            elif isinstance(op, RevokeAll):  # a gateway restarting without a ledger: end all
                ended = book.revoke_all(f"revoked: {op.reason}")
                results.append({"op": op.op, "ok": True, "revoked": ended})
            elif isinstance(op, Answer):  # the channel's: a finished request's answer, once
                kept = self._answers.pop(op.nonce, None)
                results.append({"op": op.op, "ok": kept is not None, "answer": kept})
        return results

    def _release(self, op: Release, default_tenant: str) -> dict[str, Any]:
        return self.book.release(
            op.claim_id, op.tenant or default_tenant, evict_first=op.evict_first
        )

    def _release_staged(self, request_id: str) -> list[dict[str, Any]]:
        """Apply the releases staged for ``request_id`` (it has its blocks, or ended)."""
        return [self._release(op, tenant) for op, tenant in self._staged.pop(request_id, ())]

    def _answer(self, results: list[dict[str, Any]], since: int) -> Reply:
        """An answer: the operations' results, the events after ``since`` and the limits."""
        book = self.book
        return Reply(
            results=tuple(results),
            events=tuple(book.events_since(since, limit=256)),
            last_seq=book.seq,
            held_blocks=book.claimed_blocks,
            cap_blocks=book.hard_cap_blocks,
            soft_cap_blocks=book.cap_blocks,
            max_ttl_s=book.max_ttl_s,
            max_defer_s=book.max_defer_s,
            instance=self.instance,
            channel=None if self.channel is None else self.channel.path,
            # the pool's churn from its KV events, where vLLM records them (set with the pool)
            pool=None if self._churn is None else self._churn.figures(book.pool.num_free()),
            scheduling=str(self._vllm_config.scheduler_config.policy),  # (priority ordered?)
        )

    def count_evictions(self) -> None:
        """Count the evictions among the KV events vLLM recorded since it last took them
        (``ClaimsScheduler`` calls this in each step, before vLLM takes and publishes them)."""
        if self._churn is not None and self._pool is not None:
            self._churn.saw(*_removed_and_stored(self._pool))

    # ------------------------------------------------------------------ the channel
    def open_channel(self) -> None:
        """Serve the channel (``ClaimsScheduler`` calls this: only a scheduler that holds
        ``lock`` through its steps makes operations between steps safe)."""
        if self.channel is not None or self._book is None:
            return
        channel = OpsChannel(self._channel_path, self.handle_envelope)
        try:
            channel.start()
        except OSError as exc:
            logger.warning("agentclaims connector: no channel at %s: %s", self._channel_path, exc)
            return
        self.channel = channel
        logger.info("agentclaims connector: claim operations channel at %s", channel.path)

    def handle_envelope(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """One signed envelope from the channel (its thread), applied between two engine
        steps (``EnvelopeInbox``)."""
        return self._inbox.handle(envelope)

    def drain(self) -> None:
        """Apply every envelope waiting in the channel's inbox (the caller holds ``lock``)."""
        self._inbox.drain()

    def _apply_envelope(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        reason = self._rejected(envelope, None)
        if reason is not None:
            return {"ok": False, "reason": reason, "instance": self.instance}
        self.book.expire_due()  # an idle engine runs no step to end them
        results = [
            _hold_refused(op.claim_id, "a hold rides on the request whose blocks it holds")
            for op in _holds(envelope)
        ]
        results = self._apply(envelope) + results
        return {"ok": True, **self._answer(results, int(envelope.get("since") or 0)).to_wire()}

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The admission hook (vLLM asks it again each step a request waits): 0 (nothing to
        load) when the request may run, ``None`` (ask again next step) while hard holds stand
        in its way. A query while nothing held is in its way; where soft holds are, it sheds
        them now (``ClaimBook.admit``, each a demotion event) and the request runs in this
        step: waiting a step for them would cost it a whole engine step of time to its first
        token. A request hard holds keep out is remembered; at the top of the next step
        ``settle_admissions`` defers or refuses it, with the events."""
        bs = self._block_size
        needed = -(-request.num_tokens // bs) - num_computed_tokens // bs
        book = self.book
        if book.holds:  # (with nothing held every request is served: no need to look)
            needed += self._free_hits(request, num_computed_tokens // bs)
        if book.fits(needed) or book.admit(request.request_id, needed).action == "serve":
            return 0, False
        self._asks[request.request_id] = needed
        return None, False

    def relieve(self, running: int) -> None:
        """Before a step: shed soft holds until the ``running`` requests' next blocks (one
        each) and the watermark are free (each shed a demotion event)."""
        book = self._book
        if book is not None and book.holds:
            book.relieve(running + _WATERMARK_BLOCKS)

    def settle_admissions(self, waiting: Callable[[str], bool]) -> None:
        """Before a step (``ClaimsScheduler``): each request the admission hook found kept out
        by hard holds, if ``waiting`` still, is judged again (``ClaimBook.admit``): served
        once they end, else deferred or refused (``take_refusals`` then aborts it)."""
        if not self._asks:
            return
        asks, self._asks = self._asks, {}
        book = self.book
        for request_id, needed in asks.items():
            if not waiting(request_id):
                continue
            verdict = book.admit(request_id, needed)
            if verdict.action == "refuse":
                self._refusals[request_id] = verdict

    def _free_hits(self, request: Request, hit_blocks: int) -> int:
        """The request's cache hits that sit in the free queue (no running request uses
        them): the scheduler takes each out of the queue when it reuses it, so each costs a
        free block as a new block does. Counting only new blocks would serve a request that
        cannot be given its blocks, and leave it waiting with no event."""
        pool = self._pool
        if pool is None or not hit_blocks:
            return 0
        free = 0
        for block_hash in request.block_hashes[:hit_blocks]:
            cached = pool.get_cached_block(block_hash, [0])  # one KV cache group (check_engine)
            if cached and cached[0].ref_cnt == 0:
                free += 1
        return free

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """vLLM gave the request its blocks (changes state): a deferral the holds caused
        ends (``ClaimBook.admitted``), and the releases staged for it apply now, since the
        prefix they held is the request's own (referenced by it) and cannot be evicted from
        under it. No hold is applied here."""
        if self._book is not None:
            rid = request.request_id
            self._book.admitted(rid)  # it runs: a wait the holds caused ends
            if rid in self._staged:  # its prefix is its own now: the claim on it may go
                self._receipts.setdefault(rid, []).extend(self._release_staged(rid))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """Once per scheduler step (changes state): holds whose TTL passed expire here, each
        with ``resident_claim_expired``, their blocks handed back to vLLM's free queue. No
        metadata goes to the workers (the connector moves no KV)."""
        if self._book is not None:
            self._book.expire_due()
        return _NoMetadata()

    def take_refusals(self) -> list[str]:
        """Requests the admission hook refused (for ``ClaimsScheduler`` to abort)."""
        out = list(self._refusals)
        self._pending_refusals = dict(self._refusals)
        self._refusals.clear()
        return out

    def take_finished_params(self, request_id: str) -> dict[str, Any] | None:
        """The answer ``request_finished`` gave for an aborted (refused) request."""
        return self._refused_params.pop(request_id, None)

    # ------------------------------------------------------------------ requests out
    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The request ended, its blocks not yet freed (changes state): where holds are
        applied. Each ``hold`` of its envelope takes references on the request's leading
        cached full blocks (``ClaimBook.hold``: accepted, capped or refused, each with its
        events) before vLLM frees them, so they are never evicted while held; releases
        staged for it apply if it ended before its blocks came. Returns ``(False, answer)``:
        vLLM frees the blocks at once (nothing is saved asynchronously) and hands the answer
        (decisions, events after the envelope's ``since``, limits, a deferral or refusal) back
        in the response's ``kv_transfer_params``; a plain request no claim touched answers
        nothing."""
        rid = request.request_id
        book = self.book
        held_back = book.forget(rid)
        envelope = self._ops.pop(rid, None)
        results = self._receipts.pop(rid, None)
        refusal = self._pending_refusals.pop(rid, None)
        if envelope is None and results is None and refusal is None and held_back is None:
            return False, None  # a plain request held claims never touched: nothing to tell
        results = [*(results or ()), *self._release_staged(rid)]  # (ended before its blocks)
        if envelope is not None and refusal is None:  # a refused request computed no blocks
            tenant = str(envelope.get("tenant") or "default")
            assert self._pool is not None
            run = _leading_cached(self._pool, block_ids)
            for op in _holds(envelope):
                if isinstance(op, MalformedOp):
                    results.append(_hold_refused(op.claim_id, op.reason))
                    continue
                wanted = op.blocks
                results.append(
                    book.hold(
                        op.claim_id,
                        op.tenant or tenant,
                        op.mode,
                        run,
                        wanted_blocks=None if wanted in (None, "all") else int(wanted),
                        ttl_s=op.ttl_s,
                        next_use_s=op.next_use_s,
                        request_id=rid,
                    )
                )
        since = int((envelope or {}).get("since") or 0)
        reply = self._answer(results, since)
        if held_back is not None and refusal is None:  # served after held claims' deferral
            reply = dataclasses.replace(reply, deferred_s=round(held_back, 6))
        if refusal is not None:
            reply = dataclasses.replace(reply, refused=_refused(refusal))
        answer = reply.to_wire()
        if refusal is not None:
            self._refused_params[rid] = {EXTENSION_KEY: answer}
        nonce = (envelope or {}).get("nonce")
        if isinstance(nonce, str):  # a streamed request's answer is read over the channel
            self._answers[nonce] = answer
            while len(self._answers) > _KEPT_ANSWERS:
                self._answers.popitem(last=False)
        return False, {EXTENSION_KEY: answer}

    # ------------------------------------------------------------------ worker side: inert
    # The connector moves no KV: the worker-side hooks below are no-ops (pure, no state).
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def shutdown(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self._book is not None and self._book.holds:
            self._book.revoke_all("engine_shutdown")
