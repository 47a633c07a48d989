"""The claim operations a gateway sends the connector, typed once for both sides: the gateway
(``agentclaims.vllm``) builds them, the connector parses them and answers each. On the wire an
operation is a JSON object whose ``op`` names it, inside a signed envelope
(``agentclaims_vllm.signing``)::

    {"op": "hold", "claim_id": "c1", "mode": "hard_protected", "blocks": 6, "ttl_s": 30}
    {"op": "release", "claim_id": "c0", "tenant": "acme"}
    {"op": "renew", "claim_id": "c2", "ttl_s": 9}
    {"op": "revoke_all", "reason": "gateway_restart"}
    {"op": "answer", "nonce": "..."}

``tenant`` (where an operation has one) overrides the envelope's: the gateway puts any
tenant's pending operation on whichever request goes to vLLM next. Stdlib only: this module
runs inside vLLM's environment too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

__all__ = [
    "EXTENSION_KEY",
    "Answer",
    "Hold",
    "MalformedOp",
    "Op",
    "Release",
    "Renew",
    "Reply",
    "RevokeAll",
    "parse",
    "to_wire",
]

EXTENSION_KEY = "agentclaims"
"""The key of the connector's envelope in ``kv_transfer_params``, and of its answer."""


class MalformedOp(ValueError):
    """An operation the connector cannot read: ``kind`` (its ``op``, if any) and the reason."""

    def __init__(self, kind: Any, reason: str, claim_id: Any = None) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.claim_id = claim_id


@dataclass(frozen=True, slots=True)
class Hold:
    """Hold the leading full blocks the request leaves cached when it finishes: ``blocks`` of
    them, or ``"all"`` (its prompt's and its reply's)."""

    claim_id: str
    mode: str
    blocks: int | Literal["all"] | None = None
    ttl_s: float | None = None
    next_use_s: float | None = None
    """Predicted seconds to the prefix's next use: soft holds are shed farthest first."""
    tenant: str | None = None
    op: ClassVar[str] = "hold"


@dataclass(frozen=True, slots=True)
class Release:
    claim_id: str
    tenant: str | None = None
    evict_first: bool = False
    """Its agent is done: the blocks go to the head of the free queue (the next victims)."""
    op: ClassVar[str] = "release"


@dataclass(frozen=True, slots=True)
class Renew:
    claim_id: str
    ttl_s: float | None = None
    tenant: str | None = None
    op: ClassVar[str] = "renew"


