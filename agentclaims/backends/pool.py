"""A pool of backends with session affinity and reroute on refusal.

Claims are per-instance resources: a session sticks to one backend (affinity) so its claims and
its prefixes live in one place. On a refusal the session may be rerouted to another member,
preferably one where its prefix is already resident.

The pool speaks the claims protocol itself: a claim goes to its owner's member and every later
operation on it to the member that holds it; events of all members come as one stream whose
cursor is the pool's own (each event keeps its member's ``seq``).

With ``admission`` (an :class:`~agentclaims.backends.admission.AdmissionWindow`, off by
default) the pool also bounds how many sessions run at once: a session entering waits for a
slot (FIFO), its calls and harmed claims feed the window's AIMD controller, and its end frees
the slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from agentclaims.backends.admission import AdmissionWindow
from agentclaims.backends.base import Backend
from agentclaims.contract import (
    BlockHash,
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    PrefixId,
    ProtectionMode,
)
from agentclaims.errors import BackendUnavailable, UnknownClaim, UsageError
from agentclaims.protocol import (
    ClaimDecision,
    Descriptor,
    EventPage,
    ForwardsClaims,
    stated_class,
)

__all__ = ["BackendPool"]


class BackendPool(ForwardsClaims):
    """Several backends behind one name; ``assign`` keeps a session on one member."""

    admission: AdmissionWindow | None = None
    """The admission window sessions enter through (``None``: every session at once; a
    subclass that does not take one, such as ``FleetBackend``, admits every session)."""

    def __init__(
        self, backends: Sequence[Backend], *, admission: AdmissionWindow | None = None
    ) -> None:
        if admission is not None and not isinstance(admission, AdmissionWindow):
            raise UsageError("admission", f"expected an AdmissionWindow or None, got {admission!r}")
        members = _members(backends)
        names = [b.name for b in members]
        self._backends = members
        self._by_name = {b.name: b for b in members}
        self._affinity: dict[str, str] = {}
        self._load: dict[str, int] = dict.fromkeys(names, 0)
        self._home: dict[str, str] = {}  # claim id -> member holding it
        self._log: list[tuple[str, ClaimEvent]] = []  # the pool's merged event stream
        self._cursors: dict[str, int] = dict.fromkeys(names, 0)
        self.admission = admission

    @property
    def backends(self) -> list[Backend]:
        """The members, in the order given."""
        return list(self._backends)

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

    async def candidates(
        self, session_id: str, prefix_ids: Sequence[PrefixId] = ()
    ) -> list[Backend]:
        """The members other than the session's that answer, best first: most of its
        prefixes resident, then least loaded. A member that does not answer (down, stopping,
        closed) is no candidate: a session is never moved to it."""
        current = self._affinity.get(session_id)
        scores: dict[str, int] = {}
        for backend in self.backends:
            if backend.name == current:
                continue
            try:
                if prefix_ids:
                    resident = await backend.residency(list(prefix_ids))
                    scores[backend.name] = sum(resident.values())
                elif await backend.health():
                    scores[backend.name] = 0
            except BackendUnavailable:
                continue
        others = [b for b in self.backends if b.name in scores]
        return sorted(
            others, key=lambda b: (scores[b.name], -self._load[b.name], b.name), reverse=True
        )

    def move(self, session_id: str, name: str) -> Backend:
        """Give the session's affinity to the member ``name``."""
        backend = self.get(name)
        current = self._affinity.get(session_id)
        if current is not None:
            self._load[current] -= 1
        self._affinity[session_id] = name
        self._load[name] += 1
        return backend

    async def reroute(self, session_id: str, prefix_ids: Sequence[PrefixId] = ()) -> Backend | None:
        """Move the session to another member that answers (most of its prefix resident
        first, then least loaded); ``None`` when the pool has no other such member."""
        others = await self.candidates(session_id, prefix_ids)
        return self.move(session_id, others[0].name) if others else None

    async def admit(self, session_id: str) -> None:
        """Wait for the session's slot in the admission window (at once without one)."""
        if self.admission is not None:
            await self.admission.acquire(session_id)

    def observe_call(self, *, prompt_tokens: int, cached_tokens: int, pressed: bool) -> None:
        """One answered call of a session: the window's signals."""
        if self.admission is not None:
            self.admission.observe(
                prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, pressed=pressed
            )

    def observe_harm(self, harmed: int = 1) -> None:
        """Claims of a session harmed (apart from a call): pressure on the window."""
        if self.admission is not None:
            self.admission.observe(harmed=harmed)

    def release(self, session_id: str) -> None:
        """Forget a finished session's affinity, and free its admission slot."""
        name = self._affinity.pop(session_id, None)
        if name is not None:
            self._load[name] -= 1
        if self.admission is not None:
            self.admission.cancel(session_id)

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()

    # ------------------------------------------------------------------ claims protocol
    def claim_target(self, claim_id: ClaimId) -> Backend:
        """The member holding claim ``claim_id``."""
        name = self._home.get(claim_id)
        if name is None:
            raise UnknownClaim(claim_id)
        return self._by_name[name]

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        """Submit on the owner's member (its affinity, else the least loaded)."""
        member = self.assign(spec.owner_scope)
        decision = await member.submit_claim(spec, block_hashes)
        self._home[spec.claim_id] = member.name
        return decision

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        """The members' new events appended to the pool's stream, then the page after
        ``since`` (a position in that stream); each event keeps its member's ``seq``. A member
        that does not answer is read again from its cursor next time (nothing of it is lost);
        ``BackendUnavailable`` only when none answers."""
        down: list[BackendUnavailable] = []
        for member in self.backends:
            try:
                page = await member.events(self._cursors[member.name])
            except BackendUnavailable as exc:
                down.append(exc)
                continue
            self._cursors[member.name] = page.next_since
            self._log.extend((member.name, e) for e in page.events)
        _unless_all_down(self, down)
        return self._page(since, id_prefix=id_prefix, limit=limit)

    def _page(self, since: int, *, id_prefix: str | None, limit: int | None) -> EventPage:
        """The page of the pool's merged stream after ``since`` (a position in it)."""
        after = [e for _, e in self._log[since:]]
        page = EventPage.select(after, 0, len(after), limit=limit, id_prefix=id_prefix)
        scanned = len(after) if limit is None else min(limit, len(after))
        return dataclasses.replace(
            page,
            last_seq=len(self._log),
            next_since=since + scanned,
            more=since + scanned < len(self._log),
            gap=False,
        )

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        """The most leading blocks of each prefix resident on any member that answers
        (``BackendUnavailable`` only when none does)."""
        out = dict.fromkeys(prefix_ids, 0)
        down: list[BackendUnavailable] = []
        for member in self.backends:
            try:
                resident = await member.residency(prefix_ids)
            except BackendUnavailable as exc:
                down.append(exc)
                continue
            for pid, n in resident.items():
                out[pid] = max(out.get(pid, 0), n)
        _unless_all_down(self, down)
        return out

    async def descriptor(self) -> Descriptor:
        """The members' descriptors; per mode the weakest class among them (fail closed)."""
        return self._combine({b.name: await b.descriptor() for b in self.backends})

    def _combine(self, members: dict[str, Descriptor]) -> Descriptor:
        """One descriptor for several: per mode the weakest member's class."""
        modes: dict[str, Any] = {}
        for mode in ProtectionMode:
            worst = min(
                (stated_class(desc, mode) for desc in members.values()), key=lambda c: c.rank
            )
            modes[mode.value] = {"lowering_class": worst.value}
        first = next(iter(members.values()))
        return {
            "name": self.name,
            "cache_identity": first.get("cache_identity"),
            "members": members,
            "modes": modes,
        }


