"""The ledger's page of events (``Ledger.page``) parses only the rows it can keep; the page is
the one a parse of every scanned row gives (``EventPage.select``, then the tenant's), on a
real SQLite file, whatever the ids, tenants, cursor and limit."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.contract import ClaimEvent
from agentclaims.gateway.ledger import Ledger
from agentclaims.protocol.types import EventPage

_IDS = st.sampled_from(["s-1-c1", "s-1-r2", "s-12-c1", "t/s-1-c3", "s-é-c1", 'q"-c1', "s", None])
_PREFIXES = st.sampled_from(["s-1", "s-12", "s", "t/s-1", "s-é", 'q"', "s-1-c", "x", "", None])
_TENANTS = st.sampled_from(["a", "b", None])


def _event(i: int, claim_id: str | None, request_id: str | None) -> ClaimEvent:
    return ClaimEvent(
        event="resident_claim_accepted" if claim_id else "active_request_deferred",
        seq=i,
        event_sequence=i,
        timestamp_ns=1_796_489_291_000_000_000 + i,
        run_id="run",
        policy="test",
        usable_blocks=8,
        claim_id=claim_id,  # type: ignore[arg-type]
        request_id=request_id,  # type: ignore[arg-type]
        prefix_id=None,
    )


def _scanned_page(
    book: Ledger, since: int, limit: int, tenant: str | None, prefix: str | None
) -> EventPage:
    """The page as a parse of every scanned row gives it."""
    rows = book._db.execute(
        "SELECT tenant, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (since, limit)
    ).fetchall()
    scanned = [(t, ClaimEvent.from_json(body)) for t, body in rows]
    page = EventPage.select(
        (e for _, e in scanned), since, book.last_seq, limit=limit, id_prefix=prefix
    )
    if tenant is None:
        return page
    mine = {e.seq for t, e in scanned if t == tenant}
    return replace(page, events=tuple(e for e in page.events if e.seq in mine))


@settings(max_examples=60, deadline=None)
@given(
    emitted=st.lists(st.tuples(_IDS, _IDS, _TENANTS), max_size=30),
    reads=st.lists(
        st.tuples(st.integers(-1, 35), st.integers(0, 12), _TENANTS, _PREFIXES),
        min_size=1,
        max_size=6,
    ),
)
def test_the_page_is_the_full_parse_page(
    emitted: list[tuple[str | None, str | None, str | None]],
    reads: list[tuple[int, int, str | None, str | None]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        book = Ledger(Path(folder) / "ledger.sqlite")
        try:
            tenants = {}
            events = []
            for i, (claim_id, request_id, tenant) in enumerate(emitted, 1):
                events.append(_event(i, claim_id, request_id))
                tenants[i] = tenant
            book.ingest(events, lambda ev: tenants[ev.seq])
            for since, limit, tenant, prefix in reads:
                want = _scanned_page(book, since, limit, tenant, prefix)
                assert book.page(since, limit=limit, tenant=tenant, id_prefix=prefix) == want
        finally:
            book.close()


def test_ids_the_json_text_escapes_are_found(tmp_path: Path) -> None:
    """A prefix whose JSON text differs from the id's characters (a non-ASCII letter, a
    quote) still finds its events; another session's stay out."""
    book = Ledger(tmp_path / "ledger.sqlite")
    try:
        ids = ["s-é-c1", 'q"-c1', "s-1-c1", "s-é-c2"]
        book.ingest([_event(i, cid, None) for i, cid in enumerate(ids, 1)])
        for prefix, want in (("s-é", ["s-é-c1", "s-é-c2"]), ('q"', ['q"-c1']), ("s-1", ["s-1-c1"])):
            page = book.page(0, id_prefix=prefix)
            assert [e.claim_id for e in page.events] == want
            assert page == _scanned_page(book, 0, 10_000, None, prefix)
    finally:
        book.close()
