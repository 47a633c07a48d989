"""Claim specifications and cache identity: plain typed data, validated on construction."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, ClassVar, Protocol, TypeVar, cast

from agentclaims.contract.hints import ReuseHint
from agentclaims.contract.names import ProtectionMode
from agentclaims.contract.predicates import (
    ContiguousRange,
    LeadingPrefixAtLeast,
    MaterializationPredicate,
    PredicateOnWire,
)
from agentclaims.contract.wire import Wire
from agentclaims.errors import ScopeViolation, UnknownClaim, UnknownNameError, UsageError

__all__ = ["CacheIdentity", "ClaimSpec", "owned_claim", "parse_mode"]


def parse_mode(value: ProtectionMode | str, field_name: str = "protection_mode") -> ProtectionMode:
    """Turn a mode name into a ``ProtectionMode``; unknown names raise ``UnknownNameError``."""
    if isinstance(value, ProtectionMode):
        return value
    try:
        return ProtectionMode(value)
    except ValueError:
        raise UnknownNameError(field_name, value, [m.value for m in ProtectionMode]) from None


def _nonempty(field_name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(field_name, f"must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class CacheIdentity(Wire):
    """What makes two blocks interchangeable: same domain, model, tokenizer, salt, block size."""

    cache_key_domain: str
    model_id: str
    tokenizer_id: str
    salt_namespace: str
    block_size: int
    adapter_id: str | None = None

    wire_name: ClassVar[str] = "cache_identity"
    wire_prefix: ClassVar[str] = "cache_identity"
    wire_omit_none: ClassVar[tuple[str, ...]] = ("adapter_id",)

    def __post_init__(self) -> None:
        for name in ("cache_key_domain", "model_id", "tokenizer_id", "salt_namespace"):
            _nonempty(f"cache_identity.{name}", getattr(self, name))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise UsageError(
                "cache_identity.block_size", f"expected an integer, got {self.block_size!r}"
            )
        if self.block_size <= 0:
            raise UsageError(
                "cache_identity.block_size", f"must be positive, got {self.block_size}"
            )
        if self.adapter_id is not None:
            _nonempty("cache_identity.adapter_id", self.adapter_id)


@dataclass(frozen=True, slots=True)
class ClaimSpec(Wire):
    """A request to keep a prefix resident: what, for whom, how strongly and for how long.

    ``object_id`` is the claimed prefix (a ``prefix_id``). ``footprint_blocks`` is its length in
    blocks; the predicate must fit inside it. ``duration_steps`` counts engine steps and
    ``ttl_s`` wall-clock seconds on the engine's clock; ``expiring`` claims need one of them,
    other modes may carry them too (the claim then expires when the first one ends).
    """

    claim_id: str
    owner_scope: str
    object_id: str
    cache_identity: CacheIdentity
    footprint_blocks: int
    protection_mode: ProtectionMode
    materialization_predicate: Annotated[MaterializationPredicate, PredicateOnWire] = field(
        default=None  # type: ignore[assignment]
    )
    duration_steps: int | None = None
    ttl_s: float | None = None
    reuse_hint: ReuseHint | None = None
    """What the agent knows about the prefix's next use (``agentclaims.contract.hints``)."""

    wire_name: ClassVar[str] = "claim"
    wire_omit_none: ClassVar[tuple[str, ...]] = ("reuse_hint",)

    def __post_init__(self) -> None:
        _nonempty("claim_id", self.claim_id)
        _nonempty("owner_scope", self.owner_scope)
        _nonempty("object_id", self.object_id)
        if not isinstance(self.cache_identity, CacheIdentity):
            raise UsageError(
                "cache_identity", f"expected a CacheIdentity, got {self.cache_identity!r}"
            )
        fp = self.footprint_blocks
        if isinstance(fp, bool) or not isinstance(fp, int):
            raise UsageError("footprint_blocks", f"expected an integer, got {fp!r}")
        if fp <= 0:
            raise UsageError("footprint_blocks", f"must be positive, got {fp}")
        object.__setattr__(self, "protection_mode", parse_mode(self.protection_mode))
        pred = cast("MaterializationPredicate | None", self.materialization_predicate)
        if pred is None:
            pred = LeadingPrefixAtLeast(fp)
            object.__setattr__(self, "materialization_predicate", pred)
        if not isinstance(pred, LeadingPrefixAtLeast | ContiguousRange):
            raise UsageError("materialization_predicate", f"not a predicate: {pred!r}")
        if pred.span > fp:
            raise UsageError(
                "materialization_predicate",
                f"covers positions up to {pred.span - 1} but footprint_blocks is {fp}",
            )
        if self.duration_steps is not None:
            d = self.duration_steps
            if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
                raise UsageError("duration_steps", f"must be a positive integer, got {d!r}")
        if self.ttl_s is not None:
            t = self.ttl_s
            if (
                isinstance(t, bool)
                or not isinstance(t, int | float)
                or not math.isfinite(t)
                or t <= 0
            ):
                raise UsageError("ttl_s", f"must be a positive number of seconds, got {t!r}")
        if self.reuse_hint is not None and not isinstance(self.reuse_hint, ReuseHint):
            raise UsageError("reuse_hint", f"expected a ReuseHint, got {self.reuse_hint!r}")
        if (
            self.protection_mode is ProtectionMode.EXPIRING
            and self.duration_steps is None
            and self.ttl_s is None
        ):
            raise UsageError("duration_steps", "an expiring claim needs duration_steps or ttl_s")

    def with_mode(self, mode: ProtectionMode | str) -> ClaimSpec:
        return replace(self, protection_mode=parse_mode(mode))


class _HasSpec(Protocol):
    @property
    def spec(self) -> ClaimSpec: ...


C = TypeVar("C", bound=_HasSpec)


def owned_claim(claims: Mapping[str, C], claim_id: str, owner_scope: str) -> C:
    """The claim ``claim_id`` of ``owner_scope``: ``UnknownClaim`` if there is none,
    ``ScopeViolation`` if it is another owner's (the contract's scope rule, for every
    backend's claim table)."""
    claim = claims.get(claim_id)
    if claim is None:
        raise UnknownClaim(claim_id)
    if claim.spec.owner_scope != owner_scope:
        raise ScopeViolation(claim_id, owner_scope)
    return claim
