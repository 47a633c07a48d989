"""``SessionRoute``: where one session's calls and claims go, decided in one place.

A session has one backend, or a member of a ``BackendPool`` chosen by affinity (moved by a
reroute on refusal, or to the member that accepts a claim before a tool call), or a routing key
of a ``FleetBackend`` behind a router (moved by a failover when its instance stops answering, or
by the router itself); a pool member that stops answering is failed over the same way, to a
member that answers. The transport, the tool holds and the session's reactions ask the route,
never the pool: which backend now, which one a claim was made on, where to go next, and what the
first call after a move says about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentclaims.contract import PrefixId
from agentclaims.protocol import ClaimsProtocol

if TYPE_CHECKING:
    from agentclaims.backends.base import Backend
    from agentclaims.backends.fleet import FleetBackend
    from agentclaims.backends.pool import BackendPool

__all__ = ["SessionRoute"]


class SessionRoute:
    """The backend of session ``session_id``: ``backend`` (fixed) or a pool's choice."""

    def __init__(self, session_id: str, pool: BackendPool | None, backend: Backend | None) -> None:
        self.session_id = session_id
        self.pool = pool
        self._backend = backend
        self.moved: str | None = None
        """``reroute`` or ``failover`` until the next call has said so (``hop_fields``)."""
        self._failovers = 0
        """Pool members this session left because they stopped answering."""

    @property
    def backend(self) -> Backend:
        """Where the session's calls go now (fixed, or the pool's affinity choice)."""
        if self._backend is None:
            assert self.pool is not None  # a route has one or the other
            self._backend = self.pool.assign(self.session_id)
        return self._backend

    def backends(self) -> list[ClaimsProtocol]:
        """Every backend the session may have claims on."""
        return list(self.pool.backends) if self.pool is not None else [self.backend]

    def named(self, name: str) -> Backend:
        """The backend a claim was made on (by its name)."""
        return self.pool.get(name) if self.pool is not None else self.backend

    # ------------------------------------------------------------------ the pool's view
    async def admit(self) -> None:
        """Wait for the pool's admission window (a session entering)."""
        if self.pool is not None:
            await self.pool.admit(self.session_id)

    def leave(self) -> None:
        """The session ended: its affinity no longer counts as load."""
        if self.pool is not None:
            self.pool.release(self.session_id)

    def observe_call(self, *, prompt_tokens: int, cached_tokens: int, pressed: bool) -> None:
        if self.pool is not None:
            self.pool.observe_call(
                prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, pressed=pressed
            )

    def observe_harm(self) -> None:
        if self.pool is not None:
            self.pool.observe_harm()

    # ------------------------------------------------------------------ moves
    async def reroute(self, prefixes: Sequence[PrefixId]) -> Backend | None:
        """Another pool member (``prefixes`` resident there first), now the session's; ``None``
        without a pool or another member."""
        if self.pool is None:
            return None
        new = await self.pool.reroute(self.session_id, list(prefixes))
        if new is not None:
            self._backend, self.moved = new, "reroute"
        return new

    async def candidates(self, prefixes: Sequence[PrefixId]) -> list[Backend]:
        """Pool members to try a claim on, best first (none without a pool)."""
        if self.pool is None:
            return []
        return list(await self.pool.candidates(self.session_id, list(prefixes)))

    def move_to(self, name: str) -> Backend:
        """The session moves to the pool member ``name`` (it accepted a claim there)."""
        assert self.pool is not None  # candidates come from the pool
        self._backend = self.pool.move(self.session_id, name)
        return self._backend

    def fleet(self) -> FleetBackend | None:
        from agentclaims.backends.fleet import FleetBackend

        return self.pool if isinstance(self.pool, FleetBackend) else None

    async def failover(self) -> tuple[str | None, Backend] | None:
        """The session's backend stopped answering. Behind a router: the instance serving the
        session (gone) and the backend under a new routing key, ``None`` once out of hops. In a
        ``BackendPool``: the member (gone) and another member that answers (the pool's
        choice), at most once per member a session; ``None`` when none answers. ``None``
        with a backend of its own."""
        fleet = self.fleet()
        if fleet is None:
            return await self._leave_member()
        instance = fleet.instance_of(self.session_id)
        new = await fleet.reroute(self.session_id, failover=True)
        if new is None:
            return None
        self._backend, self.moved = new, "failover"
        return instance, new

    async def _leave_member(self) -> tuple[str, Backend] | None:
        """A pool member that stopped answering left for another that answers."""
        pool = self.pool
        if pool is None or self._failovers >= len(pool.backends):
            return None
        gone = self.backend.name
        new = await pool.reroute(self.session_id)  # never a member that does not answer
        if new is None:
            return None
        self._failovers += 1
        self._backend, self.moved = new, "failover"
        return gone, new

    def lost_on(self, instance: str | None) -> set[str]:
        """The claim ids the fleet says the session had on ``instance``, now gone (it forgets
        them); none without a fleet (a pool member's are the claims made on it, by name)."""
        fleet = self.fleet()
        if fleet is None or instance is None:
            return set()
        return set(fleet.lose_instance(instance))

    def take_move(self) -> tuple[str | None, str | None] | None:
        """Behind a router: the move the router itself made (old and new instance), once."""
        take = getattr(self.backend, "take_move", None)
        if not callable(take):
            return None
        move = take()
        if move is None:
            return None
        old, new = move
        self.moved = "failover"
        return old, new

    def hop_fields(self) -> dict[str, object]:
        """On the first call after a reroute or failover: which (its prefix is computed again
        on the new instance); behind a router, the instance that answered."""
        out: dict[str, object] = {}
        instance = getattr(self.backend, "instance", None)
        if isinstance(instance, str):
            out["instance"] = instance
        if self.moved is not None:
            out["after"], self.moved = self.moved, None
        return out
