"""``EngineLiveness``: whether vLLM's engine is known dead, why, and when it answers again.

The gateway learns that the engine died from vLLM's own answers (a 500 naming
``EngineDeadError``, a refused connection, ``/health`` 503); ``agentclaims vllm serve`` names
the signal in its state file beside the KV events endpoint. While dead, every request answers
503 with that reason; ``/health`` is asked again at most once a second, and a 200 means a vLLM
is back (a restart: nothing of the old one's claims survives).
"""

from __future__ import annotations

import contextlib
import logging
import time

from agentclaims.contract import BACKEND_RESTART
from agentclaims.errors import BackendUnavailable, ServiceUnavailable
from agentclaims.vllm.upstream import Upstream

__all__ = ["EngineLiveness"]

log = logging.getLogger("agentclaims.vllm")

PROBE_EVERY_S = 1.0
"""How often a dead engine's ``/health`` is asked again, at most."""


class EngineLiveness:
    """The engine behind ``http``: alive, or dead since ``dead`` (how the gateway knows)."""

    def __init__(self, http: Upstream, kv_events: str | None) -> None:
        self._http = http
        self._kv_events = kv_events
        self.dead: str | None = None
        self._probed_at = 0.0

    def died(self, seen: str) -> str:
        """The engine is dead (``seen``: how the gateway knows); the reason, as errors say it."""
        self.dead = seen
        self._probed_at = time.monotonic()
        return self.reason()

    def reason(self) -> str:
        """Why the engine is dead, with the signal where ``agentclaims vllm serve`` named it."""
        reason = f"vLLM's engine is dead ({self.dead})"
        if self._kv_events is not None:
            from agentclaims.vllm.supervise import read_state

            state = read_state(self._kv_events) or {}
            if state.get("state") == "dead" and state.get("reason"):
                reason += f": {state['reason']}"
        return reason

    def error(self) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"{self.reason()}; every claim held there has ended ({BACKEND_RESTART})"
        )

    async def revive(self) -> None:
        """While dead: ask ``/health`` (at most once a second); a 200 ends the death, else the
        503 error as before."""
        now = time.monotonic()
        if now - self._probed_at >= PROBE_EVERY_S:
            self._probed_at = now
            with contextlib.suppress(BackendUnavailable):
                status, _ = await self._http.request("GET", "/health", timeout_s=5.0)
                if status == 200 and self.dead is not None:
                    log.warning("agentclaims: vLLM at %s answers again", self._http.base_url)
                    self.dead = None
                    return
        raise self.error()
