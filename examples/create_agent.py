"""A LangChain 1.x agent (`create_agent`), unmodified, claimed by wrapping its graph.

`claimed_session(agent, ...)` reads the agent's `model <-> tools` loop as its Agent Execution
Graph and runs each call of the agent in a session of its own.

Run: .venv/bin/python examples/create_agent.py
"""

import asyncio

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

import agentclaims
from agentclaims.gateway.text import Reply, TextRequest


@tool
async def search(query: str) -> str:
    """Search the web."""
    await asyncio.sleep(0.01)
    return f"three papers about {query}"


def script(request: TextRequest) -> Reply | str:
    rounds = sum(1 for m in request.messages if m.get("role") == "tool")
    return (
        Reply.tool("search", {"query": f"kv claims {rounds}"})
        if rounds < 3
        else "done: see the papers"
    )


async def main() -> None:
    backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    agent = create_agent(
        agentclaims.chat_model(backend),
        [search],
        system_prompt="You are a careful researcher. " * 20,
    )
    claimed = agentclaims.claimed_session(agent, backend=backend)
    run = claimed.run()  # this run's handle
    result = await run.ainvoke({"messages": [HumanMessage("find KV cache papers")]})
    print(result["messages"][-1].content, run.stats)
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
