"""The gateway's claim ledger: accepted claims, their owners' tenants, and the event stream,
in one SQLite file in WAL mode (``agentclaims serve --ledger FILE``), or in memory.

Every change is one transaction, committed before the gateway answers, so what a client was
told survives a crash of the gateway process (``kill -9``: WAL with ``synchronous=NORMAL`` keeps
every committed transaction; only a power loss can drop the last ones). The event stream the
gateway serves is the ledger's: its ``seq`` goes on from the file's last one after a restart,
whatever the KV side's own numbering, so a client resuming from an old ``seq`` misses nothing
and never sees a number twice.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentclaims.contract import ClaimEvent, ClaimState, ProtectionMode
from agentclaims.contract.events import STATE_OF_EVENT
from agentclaims.contract.ids import ClaimId
from agentclaims.contract.names import BACKEND_RESTART, backend_restart_end
from agentclaims.errors import ServiceUnavailable
from agentclaims.protocol import EventPage

__all__ = ["RESTART_CAUSE", "Ledger", "LedgerClaim"]

RESTART_CAUSE = BACKEND_RESTART
"""The cause (harm) or reason (expiry) of a claim the gateway could not carry over a restart."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS owners (owner_scope TEXT PRIMARY KEY, tenant TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS claims (
    claim_id TEXT PRIMARY KEY,
    tenant TEXT,
    owner_scope TEXT NOT NULL,
    mode TEXT NOT NULL,
    footprint_blocks INTEGER NOT NULL,
    state TEXT NOT NULL,
    end_reason TEXT,
    event_sequence INTEGER NOT NULL DEFAULT -1
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    tenant TEXT,
    body TEXT NOT NULL
);
"""


@dataclass(slots=True)
class LedgerClaim:
    """A claim as the ledger knows it."""

    claim_id: str
    tenant: str | None
    owner_scope: str
    mode: ProtectionMode
    footprint_blocks: int
    state: ClaimState
    event_sequence: int = -1

    @property
    def protected(self) -> bool:
        return self.mode is not ProtectionMode.BEST_EFFORT


class Ledger:
    """Claims, owners and events, durable when given a path. Not thread-safe: the gateway
    calls it from its event loop only."""

    def __init__(self, path: str | Path | None = None, *, max_events: int = 1_000_000) -> None:
        self.path = None if path is None else Path(path)
        self.max_events = max_events
        try:
            self._db = sqlite3.connect(
                ":memory:" if path is None else str(path), isolation_level=None
            )
            if path is not None:
                mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode != "wal":
                    raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ServiceUnavailable(f"claim ledger {path}: {exc}") from exc
        self.last_seq = int(
            self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        )
        stored = self._meta("last_seq")
        self.last_seq = max(self.last_seq, int(stored) if stored else 0)
        self.owners: dict[str, str] = dict(
            self._db.execute("SELECT owner_scope, tenant FROM owners")
        )
        self.claims: dict[str, LedgerClaim] = {}
        for row in self._db.execute(
            "SELECT claim_id, tenant, owner_scope, mode, footprint_blocks, state, event_sequence "
            "FROM claims"
        ):
            cid, tenant, owner, mode, fp, state, n = row
            self.claims[cid] = LedgerClaim(
                cid, tenant, owner, ProtectionMode(mode), fp, ClaimState(state), n
            )
        self._usage: dict[str | None, list[int]] = {}
        """tenant -> [live claims, blocks their protected ones cover] (what quotas read)."""
        for c in self.claims.values():
            self._count(c, 1)
        self.writes = 0
        """Transactions committed by this process (the benchmark's write count)..."""
        self.write_s = 0.0
        """... and the seconds they took."""
        self.closed = False

    # ------------------------------------------------------------------ plumbing
    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _write(
        self,
        statements: Iterable[tuple[str, Sequence[Any]]],
        many: Sequence[tuple[str, Sequence[Sequence[Any]]]] = (),
    ) -> None:
        """One transaction: ``many`` (``executemany``) first, then ``statements`` (fail
        closed: a write that fails raises ``ServiceUnavailable``)."""
        if self.closed:
            raise ServiceUnavailable("the claim ledger is closed (the gateway is stopping)")
        started = time.perf_counter()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in many:
                    self._db.executemany(sql, rows)
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise ServiceUnavailable(f"claim ledger write failed: {exc}") from exc
        self.writes += 1
        self.write_s += time.perf_counter() - started

    def secret(self) -> str:
        """A random secret made once per ledger (the tenants' cache salts derive from it)."""
        value = self._meta("secret")
        if value is None:
            value = secrets.token_hex(16)
            self._write([("INSERT INTO meta VALUES ('secret', ?)", (value,))])
        return value

    def usable(self) -> bool:
        """Whether the ledger answers a read (``/health``)."""
        if self.closed:
            return False
        try:
            self._db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
        except sqlite3.Error:
            return False
        return True

    def close(self) -> None:
        """Checkpoint the WAL into the file and close (the gateway's shutdown)."""
        if self.closed:
            return
        try:
            if self.path is not None:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()
            self.closed = True

    # ------------------------------------------------------------------ owners and claims
    def bind_owner(self, owner_scope: str, tenant: str) -> None:
        if self.owners.get(owner_scope) != tenant:
            self._write([("INSERT OR REPLACE INTO owners VALUES (?, ?)", (owner_scope, tenant))])
            self.owners[owner_scope] = tenant

    def record_claims(self, claims: Sequence[LedgerClaim]) -> None:
        """Claims the KV side accepted (before their events are ingested)."""
        new = [c for c in claims if c.claim_id not in self.claims]
        if not new:
            return
        self._write(
            (
                "INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
                (
                    c.claim_id,
                    c.tenant,
                    c.owner_scope,
                    c.mode.value,
                    c.footprint_blocks,
                    c.state.value,
                    c.event_sequence,
                ),
            )
            for c in new
        )
        for c in new:
            self.claims[c.claim_id] = c
            self._count(c, 1)

    def _count(self, claim: LedgerClaim, sign: int) -> None:
        usage = self._usage.setdefault(claim.tenant, [0, 0])
        usage[0] += sign
        if claim.protected:
            usage[1] += sign * claim.footprint_blocks

    def usage(self, tenant: str | None) -> tuple[int, int]:
        """The tenant's live claims and the blocks its protected ones cover (O(1))."""
        count, blocks = self._usage.get(tenant, (0, 0))
        return count, blocks

    def live(self, tenant: str | None = None) -> list[LedgerClaim]:
        return [
            c
            for c in self.claims.values()
            if c.state.live and (tenant is None or c.tenant == tenant)
        ]

    # ------------------------------------------------------------------ events
    def ingest(
        self,
        events: Sequence[ClaimEvent],
        tenant_of: Callable[[ClaimEvent], str | None] | None = None,
    ) -> list[ClaimEvent]:
        """Append the KV side's new events with the ledger's own ``seq``, and follow their
        claims' states; one transaction. Returns them as served. An event belongs to its
        claim's tenant, else to the one ``tenant_of`` names."""
        if not events:
            return []
        out: list[ClaimEvent] = []
        rows: list[tuple[str, Sequence[Any]]] = []
        inserts: list[tuple[int, str | None, str]] = []
        changed: dict[str, LedgerClaim] = {}
        seq = self.last_seq
        for ev in events:
            seq += 1
            served = replace(ev, seq=seq)
            claim = self.claims.get(ev.claim_id) if ev.claim_id else None
            tenant = claim.tenant if claim is not None else None
            if tenant is None and tenant_of is not None:
                tenant = tenant_of(ev)
            if claim is not None:
                target = STATE_OF_EVENT.get(ev.event)
                if target is not None and target is not ClaimState.SUBMITTED:
                    claim.state = target
                claim.event_sequence = max(claim.event_sequence, ev.event_sequence)
                changed[claim.claim_id] = claim
            inserts.append((seq, tenant, served.to_json()))
            out.append(served)
        rows.extend(self._claim_rows(changed.values()))
        rows.append(("INSERT OR REPLACE INTO meta VALUES ('last_seq', ?)", (str(seq),)))
        if seq % 10_000 < len(events):
            rows.append(("DELETE FROM events WHERE seq <= ?", (seq - self.max_events,)))
        self._write(rows, many=[("INSERT INTO events VALUES (?, ?, ?)", inserts)])
        self.last_seq = seq
        return out

    def _claim_rows(self, claims: Iterable[LedgerClaim]) -> list[tuple[str, Sequence[Any]]]:
        rows: list[tuple[str, Sequence[Any]]] = []
        for c in claims:
            if c.state.live:
                rows.append(
                    (
                        "UPDATE claims SET state = ?, event_sequence = ? WHERE claim_id = ?",
                        (c.state.value, c.event_sequence, c.claim_id),
                    )
                )
            else:  # its story is in the events; the table keeps what is still to account for
                rows.append(("DELETE FROM claims WHERE claim_id = ?", (c.claim_id,)))
        for c in claims:
            if not c.state.live and self.claims.pop(c.claim_id, None) is not None:
                self._count(c, -1)
        return rows

    def end_unaccounted(self, run_id: str) -> list[ClaimEvent]:
        """After a restart: end every claim the ledger still holds live with an explicit event
        (the KV side that held it is gone). A materialized claim is harmed (cause
        ``backend_restart``: its blocks are lost); one not yet materialized expires (reason
        ``backend_restart``)."""
        events = []
        now = time.time_ns()
        for c in self.live():
            name, _, data = backend_restart_end(c.state is ClaimState.MATERIALIZED)
            events.append(
                ClaimEvent(
                    event=name,
                    seq=0,
                    event_sequence=c.event_sequence + 1,
                    timestamp_ns=now,
                    run_id=run_id,
                    policy="gateway-ledger",
                    usable_blocks=0,
                    claim_id=ClaimId(c.claim_id),
                    data=data,
                )
            )
        return self.ingest(events)

    def page(
        self,
        since: int,
        *,
        limit: int = 10_000,
        tenant: str | None = None,
        id_prefix: str | None = None,
    ) -> EventPage:
        """The served stream after ``since``: ``limit`` events scanned, then those the tenant
        may see (all, for ``tenant=None``) and of ``id_prefix`` kept (``EventPage.select``'s
        page). Only a row that can be kept is parsed: one of the tenant's whose text holds the
        prefix as the start of a JSON string (every session's answer reads its own events,
        beside every other session's)."""
        rows = self._db.execute(
            "SELECT seq, tenant, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (since, limit),
        ).fetchall()
        needle = None if id_prefix is None else json.dumps(id_prefix)[:-1]  # as to_json writes
        candidates = [
            ClaimEvent.from_json(body)
            for _, t, body in rows
            if (tenant is None or t == tenant) and (needle is None or needle in body)
        ]
        bounds = (rows[0][0], rows[-1][0]) if rows else None
        return EventPage.of_scan(candidates, since, self.last_seq, bounds, id_prefix=id_prefix)