@dataclass(frozen=True, slots=True)
class RevokeAll:
    """End every hold (a gateway starting without a record of them)."""

    reason: str = "gateway_restart"
    op: ClassVar[str] = "revoke_all"


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer of the finished request whose envelope had this nonce (the channel's)."""

    nonce: str
    op: ClassVar[str] = "answer"


Op = Hold | Release | Renew | RevokeAll | Answer
_KINDS: dict[str, type[Op]] = {k.op: k for k in (Hold, Release, Renew, RevokeAll, Answer)}


def to_wire(op: Op) -> dict[str, Any]:
    """``op`` as its JSON object (fields left ``None`` or ``False`` are left out)."""
    out: dict[str, Any] = {"op": op.op}
    for name in op.__slots__:
        value = getattr(op, name)
        if value is not None and value is not False:
            out[name] = value
    return out


def _tenant(raw: dict[str, Any], kind: Any) -> str | None:
    value = raw.get("tenant")
    if value is not None and (not isinstance(value, str) or not value):
        raise MalformedOp(kind, f"tenant must be a non-empty string, got {value!r}")
    return value


def parse(raw: object) -> Op:
    """The operation ``raw`` (a JSON object) is; ``MalformedOp`` naming what is wrong. Values
    the claim book judges (a mode it does not know, a TTL past its maximum) pass here."""
    if not isinstance(raw, dict):
        raise MalformedOp(None, f"an operation is a JSON object, got {raw!r}")
    kind = raw.get("op")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MalformedOp(kind, f"unknown operation {kind!r}")
    if cls is RevokeAll:
        return RevokeAll(str(raw.get("reason") or "gateway_restart"))
    if cls is Answer:
        return Answer(str(raw.get("nonce")))
    tenant = _tenant(raw, kind)
    if cls is Hold:
        claim_id = raw.get("claim_id")
        blocks = raw.get("blocks")
        if blocks not in (None, "all") and (
            isinstance(blocks, bool) or not isinstance(blocks, int)
        ):
            raise MalformedOp(kind, f"blocks must be an integer or 'all', got {blocks!r}", claim_id)
        return Hold(
            str(claim_id or ""),
            str(raw.get("mode")),
            blocks,
            raw.get("ttl_s"),
            raw.get("next_use_s"),
            tenant,
        )
    claim_id = str(raw.get("claim_id"))
    if cls is Renew:
        return Renew(claim_id, raw.get("ttl_s"), tenant)
    evict_first = raw.get("evict_first", False)
    if not isinstance(evict_first, bool):
        raise MalformedOp(kind, f"evict_first must be true or false, got {evict_first!r}", claim_id)
    return Release(claim_id, tenant, evict_first)


@dataclass(frozen=True, slots=True)
class Reply:
    """The connector's answer to an envelope, typed once for both sides: it writes it
    (``to_wire``, into the response's ``kv_transfer_params``), the gateway reads it
    (``from_wire``; a field of the wrong type is absent, never a crash)."""

    results: tuple[dict[str, Any], ...] = ()
    """Each operation's result and each hold's decision, in order."""
    events: tuple[dict[str, Any], ...] = ()
    """The claim events after the envelope's ``since`` (at most a page)."""
    last_seq: int = 0
    held_blocks: int = 0
    """Distinct blocks live claims hold (not demoted claims' heads)."""
    cap_blocks: int | None = None
    """What hard holds may take (one max-length request must always fit)."""
    soft_cap_blocks: int | None = None
    """What all holds may take (soft ones are shed for work)."""
    max_ttl_s: float | None = None
    max_defer_s: float | None = None
    instance: str | None = None
    channel: str | None = None
    """The connector's local channel (``channel.py``), where it opened one."""
    pool: dict[str, Any] | None = None
    """The pool's churn from vLLM's KV events (``churn.PoolChurn.figures``)."""
    deferred_s: float | None = None
    """Seconds held claims kept the request waiting before it ran."""
    refused: dict[str, Any] | None = None
    """The refusal of a request held claims kept from running (its outcome's fields)."""
    scheduling: str | None = None
    """vLLM's scheduling policy (``--scheduling-policy``): ``"priority"`` where it orders its
    waiting queue by a request's ``priority``, ``"fcfs"`` where it ignores it."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON object (fields left ``None`` are left out)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_wire(cls, raw: object) -> Reply:
        """The reply ``raw`` is; a field of the wrong type reads as absent."""
        if not isinstance(raw, dict):
            return cls()

        def of(name: str, *types: type) -> Any:
            value = raw.get(name)
            ok = isinstance(value, types) and not isinstance(value, bool)
            return value if ok else None

        def objects(name: str) -> tuple[dict[str, Any], ...]:
            value = raw.get(name)
            items = value if isinstance(value, list) else ()
            return tuple(item for item in items if isinstance(item, dict))

        return cls(
            results=objects("results"),
            events=objects("events"),
            last_seq=of("last_seq", int) or 0,
            held_blocks=of("held_blocks", int) or 0,
            cap_blocks=of("cap_blocks", int),
            soft_cap_blocks=of("soft_cap_blocks", int),
            max_ttl_s=of("max_ttl_s", int, float),
            max_defer_s=of("max_defer_s", int, float),
            instance=of("instance", str),
            channel=of("channel", str),
            pool=of("pool", dict),
            deferred_s=of("deferred_s", int, float),
            refused=of("refused", dict),
            scheduling=of("scheduling", str),
        )
