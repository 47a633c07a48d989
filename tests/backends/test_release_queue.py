"""``ReleaseQueue``: one release request out at a time, the releases asked for meanwhile
together; each caller gets its own answer or its own error, whatever the others'."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.backends.releases import ReleaseQueue
from agentclaims.errors import AgentClaimsError, BackendError, BackendUnavailable, UnknownClaim


class Gateway:
    """Answers releases after a short wait: ``unknown`` ids raise ``UnknownClaim``."""

    def __init__(self, unknown: frozenset[str] = frozenset(), *, batches: bool = True) -> None:
        self.unknown = unknown
        self.batches = batches
        self.requests: list[list[str]] = []

    def _one(self, item: dict[str, Any]) -> dict[str, Any] | AgentClaimsError:
        cid = item["claim_id"]
        return UnknownClaim(cid) if cid in self.unknown else {"claim_id": cid, "state": "expired"}

    async def send_one(self, item: dict[str, Any]) -> dict[str, Any]:
        self.requests.append([item["claim_id"]])
        await asyncio.sleep(0.001)
        out = self._one(item)
        if isinstance(out, AgentClaimsError):
            raise out
        return out

    async def send_many(
        self, items: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any] | AgentClaimsError]:
        await asyncio.sleep(0.001)
        if not self.batches:
            raise BackendError("HTTP 404 not_found: POST /v1/releases: Not Found")
        self.requests.append([i["claim_id"] for i in items])
        return [self._one(i) for i in items]


async def release_all(queue: ReleaseQueue, ids: Sequence[str]) -> list[Any]:
    return await asyncio.gather(
        *(queue.release({"claim_id": c, "owner_scope": "o"}) for c in ids),
        return_exceptions=True,
    )


async def test_a_lone_release_goes_alone_and_the_rest_together() -> None:
    gw = Gateway(frozenset({"c3"}))
    queue = ReleaseQueue(gw.send_one, gw.send_many)
    assert (await queue.release({"claim_id": "c0", "owner_scope": "o"}))["claim_id"] == "c0"
    out = await release_all(queue, ["c1", "c2", "c3", "c4"])
    assert gw.requests == [["c0"], ["c1"], ["c2", "c3", "c4"]]
    assert [o["claim_id"] for o in (out[0], out[1], out[3])] == ["c1", "c2", "c4"]
    assert isinstance(out[2], UnknownClaim)  # its own error, to its own caller
    assert (queue.requests, queue.coalesced) == (3, 3)


async def test_an_older_gateway_gets_them_one_by_one() -> None:
    gw = Gateway(batches=False)
    queue = ReleaseQueue(gw.send_one, gw.send_many)
    out = await release_all(queue, ["c1", "c2", "c3"])
    assert [o["claim_id"] for o in out] == ["c1", "c2", "c3"]
    assert gw.requests == [["c1"], ["c2"], ["c3"]]
    assert not queue.batches


async def test_closing_fails_what_waits_and_nothing_else() -> None:
    gw = Gateway()
    queue = ReleaseQueue(gw.send_one, gw.send_many)
    first = asyncio.ensure_future(queue.release({"claim_id": "c1", "owner_scope": "o"}))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(queue.release({"claim_id": "c2", "owner_scope": "o"}))
    await asyncio.sleep(0)
    queue.close("backend 'x' is closed")
    assert (await first)["claim_id"] == "c1"
    with pytest.raises(BackendUnavailable, match="closed"):
        await waiting


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.sampled_from([f"c{i}" for i in range(12)]), min_size=1, max_size=30),
    unknown=st.frozensets(st.sampled_from([f"c{i}" for i in range(12)])),
    most=st.integers(1, 8),
)
def test_every_caller_gets_its_own_answer(
    ids: list[str], unknown: frozenset[str], most: int
) -> None:
    """Property: asked for at once, each release is answered with its own claim's view or
    its own error; every item is sent exactly once; the first alone, the rest in requests of
    at most ``most``."""

    async def run() -> tuple[list[Any], Gateway]:
        gw = Gateway(unknown)
        return await release_all(ReleaseQueue(gw.send_one, gw.send_many, most=most), ids), gw

    out, gw = asyncio.run(run())
    for cid, answer in zip(ids, out, strict=True):
        if cid in unknown:
            assert isinstance(answer, UnknownClaim)
            assert answer.claim_id == cid
        else:
            assert answer == {"claim_id": cid, "state": "expired"}
    assert sorted(c for req in gw.requests for c in req) == sorted(ids)
    assert gw.requests[0] == ids[:1]
    assert all(1 <= len(req) <= most for req in gw.requests)
    assert len(gw.requests) == 1 + -(-(len(ids) - 1) // most)
