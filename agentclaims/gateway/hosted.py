"""OpenAI's prompt-cache parameters honoured as claims, for clients that send them unmodified.

A chat or text completion may carry ``prompt_cache_key`` and ``prompt_cache_retention`` (the
OpenAI SDK sends both; hosted OpenAI routes and keeps the prompt's cache by them). Here each
becomes a claim the engine decides, never a field dropped without a word:

* ``prompt_cache_key`` names the owner scope the prompt's prefix belongs to (a user, a
  conversation): the call claims its prompt (``@prompt``) ``expiring`` under that scope, and
  lets go of the key's previous claim with it (the new prompt starts with the old one), so a
  key holds one live claim, its latest prompt;
* ``prompt_cache_retention``: ``"in_memory"`` (the default) for ``IN_MEMORY_TTL_S``, ``"24h"``
  for a day, each capped by the tenant's ``max_ttl_s`` (and the engine's own maximum, which
  answers ``conditionally_accepted`` with the TTL it gives).

Bad values are refused as OpenAI refuses them: 400, naming the field, nothing changed. What
cannot be honoured is said, in the answer's ``agentclaims.prompt_cache`` object and its
``x-agentclaims-prompt-cache`` header: ``accepted``/``conditionally_accepted``, or
``refused`` with the reason (a retention without a key has no owner to hold it for).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentclaims.errors import UsageError
from agentclaims.gateway.tenants import Tenant

__all__ = ["HEADER", "IN_MEMORY_TTL_S", "PromptCache", "PromptCacheClaims"]

HEADER = "x-agentclaims-prompt-cache"
IN_MEMORY_TTL_S = 300.0
"""``"in_memory"``: OpenAI keeps such entries 5-10 minutes after their last use."""
RETENTION_TTL_S = {"in_memory": IN_MEMORY_TTL_S, "24h": 86_400.0}
MAX_KEY_CHARS = 512
KEYS_KEPT = 65_536
"""Keys whose latest claim the gateway remembers (the oldest forgotten first: its claim then
ends by its TTL)."""


@dataclass(frozen=True, slots=True)
class PromptCache:
    """A completion's prompt-cache parameters, checked."""

    key: str | None
    retention: str | None

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> PromptCache | None:
        """The parameters ``body`` carries (``None``: neither), or ``UsageError`` naming the
        bad one."""
        key, retention = body.get("prompt_cache_key"), body.get("prompt_cache_retention")
        if key is None and retention is None:
            return None
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS):
            raise UsageError(
                "prompt_cache_key",
                f"must be a non-empty string of at most {MAX_KEY_CHARS} characters, got {key!r}",
            )
        if retention is not None and retention not in RETENTION_TTL_S:
            raise UsageError(
                "prompt_cache_retention",
                f"must be one of {', '.join(repr(r) for r in RETENTION_TTL_S)}, got {retention!r}",
            )
        return cls(key, retention)

    def ttl_s(self, tenant: Tenant | None, engine_max_s: float | None = None) -> float:
        """The retention's TTL, capped by the tenant's ``max_ttl_s`` and the engine's longest
        TTL (``engine_max_s``, where the KV side says it)."""
        ttl = RETENTION_TTL_S[self.retention or "in_memory"]
        for cap in (None if tenant is None else tenant.max_ttl_s, engine_max_s):
            if cap is not None and cap > 0:
                ttl = min(ttl, cap)
        return ttl


class PromptCacheClaims:
    """Each key's latest claim (``KEYS_KEPT`` keys, per tenant), and the claim a keyed call
    makes."""

    def __init__(self) -> None:
        self._latest: OrderedDict[tuple[str | None, str], str] = OrderedDict()

    def plan(
        self, cache: PromptCache, tenant: Tenant | None, engine_max_s: float | None = None
    ) -> tuple[dict[str, Any], str | None] | None:
        """The claim dict a call with ``cache`` carries and the key's previous claim it lets
        go of; ``None`` when no claim can be made (no key)."""
        if cache.key is None:
            return None
        claim = {
            "claim_id": f"pck-{uuid.uuid4().hex[:16]}",
            "object_id": "@prompt",
            "owner_scope": cache.key,
            "protection_mode": "expiring",
            "ttl_s": cache.ttl_s(tenant, engine_max_s),
        }
        return claim, self._latest.get((_name(tenant), cache.key))

    def decided(
        self, cache: PromptCache, tenant: Tenant | None, claim_id: str, accepted: bool
    ) -> None:
        """The call's claim was decided: the key's latest claim from now on (or none)."""
        assert cache.key is not None
        slot = (_name(tenant), cache.key)
        if accepted:
            self._latest[slot] = claim_id
            self._latest.move_to_end(slot)
            while len(self._latest) > KEYS_KEPT:
                self._latest.popitem(last=False)
        else:
            self._latest.pop(slot, None)


def outcome(
    cache: PromptCache,
    claim_id: str | None,
    decisions: Sequence[Mapping[str, Any]],
    ttl_s: float | None = None,
) -> dict[str, Any]:
    """What became of the call's prompt-cache parameters (the answer's ``prompt_cache``)."""
    if claim_id is None:
        return {
            "decision": "refused",
            "reason": "prompt_cache_retention without a prompt_cache_key: no owner to hold it for",
        }
    decision = next((d for d in decisions if d.get("claim_id") == claim_id), None)
    if decision is None:
        return {"claim_id": claim_id, "decision": "refused", "reason": "no decision came back"}
    out = {"claim_id": claim_id, "owner_scope": cache.key, "decision": decision["decision"]}
    if ttl_s is not None:
        out["ttl_s"] = ttl_s  # the retention's, capped by the tenant's and the engine's
    if decision["decision"] == "rejected":
        out["decision"] = "refused"
        out["reason"] = decision.get("reason") or "refused"
    if decision.get("conditions"):
        out["conditions"] = decision["conditions"]
    return out


def header_value(report: Mapping[str, Any]) -> str:
    """``report`` as the ``x-agentclaims-prompt-cache`` header: the decision, and why not."""
    reason = report.get("reason")
    text = str(report["decision"]) + (f"; {reason}" if reason else "")
    return text.encode("ascii", "replace").decode()[:300]


def _name(tenant: Tenant | None) -> str | None:
    return None if tenant is None else tenant.name
