"""What a session's page of its own events costs the KV side (``EventLog.page`` with the
session's id as ``id_prefix``, as every SDK call's answer reads it), by how many other
sessions' events came since the session's cursor: read from the log's owner index, beside the
scan of every event since the cursor it replaced (``EventPage.select``). A script that prints
figures; nothing else needed. Run::

    .venv/bin/python benchmarks/bench_events_page.py [--between 50 500 5000] [--reads 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

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
        log.emit("active_request_served", request_id=f"s-{i % 200:04x}-r{i}")
    cursor = log.seq
    log.emit("resident_claim_granted", claim_id="s-mine-c1")
    for i in range(between):
        log.emit("active_request_served", request_id=f"s-{i % 200:04x}-r{i}")
    log.emit("resident_claim_released", claim_id="s-mine-c1")

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


if __name__ == "__main__":
    main()
