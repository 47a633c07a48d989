"""``BackendFacts``: what a session reads once from each backend's descriptor.

Its cache identity, the checker's verdict on its lowering per mode
(``agentclaims.lowering.trusted_modes``), and the capabilities it states: ``ranks_by_hints``,
``claims_ride_on_requests``, ``sheds_by_hints``, ``events_ride_on_answers``. Read again only
after ``forget`` (the backend now reaches another instance).

A backend keeps the descriptor it read and hands every session the same object: the facts
made of it are made once per process (``_MADE``), not once per session. A process that runs
a session per task would otherwise check the lowering again for each, on its first call:
about a tenth of a millisecond warm, about 1.3 ms where an agent loop runs it
(benchmarks/results/2026-12-07-sdk-facts-once.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from agentclaims.contract import CacheIdentity, ProtectionMode
from agentclaims.errors import BackendError, UsageError
from agentclaims.lowering import MappingResult, trusted_modes
from agentclaims.protocol import (
    claims_ride_on_requests,
    events_ride_on_answers,
    ranks_by_hints,
    sheds_by_hints,
)

if TYPE_CHECKING:
    from agentclaims.protocol import ClaimsProtocol

__all__ = ["BackendFacts", "Facts"]


class Facts(NamedTuple):
    """One backend's descriptor, as the session uses it."""

    identity: CacheIdentity
    lowering: dict[ProtectionMode, MappingResult]
    ranks_by_hints: bool
    rides: bool
    sheds_by_hints: bool
    events_ride: bool = False
    """Its calls' answers carry the session's events (``events_ride_on_answers``)."""


class BackendFacts:
    """Per backend name, its ``Facts``, read from its descriptor once."""

    def __init__(self) -> None:
        self._facts: dict[str, Facts] = {}

    async def of(self, backend: ClaimsProtocol) -> Facts:
        """``backend``'s facts, from its descriptor, read once (and its lowering checked
        again: ``agentclaims.lowering.trusted_modes``)."""
        facts = self._facts.get(backend.name)
        if facts is None:
            facts = _made_of(backend.name, await backend.descriptor())
            self._facts[backend.name] = facts
        return facts

    def forget(self, backend_name: str) -> None:
        """Read ``backend_name``'s descriptor again next time (it now reaches another
        instance)."""
        self._facts.pop(backend_name, None)

    async def identity(self, backend: ClaimsProtocol) -> CacheIdentity:
        """The cache identity of ``backend``'s claims (read once)."""
        return (await self.of(backend)).identity

    async def lowering(self, backend: ClaimsProtocol) -> dict[ProtectionMode, MappingResult]:
        """Per mode, the checker's verdict on ``backend``'s lowering (read once)."""
        return (await self.of(backend)).lowering

    async def ranks_by_hints(self, backend: ClaimsProtocol) -> bool:
        """Whether ``backend``'s descriptor states ``ranks_by_hints`` (read once)."""
        return (await self.of(backend)).ranks_by_hints

    async def rides(self, backend: ClaimsProtocol) -> bool:
        """Whether ``backend``'s descriptor states ``claims_ride_on_requests`` (read once)."""
        return (await self.of(backend)).rides

    async def events_ride(self, backend: ClaimsProtocol) -> bool:
        """Whether ``backend``'s answers carry the session's events (read once)."""
        return (await self.of(backend)).events_ride

    async def holds_by_hints(self, backend: ClaimsProtocol) -> bool:
        """Whether ``backend`` sheds holds by their hints (``sheds_by_hints``) and its claims
        ride on its requests: holding a prefix there costs no request (read once)."""
        facts = await self.of(backend)
        return facts.rides and facts.sheds_by_hints


_MADE: dict[int, tuple[Mapping[str, Any], Facts]] = {}
"""The facts made of the descriptors read lately, by the descriptor object's id (the object
kept with them: an id is not reused while its object lives); emptied when it has
``_MADE_MOST`` (a process sees a few descriptors: one per backend, and one more per instance
a fleet moves to)."""
_MADE_MOST = 64


def _made_of(name: str, desc: Mapping[str, Any]) -> Facts:
    """The facts of ``desc`` (backend ``name``'s descriptor): made once per descriptor object.
    A bad one is refused each time it is read (``BackendError``), never kept."""
    made = _MADE.get(id(desc))
    if made is not None and made[0] is desc:
        return made[1]
    try:
        ident = CacheIdentity.from_dict(desc.get("cache_identity"))
    except UsageError as exc:
        raise BackendError(f"backend {name!r}: bad descriptor: {exc}") from exc
    facts = Facts(
        ident,
        trusted_modes(desc),
        ranks_by_hints(desc),
        claims_ride_on_requests(desc),
        sheds_by_hints(desc),
        events_ride_on_answers(desc),
    )
    if len(_MADE) >= _MADE_MOST:
        _MADE.clear()
    _MADE[id(desc)] = (desc, facts)
    return facts
