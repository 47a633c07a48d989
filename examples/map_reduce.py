"""A Send map-reduce: one LLM call per section in parallel, then a reduce call.

Run: .venv/bin/python examples/map_reduce.py
"""

import asyncio
import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import agentclaims


class State(TypedDict):
    sections: list[str]
    summaries: Annotated[list[str], operator.add]
    final: str


async def main() -> None:
    backend = agentclaims.EmbeddedBackend(num_blocks=1024, block_size=16)
    client = agentclaims.openai_client(backend)
    preamble = "Summarise the section for a technical brief. " * 20

    async def ask(text: str) -> str:
        reply = await client.chat.completions.create(
            model="scripted",
            messages=[{"role": "system", "content": preamble}, {"role": "user", "content": text}],
        )
        return reply.choices[0].message.content or ""

    async def summarise(state: dict) -> dict:
        return {"summaries": [await ask(state["section"])]}

    async def reduce(state: State) -> dict:
        return {"final": await ask(" ".join(state["summaries"]))}

    def fan_out(state: State) -> list[Send]:
        return [Send("summarise", {"section": s}) for s in state["sections"]]

    builder = StateGraph(State)
    builder.add_node("summarise", summarise)
    builder.add_node("reduce", reduce)
    builder.add_conditional_edges(START, fan_out, ["summarise"])
    builder.add_edge("summarise", "reduce")
    builder.add_edge("reduce", END)
    graph = agentclaims.claimed_session(builder.compile(), backend=backend)
    run = graph.run()  # this run's handle
    out = await run.ainvoke(
        {"sections": ["blocks", "claims", "harm"], "summaries": [], "final": ""}
    )
    print(out["final"][:80], run.stats)
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
