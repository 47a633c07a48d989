"""What a session's page of its own events costs the KV side (``EventLog.page`` with the
session's id as ``id_prefix``, as every SDK call's answer reads it), by how many other
sessions' events came since the session's cursor: read from the log's owner index, beside the
scan of every event since the cursor it replaced (``EventPage.select``); the same page from a
gateway's claim ledger (``Ledger.page``: only the rows it can keep parsed), beside the parse of
every scanned row it replaced. Then what reading
such an answer costs its client (``agentclaims._json.loads``: orjson, its events' 19-digit
nanosecond timestamps included), beside the standard library, which read every answer with
events before. A script that prints figures; nothing else needed. Run::

    .venv/bin/python benchmarks/bench_events_page.py [--between 50 500 5000] [--reads 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentclaims import _json
from agentclaims.contract import ClaimEvent
from agentclaims.gateway.ledger import Ledger
from agentclaims.kernel.events import EVENTS_KEPT, EventLog
from agentclaims.protocol.types import EventPage

LIMIT = 1000  # the gateway's EVENTS_PER_ANSWER scale: a page scans at most this many


class _Source:
    run_id, policy_name, num_blocks = "bench", "bench", 100_000

    @property
    def clock(self) -> Any:
        return time.monotonic_ns


def _timed(read: Any, reads: int) -> float:
    """Median microseconds of ``read()`` over ``reads`` calls, in batches of 50."""
    per: list[float] = []
    for _ in range(max(1, reads // 50)):
        t = time.perf_counter()
        for _ in range(50):
            read()
        per.append((time.perf_counter() - t) / 50 * 1e6)
    return statistics.median(per)


def one(between: int, reads: int) -> dict[str, Any]:
    """A log with 200 sessions' events (100k of them kept), then the reader's two events
    with ``between`` others' after its cursor."""
    log = EventLog(_Source(), EVENTS_KEPT)
    for i in range(100_000):
        log.emit("active_request_deferred", request_id=f"s-{i % 200:04x}-r{i}")
    cursor = log.seq
    log.emit("resident_claim_accepted", claim_id="s-mine-c1")
    for i in range(between):
        log.emit("active_request_deferred", request_id=f"s-{i % 200:04x}-r{i}")
    log.emit("resident_claim_expired", claim_id="s-mine-c1")

    def indexed() -> EventPage:
        return log.page(cursor, limit=LIMIT, id_prefix="s-mine")

    def scanned() -> EventPage:
        since = log.events_since(cursor, LIMIT)
        return EventPage.select(since, cursor, log.seq, limit=LIMIT, id_prefix="s-mine")

    assert indexed() == scanned()
    return {
        "between": between,
        "indexed_us": round(_timed(indexed, reads), 2),
        "scanned_us": round(_timed(scanned, reads), 2),
    }


def ledger_row(between: int, reads: int) -> dict[str, Any]:
    """A ledger (a SQLite file) with the reader's event and ``between`` others' after its
    cursor: its page read as ``Ledger.page`` reads it, and by parsing every scanned row."""
    log = EventLog(_Source(), EVENTS_KEPT)
    log.emit("resident_claim_accepted", claim_id="s-mine-c1")
    for i in range(between):
        log.emit("active_request_deferred", request_id=f"s-{i % 200:04x}-r{i}")
    log.emit("resident_claim_expired", claim_id="s-mine-c1")
    with tempfile.TemporaryDirectory() as folder:
        book = Ledger(Path(folder) / "ledger.sqlite")
        try:
            book.ingest(log.events_since(0))

            def parsed() -> EventPage:
                rows = book._db.execute(
                    "SELECT body FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (0, LIMIT)
                ).fetchall()
                events = [ClaimEvent.from_json(body) for (body,) in rows]
                return EventPage.select(events, 0, book.last_seq, limit=LIMIT, id_prefix="s-mine")

            def paged() -> EventPage:
                return book.page(0, limit=LIMIT, id_prefix="s-mine")

            assert paged() == parsed()
            return {
                "between": between,
                "paged_us": round(_timed(paged, max(50, reads // 20)), 1),
                "parsed_us": round(_timed(parsed, max(50, reads // 20)), 1),
            }
        finally:
            book.close()


def answer(events: int, content_chars: int) -> bytes:
    """An SDK call's answer: a reply of ``content_chars`` and a page of ``events`` events."""

    def event(i: int) -> dict[str, Any]:
        return {
            "event": "resident_claim_accepted",
            "seq": 100 + i,
            "timestamp_ns": 1_796_489_291_123_456_789 + i,
            "claim_id": f"s-42351f400762-c{i}",
            "prefix_id": "pfx-51fc11aa714eeadf-7",
            "data": {"mode": "soft", "ttl_s": 1.5},
        }

    reply = {"message": {"role": "assistant", "content": "word " * (content_chars // 5)}}
    page = {"events": [event(i) for i in range(events)], "last_seq": 100 + events}
    doc = {"choices": [reply], "agentclaims": {"events_seq": 100 + events, "events": page}}
    return json.dumps(doc).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--between", type=int, nargs="+", default=[50, 500, 5000])
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()
    if min(args.between) < 0 or args.reads < 1:
        parser.error("--between must be >= 0 and --reads >= 1")
    print(f"a session's page of its events (limit {LIMIT}), medians of {args.reads} reads; us")
    print(f"{'others since cursor':>20}{'owner index':>13}{'scan':>10}")
    for between in args.between:
        row = one(between, args.reads)
        print(f"{row['between']:>20}{row['indexed_us']:>13}{row['scanned_us']:>10}")
    print("\nthe same page from a claim ledger (SQLite); us")
    print(f"{'others since cursor':>20}{'kept rows parsed':>18}{'every row':>11}")
    for between in args.between:
        row = ledger_row(min(between, LIMIT), args.reads)
        print(f"{row['between']:>20}{row['paged_us']:>18}{row['parsed_us']:>11}")
    print("\nreading an answer with its events (19-digit timestamps); us")
    print(f"{'bytes':>8}{'events':>8}{'codec':>9}{'stdlib':>9}")
    for events, chars in ((2, 200), (8, 2000), (30, 8000)):
        raw = answer(events, chars)
        assert _json.loads(raw) == json.loads(raw)
        codec = _timed(lambda raw=raw: _json.loads(raw), args.reads)
        stdlib = _timed(lambda raw=raw: json.loads(raw), args.reads)
        print(f"{len(raw):>8}{events:>8}{codec:>9.2f}{stdlib:>9.2f}")


if __name__ == "__main__":
    main()
