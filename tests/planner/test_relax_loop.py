"""The one relax loop (``claim_down_the_ladder``): the session's and the replays' claims walk
the same ladder, in the same order, the same way."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.contract import ProtectionMode
from agentclaims.planner import claim_down_the_ladder, relax_ladder, relax_mode, run_now

MODES = st.sampled_from(list(ProtectionMode))
SOFT = st.sampled_from([ProtectionMode.BEST_EFFORT, ProtectionMode.DEMOTABLE])


@given(MODES | st.none(), SOFT, st.sets(MODES))
def test_it_tries_each_rung_in_turn_until_one_is_accepted(
    first: ProtectionMode | None, soft: ProtectionMode, accepting: set[ProtectionMode]
) -> None:
    """Refused rungs are tried in ladder order; the first accepting one ends the walk; with
    none accepting, every rung was tried and the answer is ``None``."""
    tried: list[ProtectionMode] = []

    async def attempt(mode: ProtectionMode) -> bool:
        tried.append(mode)
        return mode in accepting

    got = run_now(claim_down_the_ladder(first, attempt, soft=soft))
    ladder = list(relax_ladder(first, soft))
    expected = next((m for m in ladder if m in accepting), None)
    assert got == expected
    assert tried == (ladder[: ladder.index(expected) + 1] if expected else ladder)


@given(MODES, SOFT, st.sets(MODES))
def test_a_mode_not_honoured_is_never_submitted(
    first: ProtectionMode, soft: ProtectionMode, honoured: set[ProtectionMode]
) -> None:
    """``usable`` steps past what the backend does not honour without an attempt, and a
    refusal hook that says ``None`` stops the walk at once."""
    tried: list[ProtectionMode] = []

    def usable(mode: ProtectionMode) -> ProtectionMode | None:
        return mode if mode in honoured else relax_mode(mode, soft)

    async def attempt(mode: ProtectionMode) -> bool:
        tried.append(mode)
        return False

    assert run_now(claim_down_the_ladder(first, attempt, soft=soft, usable=usable)) is None
    assert all(m in honoured for m in tried)
    assert tried == [m for m in relax_ladder(first, soft) if m in honoured]
    tried.clear()
    stop = claim_down_the_ladder(first, attempt, usable=usable, refused=lambda m: None)
    assert run_now(stop) is None
    assert len(tried) <= 1


def test_a_refusal_hook_may_raise_and_a_real_await_cannot_run_now() -> None:
    async def refuse(mode: ProtectionMode) -> bool:
        return False

    def fail(mode: ProtectionMode) -> ProtectionMode | None:
        raise LookupError(mode.value)

    with pytest.raises(LookupError, match="expiring"):
        run_now(claim_down_the_ladder(ProtectionMode.EXPIRING, refuse, refused=fail))

    async def over_the_network(mode: ProtectionMode) -> bool:
        await asyncio.sleep(0)  # suspends: only an event loop can run this
        return True

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(claim_down_the_ladder(ProtectionMode.EXPIRING, over_the_network))
    accepted = asyncio.run(claim_down_the_ladder(ProtectionMode.EXPIRING, over_the_network))
    assert accepted is ProtectionMode.EXPIRING
