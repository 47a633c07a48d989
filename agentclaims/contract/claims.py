"""Claim specifications and cache identity: plain typed data, validated on construction."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from agentclaims.contract.names import ProtectionMode
from agentclaims.contract.predicates import (
    ContiguousRange,
    LeadingPrefixAtLeast,
    MaterializationPredicate,
    predicate_from_dict,
)
from agentclaims.errors import UnknownNameError, UsageError

__all__ = ["CacheIdentity", "ClaimSpec", "parse_mode"]


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
class CacheIdentity:
    """What makes two blocks interchangeable: same domain, model, tokenizer, salt, block size."""

    cache_key_domain: str
    model_id: str
    tokenizer_id: str
    salt_namespace: str
    block_size: int
    adapter_id: str | None = None

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

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "cache_key_domain": self.cache_key_domain,
            "model_id": self.model_id,
            "tokenizer_id": self.tokenizer_id,
            "salt_namespace": self.salt_namespace,
            "block_size": self.block_size,
        }
        if self.adapter_id is not None:
            data["adapter_id"] = self.adapter_id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheIdentity:
        if not isinstance(data, Mapping):
            raise UsageError("cache_identity", f"expected an object, got {data!r}")
        known = {
            "cache_key_domain",
            "model_id",
            "tokenizer_id",
            "salt_namespace",
            "block_size",
            "adapter_id",
        }
        extra = set(data) - known
        if extra:
            raise UsageError("cache_identity", f"unknown fields {sorted(extra)}")
        try:
            return cls(**dict(data))
        except TypeError:
            missing = sorted(known - {"adapter_id"} - set(data))
            raise UsageError("cache_identity", f"missing fields {missing}") from None


@dataclass(frozen=True, slots=True)
class ClaimSpec:
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
    materialization_predicate: MaterializationPredicate = field(default=None)  # type: ignore[assignment]
    duration_steps: int | None = None
    ttl_s: float | None = None

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
        if (
            self.protection_mode is ProtectionMode.EXPIRING
            and self.duration_steps is None
            and self.ttl_s is None
        ):
            raise UsageError("duration_steps", "an expiring claim needs duration_steps or ttl_s")

    def with_mode(self, mode: ProtectionMode | str) -> ClaimSpec:
        return replace(self, protection_mode=parse_mode(mode))

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim_id": self.claim_id,
            "owner_scope": self.owner_scope,
            "object_id": self.object_id,
            "cache_identity": self.cache_identity.to_dict(),
            "footprint_blocks": self.footprint_blocks,
            "protection_mode": self.protection_mode.value,
            "materialization_predicate": self.materialization_predicate.to_dict(),
            "duration_steps": self.duration_steps,
            "ttl_s": self.ttl_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClaimSpec:
        """Parse the JSON form; every problem is a ``UsageError`` naming the field."""
        if not isinstance(data, Mapping):
            raise UsageError("claim", f"expected an object, got {data!r}")
        required = (
            "claim_id",
            "owner_scope",
            "object_id",
            "cache_identity",
            "footprint_blocks",
            "protection_mode",
        )
        for name in required:
            if name not in data:
                raise UsageError(name, "missing")
        known = {*required, "materialization_predicate", "duration_steps", "ttl_s"}
        extra = set(data) - known
        if extra:
            raise UsageError("claim", f"unknown fields {sorted(extra)}")
        pred = data.get("materialization_predicate")
        return cls(
            claim_id=data["claim_id"],
            owner_scope=data["owner_scope"],
            object_id=data["object_id"],
            cache_identity=CacheIdentity.from_dict(data["cache_identity"]),
            footprint_blocks=data["footprint_blocks"],
            protection_mode=parse_mode(data["protection_mode"]),
            materialization_predicate=None if pred is None else predicate_from_dict(pred),  # type: ignore[arg-type]
            duration_steps=data.get("duration_steps"),
            ttl_s=data.get("ttl_s"),
        )
