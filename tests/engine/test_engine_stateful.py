"""A stateful property test of KVEngine: random claims, requests, steps and time.

After every step: no true harm of a hard claim, blocks conserved, at most one terminal state per
claim, ordered event sequences, and the claims rebuilt from events alone equal the engine's view.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from agentclaims.contract import (
    CacheIdentity,
    ClaimEvent,
    ClaimSpec,
    ClaimState,
    ContiguousRange,
    EventName,
    LeadingPrefixAtLeast,
    ProtectionMode,
    rebuild_claims,
)
from agentclaims.engine import BlockHash, KVEngine, hash_token_blocks, prefix_id_of
from agentclaims.errors import ScopeViolation, UsageError

BLOCK_SIZE = 2
IDENTITY = CacheIdentity("agentclaims-embedded", "scripted", "agentclaims-bytes", "default", 2)
OWNERS = ("a", "b")
TERMINAL_EVENTS = {
    EventName.RESIDENT_CLAIM_REJECTED,
    EventName.RESIDENT_CLAIM_DEMOTED,
    EventName.RESIDENT_CLAIM_EXPIRED,
    EventName.RESIDENT_CLAIM_HARMED,
}


def _roots() -> list[list[BlockHash]]:
    """Three token streams; their leading slices are the prefix pool (so prefixes overlap)."""
    return [
        hash_token_blocks([root * 1_000 + t for t in range(12 * BLOCK_SIZE)], BLOCK_SIZE)
        for root in range(3)
    ]


PREFIXES: list[list[BlockHash]] = [r[:k] for r in _roots() for k in (1, 2, 4, 6, 9, 12)]
prefixes = st.sampled_from(PREFIXES)


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class EngineMachine(RuleBasedStateMachine):
    """Drives one small, pressured engine; checks the contract's invariants after each rule."""

    claims = Bundle("claims")
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.engine = KVEngine(
            20,
            BLOCK_SIZE,
            host_blocks=3,
            owner_cap_blocks=18,
            max_duration_steps=6,
            clock=self.clock,
        )
        self.events: list[ClaimEvent] = []
        self.owner_of: dict[str, str] = {}
        self.counter = 0
        self.seen: Counter[EventName] = Counter()

    def _next(self, kind: str) -> str:
        self.counter += 1
        return f"{kind}{self.counter}"

    @rule(
        target=claims,
        hashes=prefixes,
        mode=st.sampled_from([*ProtectionMode, ProtectionMode.HARD_PROTECTED]),
        owner=st.sampled_from(OWNERS),
        leading=st.booleans(),
        cut=st.integers(0, 9),
        steps=st.sampled_from([None, None, None, 2, 6]),
        ttl=st.sampled_from([None, None, None, 0.5, 5.0]),
    )
    def submit(
        self,
        hashes: list[BlockHash],
        mode: ProtectionMode,
        owner: str,
        leading: bool,
        cut: int,
        steps: int | None,
        ttl: float | None,
    ) -> str:
        n = len(hashes)
        start = min(cut, n - 1)
        predicate = (
            LeadingPrefixAtLeast(max(1, n - cut)) if leading else ContiguousRange(start, n - start)
        )
        if mode is ProtectionMode.EXPIRING and steps is None and ttl is None:
            steps = 3
        claim_id = self._next("c")
        spec = ClaimSpec(
            claim_id, owner, prefix_id_of(hashes), IDENTITY, n, mode, predicate, steps, ttl
        )
        decision = self.engine.submit_claim(spec, hashes)
        assert decision.state in (ClaimState.ACCEPTED, ClaimState.MATERIALIZED, ClaimState.REFUSED)
        self.owner_of[claim_id] = owner
        return claim_id

    @rule(claim_id=claims, wrong=st.booleans())
    def release(self, claim_id: str, wrong: bool) -> None:
        owner = self.owner_of[claim_id]
        if wrong:
            other = OWNERS[1 - OWNERS.index(owner)]
            seq = self.engine.last_seq
            with pytest.raises(ScopeViolation):
                self.engine.release_claim(claim_id, other)
            assert self.engine.last_seq == seq
            return
        view = self.engine.release_claim(claim_id, owner)
        assert not view.state.live

    @rule(claim_id=claims, steps=st.integers(1, 10))
    def renew(self, claim_id: str, steps: int) -> None:
        owner = self.owner_of[claim_id]
        if not self.engine.get_claim(claim_id, owner).state.live:
            with pytest.raises(UsageError, match=r"^claim_id: "):
                self.engine.renew_claim(claim_id, owner, duration_steps=steps)
            return
        view = self.engine.renew_claim(claim_id, owner, duration_steps=steps)
        assert view.expires_at_step == self.engine.step_count + min(steps, 6)

    @precondition(lambda self: len(self.engine.active_requests()) < 2)
    @rule(
        target=requests,
        hashes=prefixes,
        extra=st.integers(0, 2),
        admit=st.booleans(),
        unique_tail=st.integers(0, 2),
    )
    def begin(self, hashes: list[BlockHash], extra: int, admit: bool, unique_tail: int) -> str:
        return self._begin(hashes, extra, admit, unique_tail)

    def _begin(self, hashes: list[BlockHash], extra: int, admit: bool, unique_tail: int) -> str:
        request_id = self._next("r")
        tail = hash_token_blocks(
            [self.counter * 7_919 + t for t in range(unique_tail * BLOCK_SIZE)], BLOCK_SIZE
        )
        outcome = self.engine.begin(
            request_id, [*hashes, *tail], prompt_blocks=len(hashes), extra_blocks=extra, admit=admit
        )
        if not outcome.served:
            assert outcome.hit_blocks == outcome.computed_blocks == 0
            return request_id  # nothing to finish: finish() will refuse it by name
        assert outcome.hit_blocks + outcome.restored_blocks + outcome.computed_blocks == len(
            hashes
        ) + len(tail)
        return request_id

    @rule(
        hashes=prefixes,
        extra=st.integers(0, 2),
        admit=st.booleans(),
        unique_tail=st.integers(0, 2),
    )
    def run_request(
        self, hashes: list[BlockHash], extra: int, admit: bool, unique_tail: int
    ) -> None:
        """A request that begins and finishes at once: it leaves its KV resident."""
        request_id = self._begin(hashes, extra, admit, unique_tail)
        if request_id in self.engine.active_requests():
            self.engine.finish(request_id)

    @rule(request_id=consumes(requests))
    def finish(self, request_id: str) -> None:
        if request_id in self.engine.active_requests():
            self.engine.finish(request_id)
        else:
            seq = self.engine.last_seq
            with pytest.raises(UsageError, match=r"^request_id: "):
                self.engine.finish(request_id)
            assert self.engine.last_seq == seq

    @rule(n=st.integers(1, 3))
    def step(self, n: int) -> None:
        self.engine.step(n)

    @rule(seconds=st.sampled_from([0.25, 1.0, 3.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.now += int(seconds * 1e9)

    @precondition(lambda self: bool(self.owner_of))
    @rule(data=st.data())
    def read_claims(self, data: st.DataObject) -> None:
        claim_id = data.draw(st.sampled_from(sorted(self.owner_of)))
        self.engine.get_claim(claim_id, self.owner_of[claim_id])

    @invariant()
    def contract_holds(self) -> None:
        engine = self.engine
        engine.check_invariants()  # blocks conserved, maps agree, no hard harm
        assert engine.stats.true_harm_hard == 0
        views = {cid: engine.get_claim(cid, owner) for cid, owner in self.owner_of.items()}
        new = engine.take_events()  # after get_claim, which may expire due claims
        if new:
            assert new[0].seq > (self.events[-1].seq if self.events else 0)
            assert all(a.seq < b.seq for a, b in itertools.pairwise(new))
        self.events.extend(new)

        modes = {
            e.claim_id: e.data["protection_mode"]
            for e in self.events
            if e.event is EventName.RESIDENT_CLAIM_SUBMITTED
        }
        terminal: Counter[str | None] = Counter()
        last_sequence: dict[str | None, int] = {}
        for e in self.events:
            assert e.event_sequence > last_sequence.get(e.claim_id, -1)
            last_sequence[e.claim_id] = e.event_sequence
            if e.event in TERMINAL_EVENTS:
                terminal[e.claim_id] += 1
            if e.event is EventName.RESIDENT_CLAIM_HARMED:
                assert modes[e.claim_id] != ProtectionMode.HARD_PROTECTED.value
        assert all(count == 1 for count in terminal.values())

        rebuilt = rebuild_claims(self.events)
        assert set(rebuilt) == set(views)
        for claim_id, view in views.items():
            hist = rebuilt[claim_id]
            assert hist.state is view.state
            assert hist.mode is view.protection_mode
            assert hist.prefix_id == view.object_id
            assert hist.end_reason == view.end_reason
            if view.predicate_holds:
                assert hist.materialized
        self.seen.update(e.event for e in new)


EngineMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_engine_state_machine = EngineMachine.TestCase
