"""``ClaimIndex``: the session's claims by id, as its events name them, kept as claims end
rather than built from the whole history per answer: at every step of a session it says what
the whole lists say (held over let go over ended, the latest of each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentclaims.contract import ClaimId, PrefixId
from agentclaims.planner import ClaimPlan
from agentclaims.session.events import ClaimIndex
from agentclaims.session.held import HeldClaim

IDS = [ClaimId(f"s-c{i}") for i in range(6)]


@dataclass
class _Claims:
    """What ``ClaimIndex`` reads (``ClaimIO``'s lists)."""

    held: dict[str, HeldClaim] = field(default_factory=dict)
    releasing: list[HeldClaim] = field(default_factory=list)
    ended: list[HeldClaim] = field(default_factory=list)


def _claim(claim_id: ClaimId, node: str) -> HeldClaim:
    return HeldClaim(claim_id, node, PrefixId("p"), ClaimPlan(None), "b", 0.0)


def _whole(io: _Claims) -> dict[ClaimId, HeldClaim]:
    """By id from the whole lists, as every answer used to build it."""
    out = {h.claim_id: h for h in io.ended}
    out.update((h.claim_id, h) for h in io.releasing)
    out.update((h.claim_id, h) for h in io.held.values())
    return out


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["hold", "let_go", "end", "drop", "new_list"]),
        st.sampled_from(IDS),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=40,
)


@given(_STEPS)
def test_the_index_says_what_the_whole_lists_say_at_every_step(steps: list[Any]) -> None:
    io, index = _Claims(), ClaimIndex()
    for op, claim_id, node in steps:
        claim = _claim(claim_id, node)
        if op == "hold":
            io.held[node] = claim
        elif op == "let_go":
            io.releasing.append(claim)
        elif op == "end":
            io.ended.append(claim)
        elif op == "drop" and io.releasing:
            io.releasing.pop(0)
        elif op == "new_list" and io.ended:  # the ended claims as another list, as long
            io.ended = [*io.ended[:-1], claim]
        seen = index.of(io)  # type: ignore[arg-type]
        whole = _whole(io)
        for claim_id in IDS:
            assert seen.get(claim_id) is whole.get(claim_id), (claim_id, op)