def _members(backends: object) -> list[Backend]:
    """The pool's members as given, checked: a non-empty sequence of backends (no pool, no
    string), each its own name and, where it is one reached by URL, its own gateway (two
    members on one gateway would make a reroute a move to the same engine); else
    ``UsageError("backends")``."""
    if isinstance(backends, str | bytes) or not isinstance(backends, Iterable):
        raise UsageError("backends", f"expected a sequence of backends, got {backends!r}")
    members = list(backends)
    if not members:
        raise UsageError("backends", "a pool needs at least one backend")
    for i, member in enumerate(members):
        if isinstance(member, BackendPool) or not isinstance(member, Backend):
            raise UsageError(
                "backends",
                f"item {i} is not a backend (HTTPBackend, EmbeddedBackend, ...): {member!r}",
            )
    names = [b.name for b in members]
    if len(set(names)) != len(names):
        raise UsageError("backends", f"backend names must be unique, got {names}")
    urls = [k for k in (getattr(b, "share_key", None) for b in members) if isinstance(k, str)]
    if len(set(urls)) != len(urls):
        twice = sorted({u for u in urls if urls.count(u) > 1})
        raise UsageError("backends", f"two members reach one gateway: {', '.join(twice)}")
    return members


def _unless_all_down(pool: BackendPool, down: list[BackendUnavailable]) -> None:
    """Raise when no member answered (``down`` holds one error per member)."""
    if down and len(down) == len(pool.backends):
        raise BackendUnavailable(
            f"{pool.name}: no member answers ({'; '.join(map(str, down))})"
        ) from down[0]
