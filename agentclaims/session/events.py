"""``ClaimEvents``: the session's claim events, taken after every call.

Where the backend's answers carry them (``events_ride_on_answers``) a call names the
session's cursor and its answer brings the events after it (``carried``): no poll then,
unless the answer had more than it carried. The events of a claim request sent on its own
come with the next call's answer (or the poll at the session's end). Each event lands in the
outcome log as it is read, brings the state of the claim it names up to date, and says which
held claims lapsed (demoted, expired) or were harmed. What to do about it is the session's
reaction policy (``agentclaims.session.outcomes``).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from agentclaims.contract import ClaimEvent, ClaimId, ClaimState, EventName
from agentclaims.errors import BackendUnavailable
from agentclaims.protocol import EventPage

if TYPE_CHECKING:
    from agentclaims.observability import WorkflowLog
    from agentclaims.protocol import ClaimsProtocol
    from agentclaims.session.held import HeldClaim

__all__ = ["ClaimEvents", "ClaimIndex", "EventOutcomes"]

_log = structlog.get_logger("agentclaims.session")
_STATE_OF = {
    EventName.RESIDENT_CLAIM_MATERIALIZED: ClaimState.MATERIALIZED,
    EventName.RESIDENT_CLAIM_DEMOTED: ClaimState.DEMOTED,
    EventName.RESIDENT_CLAIM_EXPIRED: ClaimState.EXPIRED,
    EventName.RESIDENT_CLAIM_HARMED: ClaimState.HARMED,
}


class HeldClaims(Protocol):
    """What the events are read against: the session's claims (``ClaimIO`` is this)."""

    session_id: str
    held: dict[str, HeldClaim]
    releasing: list[HeldClaim]
    ended: list[HeldClaim]
    request_nodes: dict[str, str]
    stats: Any

    def outcome_log(self) -> WorkflowLog | None: ...


@dataclass(slots=True)
class EventOutcomes:
    """What one round of taken events did to the held claims."""

    events: list[ClaimEvent] = field(default_factory=list)
    lapsed: list[tuple[HeldClaim, ClaimEvent]] = field(default_factory=list)
    """Held claims demoted or expired while the session still wanted them."""
    harmed: list[tuple[HeldClaim, ClaimEvent]] = field(default_factory=list)


class ClaimIndex:
    """A session's claims by id, as its events name them: a claim held now first, then one
    being let go, then one ended (the latest of each, where an id is in several places).
    The ended claims' index grows with each claim that ends (``ended`` only grows), so a
    lookup, and each round of events, costs what is held and let go now, not the session's
    history of claims."""

    __slots__ = ("_ended", "_indexed", "_list")

    def __init__(self) -> None:
        self._ended: dict[ClaimId, HeldClaim] = {}
        self._indexed = 0
        self._list: list[HeldClaim] | None = None

    def of(self, io: HeldClaims) -> Mapping[ClaimId, HeldClaim]:
        """``io``'s claims by id, as they stand now."""
        ended = io.ended
        if ended is not self._list or len(ended) < self._indexed:  # another list: anew
            self._ended.clear()
            self._indexed, self._list = 0, ended
        for held in ended[self._indexed :]:
            self._ended[held.claim_id] = held
        self._indexed = len(ended)
        live = {h.claim_id: h for h in io.releasing}
        live.update((h.claim_id, h) for h in io.held.values())
        return ChainMap(live, self._ended)


