"""One stateful property suite for every KV side: the reference engine, ``FakeKV`` and the vLLM
side (``tests/vllm/test_vllm_kernel.py`` runs it on a real vLLM server).

The machine serves requests that carry claims on their prompt, with claim ids drawn from a small
pool so that an id repeats within a request and an id already taken comes back; it releases and
reads claims of its own and of another owner. After every step:

* a request whose claims repeat an id, or name a taken one, is refused with ``UsageError`` naming
  ``agentclaims.claims[i].claim_id`` (the first such claim), and nothing changes: no event, no
  claim;
* a served request answers every claim it carried, in order, accepted or refused (never silent);
* a claim that ended stays as it ended; a released claim has ended, and releasing it again
  changes nothing; a live claim renews, an ended one is refused;
* the event stream is numbered 1, 2, 3, ... and each claim's own events 0, 1, 2, ...
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from agentclaims.contract import ClaimEvent, ClaimId, ClaimState, OwnerScope, RequestId
from agentclaims.errors import ScopeViolation, UnknownClaim, UsageError
from agentclaims.protocol import ActiveRequest, ClaimView, EventPage, Renewal, ServeResult

_MACHINES = itertools.count(1)
OWNER = "wf-k"
OTHER = "wf-other"
IDS = tuple(f"k{i}" for i in range(5))
MODES = ("hard_protected", "expiring", "demotable", "best_effort")


class Side(Protocol):
    """What the suite drives: the claims protocol and serving, as every KV side has them."""

    async def serve(self, request: ActiveRequest) -> ServeResult: ...
    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView: ...
    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView: ...
    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = ...
    ) -> ClaimView: ...
    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage: ...


def expected_error(ids: list[str], taken: set[str]) -> int | None:
    """The index of the first claim whose id repeats an earlier one or is taken."""
    seen: set[str] = set()
    for i, cid in enumerate(ids):
        if cid in seen or cid in taken:
            return i
        seen.add(cid)
    return None


class KernelMachine(RuleBasedStateMachine):
    """Subclass it with ``make_side`` (a side in a fresh state), ``prompt_tokens`` (a prompt
    of at least one full block for the side's block size) and ``run`` (runs a coroutine on the
    side's event loop)."""

    def make_side(self) -> Side:
        raise NotImplementedError

    def run(self, coro: Awaitable[Any]) -> Any:
        raise NotImplementedError

    def prompt_tokens(self, n: int) -> list[int]:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.side = self.make_side()
        self.ns = f"n{next(_MACHINES)}-"
        """Every claim id of this run starts with it (a server outlives one run)."""
        self.taken: set[str] = set()
        """Claim ids the side has decided (of this owner; the other owner's start with o-)."""
        self.ended: dict[str, ClaimState] = {}
        self.requests = itertools.count(1)
        self.prompts = itertools.count(1)

    def _events(self) -> list[ClaimEvent]:
        page: EventPage = self.run(self.side.events(0))
        return list(page.events)

    def _request(self, claims: list[dict[str, Any]], owner: str) -> ActiveRequest:
        n = next(self.requests)
        return ActiveRequest(
            RequestId(f"kr-{n}"),
            segments=(tuple(self.prompt_tokens(next(self.prompts))),),
            reply_tokens=(5, 6),
            claims=tuple(claims),
            owner_scope=OwnerScope(owner),
            chat=False,
        )

    @rule(
        ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=3),
        modes=st.lists(st.sampled_from(MODES), min_size=3, max_size=3),
    )
    def serve_with_claims(self, ids: list[str], modes: list[str]) -> None:
        ids = [self.ns + cid for cid in ids]
        claims = [
            {"claim_id": cid, "object_id": "@prompt", "protection_mode": mode, "ttl_s": 30}
            for cid, mode in zip(ids, modes, strict=False)
        ]
        before = self._events()
        bad = expected_error(ids, self.taken)
        refused: UsageError | None = None
        try:
            result: ServeResult = self.run(self.side.serve(self._request(claims, OWNER)))
        except UsageError as exc:
            refused = exc
        if refused is not None:
            assert bad is not None, f"refused a good request: {refused}"
            assert refused.field == f"agentclaims.claims[{bad}].claim_id", refused
            after = self._events()
            assert [e.seq for e in after] == [e.seq for e in before], "a refusal changed events"
            for cid in set(ids) - self.taken:
                self._assert_unknown(cid)
            return
        assert bad is None, f"served a request whose claim {bad} repeats or takes an id"
        if not result.outcome.served:
            return  # the side could not serve it now (pressure): no claim was decided
        assert [d.claim_id for d in result.decisions] == ids, result.decisions
        for decision in result.decisions:
            assert decision.decision.value in ("accepted", "conditionally_accepted", "rejected")
            if decision.decision.value == "rejected":
                assert decision.state is ClaimState.REFUSED
                assert decision.reason, "a refusal names its reason"
            self.taken.add(decision.claim_id)

    def _assert_unknown(self, cid: str) -> None:
        try:
            self.run(self.side.get_claim(ClaimId(cid), OwnerScope(OWNER)))
        except UnknownClaim:
            return
        raise AssertionError(f"claim {cid!r} exists after its request was refused")

    @rule(cid=st.sampled_from(IDS))
    def release(self, cid: str) -> None:
        cid = self.ns + cid
        try:
            view: ClaimView = self.run(self.side.release_claim(ClaimId(cid), OwnerScope(OWNER)))
        except UnknownClaim:
            assert cid not in self.taken
            return
        assert cid in self.taken
        assert view.state.terminal, view
        self.ended.setdefault(cid, view.state)
        settled = self._events()  # what the release did is in the stream now
        again: ClaimView = self.run(self.side.release_claim(ClaimId(cid), OwnerScope(OWNER)))
        assert again.state is view.state, (view, again)
        assert len(self._events()) == len(settled), "releasing an ended claim wrote an event"

    @rule(cid=st.sampled_from(IDS))
    def renew(self, cid: str) -> None:
        """A live claim renews and stays live; an ended one is refused (``UsageError`` on
        ``claim_id``) and stays as it ended; an unknown one is ``UnknownClaim``."""
        cid = self.ns + cid
        before = self.run(self._view_or_none(cid))
        renewal = Renewal(ttl_s=20.0)
        refused: UsageError | None = None
        try:
            view: ClaimView = self.run(
                self.side.renew_claim(ClaimId(cid), OwnerScope(OWNER), renewal)
            )
        except UnknownClaim:
            assert cid not in self.taken
            return
        except UsageError as exc:
            refused = exc
        assert before is not None
        if refused is not None:
            assert refused.field == "claim_id", refused
            # ended before, or it ended meanwhile and the refusal says so (on vLLM the
            # connector may have shed a soft hold the gateway had not heard of yet)
            after = self.run(self._view_or_none(cid))
            assert after is not None
            assert before.state.terminal or after.state.terminal, (before, after, refused)
            return
        assert not before.state.terminal, f"an ended claim was renewed: {before}"
        assert not view.state.terminal, view

    async def _view_or_none(self, cid: str) -> ClaimView | None:
        try:
            return await self.side.get_claim(ClaimId(cid), OwnerScope(OWNER))
        except UnknownClaim:
            return None

    @rule(cid=st.sampled_from(IDS))
    def another_owner_cannot_read_it(self, cid: str) -> None:
        cid = self.ns + cid
        try:
            self.run(self.side.get_claim(ClaimId(cid), OwnerScope(OTHER)))
        except ScopeViolation:
            assert cid in self.taken
        except UnknownClaim:
            assert cid not in self.taken
        else:
            raise AssertionError(f"owner {OTHER!r} read {OWNER!r}'s claim {cid!r}")

    def teardown(self) -> None:
        for cid in self.taken - set(self.ended):  # what a run holds goes with it
            self.run(self.side.release_claim(ClaimId(cid), OwnerScope(OWNER)))

    @invariant()
    def ended_claims_stay_ended(self) -> None:
        for cid in self.taken:
            view: ClaimView = self.run(self.side.get_claim(ClaimId(cid), OwnerScope(OWNER)))
            if cid in self.ended:
                assert view.state is self.ended[cid], (cid, self.ended[cid], view.state)
            elif view.state.terminal:
                self.ended[cid] = view.state

    @invariant()
    def events_are_numbered_without_gaps(self) -> None:
        events = self._events()
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        per_claim: dict[str | None, list[int]] = {}
        for e in events:
            if e.claim_id is not None:
                per_claim.setdefault(e.claim_id, []).append(e.event_sequence)
        for cid, numbers in per_claim.items():
            assert numbers == list(range(len(numbers))), (cid, numbers)


def loop_runner() -> tuple[asyncio.AbstractEventLoop, Callable[[Awaitable[Any]], Any]]:
    """A private event loop and a ``run`` for a machine (hypothesis drives it synchronously)."""
    loop = asyncio.new_event_loop()

    def run(coro: Awaitable[Any]) -> Any:
        return loop.run_until_complete(coro)

    return loop, run
