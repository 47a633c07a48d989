"""A LangGraph supervisor routing to tool-using ReAct workers, in one claimed session.

Run: .venv/bin/python examples/supervisor.py
"""

import asyncio

from langchain_core.messages import HumanMessage

import agentclaims
from agentclaims.demo.workflows import build_supervisor, script, task_for


async def main() -> None:
    backend = agentclaims.EmbeddedBackend(num_blocks=1024, block_size=16, script=script)
    graph = agentclaims.claimed_session(
        build_supervisor(agentclaims.chat_model(backend)), backend=backend
    )
    run = graph.run()  # this run's handle
    result = await run.ainvoke({"messages": [HumanMessage(task_for(0))]}, {"recursion_limit": 60})
    stats = run.stats
    print(result["messages"][-2].content)
    print(f"LLM calls {stats.llm_calls}, hit ratio {stats.hit_ratio:.2f}, claims {stats.modes}")
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
