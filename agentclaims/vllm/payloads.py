"""How the vLLM side's requests and answers translate: the client's body as it goes to vLLM,
vLLM's answer as the client gets it, the tokens of what a request leaves cached, and a claim
as the connector's ``hold`` operation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentclaims_vllm.ops import Hold

from agentclaims.contract import ClaimSpec
from agentclaims.engine.blocks import TOKEN_BYTES, pack_tokens

__all__ = ["KINDS", "client_payload", "forwarded", "hold_op", "packed_sequence", "prompt_ids"]

KINDS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
"""vLLM's endpoint of each completion kind."""

_NEVER_S = 1e9
"""``next_use_s`` of a closed agent's hold (finite: the op travels as JSON)."""


def prompt_ids(data: Mapping[str, Any]) -> list[int] | None:
    """The prompt's token ids in a vLLM answer asked for them (``return_token_ids``)."""
    ids = data.get("prompt_token_ids")
    if ids is None:
        ids = (data.get("choices") or [{}])[0].get("prompt_token_ids")
    if isinstance(ids, list) and set(map(type, ids)) <= {int}:  # one pass, in C
        return ids
    return None


def packed_sequence(data: Mapping[str, Any], prompt: bytes | None, block_size: int) -> bytes | None:
    """The full blocks of prompt + reply that vLLM computed (so cached), packed as the prompt
    is (``pack_tokens``): the reply's last token never had its KV computed, so it ends no
    block. ``None`` without the reply's ids."""
    reply = (data.get("choices") or [{}])[0].get("token_ids")
    if prompt is None or not isinstance(reply, list) or not set(map(type, reply)) <= {int}:
        return None
    tokens = prompt + pack_tokens(reply)
    full = (len(tokens) // TOKEN_BYTES - 1) // block_size * block_size * TOKEN_BYTES
    return tokens[:full] if full > 0 else None


def forwarded(body: Mapping[str, Any], model: str, priority: int | None = None) -> dict[str, Any]:
    """The client's body as it goes to vLLM: never a client's ``kv_transfer_params`` (the
    gateway signs its own), the ``agentclaims`` object, its ``cache_salt`` (the tenant's is
    set instead) or its ``priority`` (its place in vLLM's queue is the gateway's to give:
    ``priority``, ``agentclaims.gateway.queueing``); the model is vLLM's own."""
    out = dict(body)
    for key in ("kv_transfer_params", "agentclaims", "cache_salt", "priority"):
        out.pop(key, None)
    out["model"] = model
    if priority is not None:
        out["priority"] = priority
    return out


def client_payload(data: Mapping[str, Any], *, keep_token_ids: bool) -> dict[str, Any]:
    """The answer as the client sees it: never the connector's receipt; token ids only when
    the client asked for them."""
    out = dict(data)
    out.pop("kv_transfer_params", None)
    if not keep_token_ids:
        out.pop("prompt_token_ids", None)
        choices = []
        for choice in out.get("choices") or ():
            choice = dict(choice)
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
            choices.append(choice)
        out["choices"] = choices
    return out


def hold_op(spec: ClaimSpec, *, all_blocks: bool = False) -> Hold:
    """The connector's ``hold``; ``all_blocks``: every full block the request leaves
    cached, its reply's included (``@sequence``: known only when it finishes)."""
    hint = spec.reuse_hint
    next_use = None
    if hint is not None and (hint.expected_s is not None or hint.closed):
        # the connector sheds soft holds farthest expected next use first
        next_use = _NEVER_S if hint.closed else hint.expected_s
    return Hold(
        spec.claim_id,
        spec.protection_mode.value,
        "all" if all_blocks else spec.footprint_blocks,
        spec.ttl_s,
        next_use,
    )
