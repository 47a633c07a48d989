"""The claims a request carries, resolved and checked the same way on every KV side.

A claim sent with a request may name the request's own prompt (``@prompt``) or its prompt and
reply (``@sequence``); the side turns either into a prefix id and a block count. Every claim of
the request is checked before anything changes (fail closed): a claim id given twice in one
request, or already taken, an unknown prefix, a footprint that is not the prefix's, all raise
``UsageError`` naming ``agentclaims.claims[i].<field>``. A claim on a request too short to
have a full block is no error: the request is served and the claim refused (``NO_FULL_BLOCK``).

Cache-identity compatibility is decided here too: two blocks' KV is the same when block size,
model, tokenizer and adapter agree (the key domain and salt namespace need not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from agentclaims.contract import CacheIdentity, ClaimSpec, prefix_id_of
from agentclaims.contract.ids import BlockHash
from agentclaims.errors import UsageError
from agentclaims.protocol.types import PROMPT_OBJECT, SEQUENCE_OBJECT

__all__ = [
    "IDENTITY_MISMATCH",
    "NO_FULL_BLOCK",
    "Resolved",
    "claim_blocks",
    "identity_problem",
    "resolve_request_claims",
]

IDENTITY_MISMATCH = "cache_identity_mismatch"
"""The refusal reason of a claim whose cache identity names another engine's blocks."""


def identity_problem(claimed: CacheIdentity, mine: CacheIdentity) -> str | None:
    """``IDENTITY_MISMATCH`` when a claim's blocks cannot be this side's, else ``None``."""
    if (claimed.block_size, claimed.model_id, claimed.tokenizer_id, claimed.adapter_id) != (
        mine.block_size,
        mine.model_id,
        mine.tokenizer_id,
        mine.adapter_id,
    ):
        return IDENTITY_MISMATCH
    return None


NO_FULL_BLOCK = "the prefix has no full block to claim"
"""The refusal of a claim on ``@prompt`` or ``@sequence`` of a request shorter than a block:
the request is served, the claim refused (as the vLLM connector refuses such a hold)."""


class Resolved(NamedTuple):
    """One claim of a request: its spec and the blocks it covers, head first. ``blocks`` is
    empty for ``@sequence`` on a side that learns the reply's blocks when the request ends
    (its spec then keeps ``object_id="@sequence"`` and a provisional footprint), and for a
    claim the side refuses as it stands (``refusal``: why; a request that is too short)."""

    spec: ClaimSpec
    blocks: tuple[BlockHash, ...]
    refusal: str | None = None


PrefixLookup = Callable[[str], "Sequence[BlockHash] | None"]
"""The blocks of a prefix id the side knows, ``None`` if unknown (it may raise ``UsageError``
naming ``object_id`` to say why a side takes no such claim)."""


def resolve_request_claims(
    claims: Sequence[object],
    *,
    identity: CacheIdentity,
    owner_scope: str | None,
    prompt: Sequence[BlockHash],
    sequence: Sequence[BlockHash] | None,
    known: PrefixLookup,
    exists: Callable[[str], bool],
) -> list[Resolved]:
    """Each claim of ``claims`` (the request's ``agentclaims.claims``), checked.

    ``prompt`` and ``sequence`` are the request's full blocks (``sequence=None``: known only
    when it ends); ``known`` finds another prefix id's blocks; ``exists`` says whether a claim
    id is taken (by any owner). The claim's own fields win over the request's owner scope and
    the side's identity."""
    out: list[Resolved] = []
    for i, raw in enumerate(claims):
        where = f"agentclaims.claims[{i}]"
        if not isinstance(raw, Mapping):
            raise UsageError(where, f"expected a claim object, got {raw!r}")
        try:
            resolved = _one(raw, identity, owner_scope, prompt, sequence, known)
        except UsageError as exc:
            raise UsageError(f"{where}.{exc.field}", exc.message) from None
        spec = resolved.spec
        if any(spec.claim_id == seen.spec.claim_id for seen in out):
            raise UsageError(
                f"{where}.claim_id", f"claim {spec.claim_id!r} is given twice in this request"
            )
        if exists(spec.claim_id):
            raise UsageError(f"{where}.claim_id", f"claim {spec.claim_id!r} already exists")
        out.append(resolved)
    return out


def _one(
    raw: Mapping[str, Any],
    identity: CacheIdentity,
    owner_scope: str | None,
    prompt: Sequence[BlockHash],
    sequence: Sequence[BlockHash] | None,
    known: PrefixLookup,
) -> Resolved:
    data: dict[str, Any] = {"cache_identity": identity.to_dict()}
    if owner_scope is not None:
        data["owner_scope"] = owner_scope
    data.update(raw)
    oid = data.get("object_id")
    blocks: Sequence[BlockHash] | None
    if oid == SEQUENCE_OBJECT and sequence is None:
        if "footprint_blocks" in data:
            raise UsageError(
                "footprint_blocks",
                "@sequence holds every full block of prompt and reply: give none",
            )
        data["footprint_blocks"] = max(1, len(prompt))  # provisional: known when it ends
        return Resolved(ClaimSpec.from_dict(data), ())
    if oid in (PROMPT_OBJECT, SEQUENCE_OBJECT):
        blocks = prompt if oid == PROMPT_OBJECT else sequence
        if not blocks:  # served all the same; the claim is refused, as it stands
            data.setdefault("footprint_blocks", 1)
            return Resolved(ClaimSpec.from_dict(data), (), NO_FULL_BLOCK)
        data["object_id"] = prefix_id_of(blocks)
        data.setdefault("footprint_blocks", len(blocks))
    else:
        blocks = known(oid) if isinstance(oid, str) else None
    spec = ClaimSpec.from_dict(data)
    return Resolved(spec, claim_blocks(spec, blocks))


def claim_blocks(spec: ClaimSpec, blocks: Sequence[BlockHash] | None) -> tuple[BlockHash, ...]:
    """The blocks ``spec`` covers, checked: a prefix the side knows (``blocks``), of exactly
    the claim's footprint."""
    if blocks is None:
        raise UsageError("object_id", f"unknown prefix {spec.object_id!r}")
    if len(blocks) != spec.footprint_blocks:
        raise UsageError(
            "footprint_blocks",
            f"is {spec.footprint_blocks} but the prefix has {len(blocks)} blocks",
        )
    return tuple(blocks)
