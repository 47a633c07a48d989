"""Claim operations are accepted only when signed with the key given to the connector.

Any client of a vLLM server can send ``kv_transfer_params``; the gateway strips what clients
sent and signs its own. The signature is HMAC-SHA256 over the canonical JSON of the envelope
without ``sig``; a nonce seen before is refused (no replays).
"""

from __future__ import annotations

import hmac
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

__all__ = ["NonceWindow", "canonical", "sign", "verify"]


def canonical(envelope: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the envelope without ``sig``, keys sorted, no spaces."""
    body = {k: v for k, v in envelope.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(envelope: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``envelope`` with its ``sig``."""
    return {**envelope, "sig": hmac.digest(key.encode(), canonical(envelope), "sha256").hex()}


def verify(envelope: Mapping[str, Any], key: str) -> bool:
    """Whether ``envelope`` carries a valid signature under ``key`` (constant time)."""
    sig = envelope.get("sig")
    if not isinstance(sig, str) or not key:
        return False
    want = hmac.digest(key.encode(), canonical(envelope), "sha256").hex()
    return hmac.compare_digest(sig, want)


class NonceWindow:
    """The last ``size`` nonces seen; ``fresh(n)`` is False for a nonce seen before."""

    def __init__(self, size: int = 65_536) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def fresh(self, nonce: object) -> bool:
        if not isinstance(nonce, str) or not nonce or nonce in self._seen:
            return False
        self._seen[nonce] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return True
