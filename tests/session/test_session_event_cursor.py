"""Where a session's event reads start: where this process last read the backend's events
(none before it can be its own), so a gateway that has served many sessions pages no old
events into a new session's answers; a numbering that started again (a restarted gateway) is
read from its start. On the embedded default and over a real gateway process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planners import Always
from surface import log_lines

import agentclaims
from agentclaims.contract import ProtectionMode
from agentclaims.session import ClaimedSession


async def _run(backend: Any, tmp_path: Path, sent: list[int | None]) -> Any:
    """One session, two calls of one node, each claiming its prefix; the ``events_since``
    each call carried is appended to ``sent``."""
    openai = agentclaims.openai_client(backend)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "careful. " * 80}]

    async def record(request: Any) -> None:  # what reaches the gateway, extension and all
        if request.url.path.endswith("/chat/completions"):
            ext = json.loads(request.content).get("agentclaims") or {}
            sent.append(ext.get("events_since"))

    hooks = backend.http_client().event_hooks
    hooks["request"] = [*hooks["request"], record]
    session = ClaimedSession(
        backend, planner=Always(ProtectionMode.SOFT_PRIORITY), log_dir=tmp_path
    )
    try:
        await _calls(session, openai, messages)
    finally:
        hooks["request"].remove(record)
    return session


async def _calls(session: Any, openai: Any, messages: list[dict[str, Any]]) -> None:
    async with session:
        for turn in range(2):
            with session.node("writer"):
                messages.append({"role": "user", "content": f"part {turn} " * 10})
                reply = await openai.chat.completions.create(model="m", messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def _claim_events(directory: Path) -> set[tuple[str, str]]:
    return {
        (d["claim_id"], d["event"])
        for d in log_lines(directory)
        if d["event"].startswith("resident_claim") and d.get("claim_id")
    }


async def test_a_new_session_reads_from_where_the_process_last_read(
    backend: Any, tmp_path: Path
) -> None:
    first: list[int | None] = []
    one = await _run(backend, tmp_path / "one", first)
    seen = backend.events_seen
    assert seen > 0
    second: list[int | None] = []
    two = await _run(backend, tmp_path / "two", second)
    assert second[0] == seen  # not 0: nothing before it can be the new session's
    assert first[0] is not None
    assert first[0] < seen
    # each session still hears every event of its own claims
    for session, directory in ((one, tmp_path / "one"), (two, tmp_path / "two")):
        ids = {c.claim_id for c in session.ended_claims}
        assert len(ids) == 2
        heard = _claim_events(directory)
        assert {(c, "resident_claim_accepted") for c in ids} <= heard, heard


async def test_a_numbering_that_started_again_is_read_from_its_start(
    backend: Any, tmp_path: Path
) -> None:
    """As after a restarted gateway: the process read its events up to a number the gateway
    has not reached again. A session starting there finds its answers' pages behind its
    cursor and reads from the start: it hears its own claims' events all the same."""
    backend.events_seen = 10**9
    sent: list[int | None] = []
    session = await _run(backend, tmp_path, sent)
    assert sent[0] == 10**9
    ids = {c.claim_id for c in session.ended_claims}
    assert len(ids) == 2
    heard = _claim_events(tmp_path)
    assert {(c, "resident_claim_accepted") for c in ids} <= heard, heard
    assert backend.events_seen < 10**9


async def test_a_processs_first_session_starts_at_the_gateways_last_event(
    gateway_url: str, tmp_path: Path
) -> None:
    """A new process (a new backend object) on a gateway that served others: its descriptor
    names the last event then, and the first session's first call reads from there, not from
    0 (its answers do not page through the old events); it hears its own claims' events."""
    earlier = agentclaims.HTTPBackend(gateway_url)
    try:
        await _run(earlier, tmp_path / "earlier", [])
    finally:
        await earlier.aclose()
    fresh = agentclaims.HTTPBackend(gateway_url)
    try:
        last = (await fresh.events(0, limit=1)).last_seq
        assert last > 0  # the earlier process's claims wrote events
        sent: list[int | None] = []
        session = await _run(fresh, tmp_path / "fresh", sent)
    finally:
        await fresh.aclose()
    assert (await _descriptor_seq(gateway_url)) >= last
    assert sent[0] == last, (sent, last)
    ids = {c.claim_id for c in session.ended_claims}
    assert len(ids) == 2
    heard = _claim_events(tmp_path / "fresh")
    assert {(c, "resident_claim_accepted") for c in ids} <= heard, heard


async def _descriptor_seq(url: str) -> int:
    backend = agentclaims.HTTPBackend(url)
    try:
        seq = (await backend.descriptor())["events_seq"]
    finally:
        await backend.aclose()
    assert isinstance(seq, int)
    return seq
