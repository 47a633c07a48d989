"""A plain asyncio tool loop: the prefix claim is held across each tool call.

Run: .venv/bin/python examples/tool_loop.py
"""

import asyncio

import agentclaims
from agentclaims.gateway.text import Reply, TextRequest


def script(request: TextRequest) -> Reply | str:
    return Reply.tool("search", {"q": "kv"}) if request.turn < 3 else "final answer"


async def main() -> None:
    backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    client = agentclaims.openai_client(backend)
    messages: list[dict] = [
        {"role": "system", "content": "You use tools. " * 40},
        {"role": "user", "content": "go"},
    ]
    async with agentclaims.ClaimedSession(backend, log_dir="agentclaims-logs") as session:
        with session.node("agent"):
            while True:
                reply = (
                    (await client.chat.completions.create(model="scripted", messages=messages))
                    .choices[0]
                    .message
                )
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:
                    break
                for call in reply.tool_calls:
                    async with session.tool_call(call.function.name):  # holds the claim meanwhile
                        await asyncio.sleep(0.02)
                    messages.append(
                        {"role": "tool", "tool_call_id": call.id, "content": "result " * 30}
                    )
    # the stats are whole once the session has ended (it takes in a call's answer, the
    # claim that rode on it included, as its next step begins)
    print(reply.content, session.stats)
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
