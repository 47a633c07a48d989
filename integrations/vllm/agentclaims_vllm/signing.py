"""Claim operations are accepted only when signed with the key given to the connector.

Any client of a vLLM server can send ``kv_transfer_params``; the gateway strips what clients
sent and signs its own. The signature is HMAC-SHA256 over the canonical JSON of the envelope
without ``sig``. An envelope is accepted once, for one connector, while it is fresh
(``NonceWindow``): it names the connector ``instance`` it was signed for (once the gateway
knows it) and its issue time (``issued_ns``, wall clock), so a captured envelope replays
neither after a restart (another instance; issued before it started) nor after its nonce
was forgotten (stale).
"""

from __future__ import annotations

import hmac
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
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
    """Which envelopes are fresh: each nonce accepted once, and only from an envelope issued
    after this window began (the connector's start), within ``max_age_s`` of now either way.

    A nonce is remembered until its envelope is stale, so every fresh envelope is checked
    against every nonce it could repeat. At most ``size`` are kept: when one is forgotten
    early, the floor moves up to its issue time, and anything issued at or before it is
    stale from then on (refused, never accepted twice). ``now``: the clock, in ns."""

    def __init__(
        self,
        size: int = 65_536,
        *,
        max_age_s: float = 60.0,
        now: Callable[[], int] = time.time_ns,
    ) -> None:
        if size < 1 or not max_age_s > 0:
            raise ValueError("a nonce window needs size >= 1 and max_age_s > 0")
        self._seen: OrderedDict[str, int] = OrderedDict()  # nonce -> issue time, in arrival
        self._size = size
        self._max_age_ns = int(max_age_s * 1e9)
        self._now = now
        self.floor_ns = now()
        """Envelopes issued at or before this are stale: the window's start, then the issue
        time of the newest nonce forgotten early."""

    def check(self, nonce: object, issued_ns: object) -> str | None:
        """Why the envelope with ``nonce`` issued at ``issued_ns`` is not fresh, or ``None``
        (it is then remembered: the same nonce is refused from now on)."""
        if not isinstance(nonce, str) or not nonce:
            return "no nonce"
        if isinstance(issued_ns, bool) or not isinstance(issued_ns, int):
            return "no issue time (issued_ns)"
        now = self._now()
        self._forget_stale(now)
        if nonce in self._seen:
            return "replayed nonce"
        if issued_ns <= self.floor_ns:
            return "stale envelope: issued before this connector's window"
        if abs(now - issued_ns) > self._max_age_ns:
            return "stale envelope: issue time too far from now"
        self._seen[nonce] = issued_ns
        if len(self._seen) > self._size:
            _, forgotten = self._seen.popitem(last=False)
            self.floor_ns = max(self.floor_ns, forgotten)
        return None

    def _forget_stale(self, now: int) -> None:
        """Forget the oldest arrivals whose envelopes are stale by age (a replay carries the
        same signed issue time, so the age check refuses it without them)."""
        oldest = now - self._max_age_ns
        seen = self._seen
        while seen:
            nonce, issued = next(iter(seen.items()))
            if issued >= oldest:
                return
            del seen[nonce]
