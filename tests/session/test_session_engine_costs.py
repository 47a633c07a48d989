"""A session that learns what calls cost on its engine (``engine_costs``) plans with the cost
per block the engine's answers show: the reference engine behind the real gateway in-process,
its service time modelled on fake time, so each call's time is exactly what it computed."""

from __future__ import annotations

import pytest
from test_session_reactions import FakeTime, ask

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.engine import ServiceTimes
from agentclaims.errors import UsageError
from agentclaims.graph import EngineCosts
from agentclaims.session import ClaimedSession

PREFILL_S_PER_TOKEN = 0.001  # one 16-token block: 16 ms
BLOCK = 16


async def test_the_cost_per_block_is_learned_from_the_calls() -> None:
    """Calls computing 2 to 30 new blocks each: the fitted recompute time per block is the
    engine's (16 tokens x 1 ms, give or take the partial blocks), and the session's workflow
    plans with it; before enough calls, with the prior."""
    t = FakeTime()
    backend = EmbeddedBackend(
        num_blocks=512,
        block_size=BLOCK,
        clock=t.clock_ns,
        sleep=t.sleep,
        service=ServiceTimes(prefill_s_per_token=PREFILL_S_PER_TOKEN, decode_s_per_token=0.0),
    )
    costs = EngineCosts(prior_reload_s_per_block=0.002)
    async with ClaimedSession(
        backend, sleep=t.sleep, clock=t.clock_s, engine_costs=costs, planner="default"
    ) as session:
        assert session.workflow.reload_s_per_block == 0.002
        for i in range(16):
            words = 20 + 29 * ((i * 7) % 16)  # prompts of varied size, all new tokens
            with session.node("agent"):
                await ask(backend, [{"role": "user", "content": f"call{i} " * words}])
            if i == 2:
                assert not costs.learned
                assert session.workflow.reload_s_per_block == 0.002
        await session.settle()
    assert costs.calls == 16
    assert costs.learned
    assert costs.reload_s_per_block == pytest.approx(BLOCK * PREFILL_S_PER_TOKEN, rel=0.2)
    assert session.workflow.reload_s_per_block == costs.reload_s_per_block
    await backend.aclose()


def test_engine_costs_must_be_an_engine_costs() -> None:
    backend = EmbeddedBackend(num_blocks=64)
    with pytest.raises(UsageError) as info:
        ClaimedSession(backend, engine_costs=0.002)  # type: ignore[arg-type]
    assert info.value.field == "engine_costs"
