"""A pool of backends with session affinity and reroute on refusal.

Claims are per-instance resources: a session sticks to one backend (affinity) so its claims and
its prefixes live in one place. On a refusal the session may be rerouted to another member,
preferably one where its prefix is already resident.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentclaims.backends.base import Backend
from agentclaims.errors import UsageError

__all__ = ["BackendPool"]


class BackendPool:
    """Several backends behind one name; ``assign`` keeps a session on one member."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        members = list(backends)
        if not members:
            raise UsageError("backends", "a pool needs at least one backend")
        names = [b.name for b in members]
        if len(set(names)) != len(names):
            raise UsageError("backends", f"backend names must be unique, got {names}")
        self.backends = members
        self._by_name = {b.name: b for b in members}
        self._affinity: dict[str, str] = {}
        self._load: dict[str, int] = dict.fromkeys(names, 0)

    @property
    def name(self) -> str:
        return "pool(" + ",".join(self._by_name) + ")"

    def get(self, name: str) -> Backend:
        try:
            return self._by_name[name]
        except KeyError:
            raise UsageError("backend", f"no backend {name!r} in {self.name}") from None

    def assign(self, session_id: str) -> Backend:
        """The session's backend: its affinity if it has one, else the least loaded member."""
        name = self._affinity.get(session_id)
        if name is None:
            name = min(self._load, key=lambda n: (self._load[n], n))
            self._affinity[session_id] = name
            self._load[name] += 1
        return self._by_name[name]

    async def reroute(self, session_id: str, prefix_ids: Sequence[str] = ()) -> Backend | None:
        """Move the session to another member (most of its prefix resident first, then least
        loaded); ``None`` when the pool has no other member."""
        current = self._affinity.get(session_id)
        others = [b for b in self.backends if b.name != current]
        if not others:
            return None
        scores: dict[str, int] = {}
        for backend in others:
            resident = await backend.residency(list(prefix_ids)) if prefix_ids else {}
            scores[backend.name] = sum(resident.values())
        best = max(others, key=lambda b: (scores[b.name], -self._load[b.name], b.name))
        if current is not None:
            self._load[current] -= 1
        self._affinity[session_id] = best.name
        self._load[best.name] += 1
        return best

    def release(self, session_id: str) -> None:
        """Forget a finished session's affinity."""
        name = self._affinity.pop(session_id, None)
        if name is not None:
            self._load[name] -= 1

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()