class ClaimEvents:
    """The events of ``io``'s claims, read from each backend from where the last read ended."""

    def __init__(self, io: HeldClaims) -> None:
        self._io = io
        self._cursor: dict[str, int] = {}
        self._harmed: set[str] = set()  # claims whose harm was counted
        self._carried: dict[str, list[EventPage]] = {}
        """backend name -> pages its answers carried since the last ``take``."""
        self._quiet_at: int | None = None
        """How many claims had ended when a ``take`` last read every event with none held."""
        self._claims = ClaimIndex()

    def cursor(self, backend: ClaimsProtocol) -> int:
        """Where the next read of ``backend``'s events starts (a call's ``events_since``). A
        session's first read starts where this process last read that backend's events
        (``events_seen``): every event up to there was written before the session's first
        request, so none is its own, and its answers need not page through them."""
        since = self._cursor.get(backend.name)
        if since is None:
            seen = getattr(backend, "events_seen", 0)
            since = self._cursor[backend.name] = seen if isinstance(seen, int) else 0
        return since

    def quiet(self) -> bool:
        """No claim has been held or let go since a ``take`` read every event: none can have
        an event that matters (only a held claim is harmed, demoted or expired), so a session
        that ends now needs no poll."""
        io = self._io
        return self._quiet_at == len(io.ended) and not io.held and not io.releasing

    def carried(self, backend_name: str, page: Mapping[str, object] | None) -> EventPage | None:
        """An answer of ``backend_name`` carried ``page`` (its ``agentclaims.events``): taken
        with the next ``take``, in place of a poll; returned parsed. A page that does not
        parse is dropped (the next ``take`` polls)."""
        if not isinstance(page, Mapping):
            return None
        try:
            parsed = empty_page(page)
            if parsed is None:
                parsed = EventPage.from_dict(page)
        except (TypeError, ValueError, KeyError) as exc:
            _log.warning("events_unreadable", backend=backend_name, error=repr(exc))
            return None
        self._carried.setdefault(backend_name, []).append(parsed)
        return parsed

    async def take(self, backends: Sequence[ClaimsProtocol], *, poll: bool = True) -> EventOutcomes:
        """Take this session's new events from ``backends``: log each, bring the held claims'
        states up to date, and say which held claims lapsed or were harmed. What answers
        carried is taken first; a backend is polled only when they did not cover it (and
        ``poll``: ``False`` when a request about to go out will bring them)."""
        io = self._io
        out = EventOutcomes()
        # ended claims too: a claim harmed while held may be let go (superseded by its node's
        # next call) before the harm event is read; it is harm all the same
        by_id = self._claims.of(io)
        carried, self._carried = self._carried, {}
        read_all = True  # every backend's events up to now are read
        for backend in backends:
            since = start = self.cursor(backend)
            pages = carried.get(backend.name) or []
            if any(p.last_seq < start for p in pages):
                since, pages = 0, []  # its numbering started again (a restart): read it anew
            for page in sorted(pages, key=lambda p: p.next_since):
                since = self._read(page, since, backend.name, by_id, out)
            covered = bool(pages) and not any(p.more or p.gap for p in pages)
            if not covered and not poll:
                read_all = False
                covered = True
            while not covered:
                covered = True
                try:
                    page = await backend.events(since, id_prefix=io.session_id)
                except BackendUnavailable as exc:
                    # read again next round from the same cursor; an instance that stays
                    # gone is failed over, its claims reported lost (FleetBackend)
                    _log.warning("events_unavailable", backend=backend.name, error=repr(exc))
                    read_all = False
                    break
                before = since
                if page.last_seq < before:  # its numbering started again: from the start
                    since, covered = 0, False
                    continue
                since = self._read(page, since, backend.name, by_id, out)
                covered = since <= before or not page.more
            self._cursor[backend.name] = since
            if hasattr(backend, "events_seen") and (since > backend.events_seen or since < start):
                backend.events_seen = since
        quiet = read_all and not io.held and not io.releasing
        self._quiet_at = len(io.ended) if quiet else None
        return out

    def _read(
        self,
        page: EventPage,
        since: int,
        backend: str,
        by_id: Mapping[ClaimId, HeldClaim],
        out: EventOutcomes,
    ) -> int:
        """Take ``page``'s events after ``since`` (those before were taken already: answers to
        calls in flight together overlap); the cursor after it."""
        io = self._io
        log = io.outcome_log()
        for ev in page.events:
            if ev.seq <= since:
                continue
            out.events.append(ev)
            if log is not None:
                known = by_id.get(ev.claim_id) if ev.claim_id else None
                node = (
                    known.node if known is not None else io.request_nodes.get(ev.request_id or "")
                )
                log.claim_event(ev, backend=backend, node=node)
            self._apply(ev, by_id.get(ev.claim_id) if ev.claim_id else None, out)
        return max(since, page.next_since)

    def _apply(self, ev: ClaimEvent, held: HeldClaim | None, out: EventOutcomes) -> None:
        state = _STATE_OF.get(ev.event)
        if held is None or state is None:
            return
        held.state = state.value
        st = self._io.stats
        if state is ClaimState.HARMED:
            if held.claim_id not in self._harmed:
                self._harmed.add(held.claim_id)
                st.claims_harmed += 1
                out.harmed.append((held, ev))
        elif self._io.held.get(held.node) is not held:
            return  # a lapse of a claim already let go changes nothing
        elif state in (ClaimState.DEMOTED, ClaimState.EXPIRED):
            if state is ClaimState.DEMOTED:
                st.claims_demoted += 1
            else:
                st.claims_expired += 1
            out.lapsed.append((held, ev))


_PAGE_FIELDS = frozenset({"events", "last_seq", "next_since", "more", "gap"})


def empty_page(page: Mapping[str, object]) -> EventPage | None:
    """``page`` read without the validator where it holds no event and nothing else to check
    (what most answers carry: nothing happened since the last); ``None`` for any other page,
    which ``EventPage.from_dict`` reads (and refuses where it is wrong)."""
    if page.get("events") != [] or page.keys() != _PAGE_FIELDS:
        return None
    last, after, more, gap = page["last_seq"], page["next_since"], page["more"], page["gap"]
    if type(last) is not int or type(after) is not int:
        return None
    if type(more) is not bool or type(gap) is not bool:
        return None
    return EventPage((), last, after, more, gap)
