"""``EmbeddedBackend``: the gateway app in-process, reached through an ASGI transport
(``InProcessGateway``), over the reference engine.

No socket and no server: the same HTTP client code as ``HTTPBackend``, the same app as
``agentclaims serve``. Text comes from a ``ScriptedModel``; KV behaviour is the reference
engine's (``.engine``, for tests and demos).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agentclaims.backends.inprocess import InProcessGateway, check_name
from agentclaims.engine import EvictionPolicy, KVEngine, ReferenceKV, ServiceTimes
from agentclaims.engine.kv import Sleep
from agentclaims.gateway import KVSide, Script, ScriptedModel

__all__ = ["EmbeddedBackend"]


class EmbeddedBackend(InProcessGateway):
    """A reference engine of ``num_blocks`` blocks of ``block_size`` tokens (or the given
    ``kv`` side) behind the gateway app, in this process. ``script`` drives the ``ScriptedModel``; ``clock`` (ns) and ``sleep``
    are injectable so tests never wait; ``service`` sets the modelled per-token times."""

    _HOST = "embedded"

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        script: Script | None = None,
        host_blocks: int = 0,
        owner_cap_blocks: int | None = None,
        protected_cap_blocks: int | None = None,
        eviction_policy: EvictionPolicy | None = None,
        clock: Callable[[], int] | None = None,
        sleep: Sleep = asyncio.sleep,
        service: ServiceTimes | None = None,
        name: str = "embedded",
        kv: KVSide | None = None,
    ) -> None:
        check_name(name)  # before the engine is built
        kv = kv or ReferenceKV.create(
            num_blocks,
            block_size,
            eviction_policy=eviction_policy,
            host_blocks=host_blocks,
            owner_cap_blocks=owner_cap_blocks,
            protected_cap_blocks=protected_cap_blocks,
            clock=clock,
            service=service,
            sleep=sleep,
        )
        self.model = ScriptedModel(script)
        super().__init__(kv, self.model, name=name, owns_kv=False)

    @property
    def engine(self) -> KVEngine:
        """The reference engine behind the gateway now (for tests and demos)."""
        engine: KVEngine = getattr(self.kv, "engine")  # noqa: B009 - any KV side may carry one
        return engine
