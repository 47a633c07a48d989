"""The reference engine's answers say how its pool churns (``agentclaims.pool``), as vLLM's
connector does from its KV events: usable and free blocks, evictions per second over the last
30 s of the engine's clock, and how long a block freed now would survive them."""

from __future__ import annotations

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.engine import ServiceTimes

NO_WAIT = ServiceTimes(prefill_s_per_token=0.0, decode_s_per_token=0.0)


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


async def test_answers_carry_the_pools_churn():
    clock = Clock()
    backend = EmbeddedBackend(num_blocks=32, block_size=16, clock=clock, service=NO_WAIT)
    client = agentclaims.openai_client(backend)

    async def pool_after(words: str) -> dict:
        reply = await client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": words}]
        )
        return reply.model_extra["agentclaims"]["pool"]

    first = await pool_after("alpha " * 120)
    assert first["usable_blocks"] == 32
    assert first["evicted_per_s"] == 0.0
    assert first["survival_s"] is None  # nothing evicted: no end in sight
    assert first["window_s"] == 0.0  # watched for no time yet: it vouches for nothing
    clock.ns += 2_000_000_000
    second = await pool_after("beta " * 420)  # more than the pool keeps: evictions
    assert second["evicted_blocks"] > 0
    assert second["evicted_per_s"] == round(second["evicted_blocks"] / 2.0, 3)
    assert second["survival_s"] is not None
    assert second["survival_s"] >= 0.0
    assert second["window_s"] == 2.0
    clock.ns += 60_000_000_000  # a minute later the evictions are out of the window
    third = await pool_after("gamma")
    assert third["window_s"] == 30.0
    assert third["evicted_per_s"] < second["evicted_per_s"]
    await backend.aclose()


async def test_answers_say_how_often_an_eviction_was_regretted():
    """``evicted_reused_p``: of the blocks evicted in the window, the share computed again.
    Two prompts that do not fit the pool together, sent in turn, evict each other and are
    computed again every time (near 1); prompts never sent again are never recomputed (0);
    under 32 evictions in the window the engine says nothing (``None``)."""
    clock = Clock()

    async def pools(prompts: list[str]) -> list[dict]:
        backend = EmbeddedBackend(num_blocks=32, block_size=16, clock=clock, service=NO_WAIT)
        client = agentclaims.openai_client(backend)
        out = []
        for words in prompts:
            clock.ns += 100_000_000
            reply = await client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": words}], max_tokens=1
            )
            out.append(reply.model_extra["agentclaims"]["pool"])
        await backend.aclose()
        return out

    first = (await pools(["alpha " * 40]))[0]
    assert first["evicted_reused_p"] is None  # nothing evicted: nothing to tell
    turns = await pools([("alpha " if i % 2 else "beta ") * 300 for i in range(8)])
    assert turns[-1]["evicted_blocks"] >= 32
    assert turns[-1]["evicted_reused_p"] >= 0.8, turns[-1]
    fresh = await pools([f"prompt {i} " * 150 for i in range(8)])
    assert fresh[-1]["evicted_blocks"] >= 32
    assert fresh[-1]["evicted_reused_p"] == 0.0, fresh[-1]
