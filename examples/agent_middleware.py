"""A LangChain 1.x agent with claims from its middleware: a conversation of three turns.

`ClaimsMiddleware` makes each turn (each `ainvoke` on the thread) a claimed session: the model
calls carry claims, the tool calls hold them, and the claim on what a turn leaves cached keeps
the conversation's prefix for the next turn.

Run: .venv/bin/python examples/agent_middleware.py                   (the embedded default)
     .venv/bin/python examples/agent_middleware.py --url http://127.0.0.1:8099   (a gateway,
     e.g. `agentclaims serve --kv vllm ...` in front of a real vLLM: docs/vllm.md)
"""

import argparse
import asyncio

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import agentclaims
from agentclaims.gateway.text import Reply, TextRequest

SYSTEM_PROMPT = "You answer questions about KV caches, briefly, and search when unsure. " * 3
QUESTIONS = ("What is a KV cache?", "Why do agents lose theirs?", "What keeps it?")


@tool
async def search(query: str) -> str:
    """Search the notes."""
    await asyncio.sleep(0.05)  # a tool that takes a while: the claim holds the prefix meanwhile
    return f"notes about {query}: " + "prefix blocks, eviction, reuse. " * 8


def script(request: TextRequest) -> Reply | str:
    """The embedded model: search once per question, then answer."""
    last = next(i for i, m in reversed(list(enumerate(request.messages))) if m["role"] == "user")
    searched = any(m.get("role") == "tool" for m in request.messages[last:])
    return "An answer from the notes." if searched else Reply.tool("search", {"query": "kv"})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a gateway's URL (default: the embedded backend)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    if args.url:
        backend = agentclaims.HTTPBackend(args.url, api_key=args.api_key, timeout_s=120)
        served = await agentclaims.openai_client(backend).models.list()
        model = agentclaims.chat_model(backend, model=served.data[0].id, max_tokens=args.max_tokens)
    else:
        backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
        model = agentclaims.chat_model(backend)
    claims = agentclaims.ClaimsMiddleware(backend)
    agent = create_agent(
        model,
        [search],
        system_prompt=SYSTEM_PROMPT,
        middleware=[claims],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "kv-questions"}}
    for question in QUESTIONS:
        result = await agent.ainvoke({"messages": [HumanMessage(question)]}, config)
        stats = claims.last_session.stats
        print(
            f"{question!r} -> {str(result['messages'][-1].content)[:40]!r}: "
            f"{stats.llm_calls} LLM call(s), {stats.tool_calls} tool call(s), "
            f"{stats.cached_tokens}/{stats.prompt_tokens} prompt tokens cached, "
            f"claims {stats.claims_accepted} accepted, {stats.claims_refused} refused"
        )
    print(f"open sessions: {claims.open_sessions}")
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
