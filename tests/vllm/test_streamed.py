"""``UpstreamStream``: what a client gets of vLLM's streamed events (token ids and the usage
chunk only when it asked for them, nothing else changed) and what the gateway keeps of them for
the request's KV life (the prompt's and the reply's token ids, the finish reason, the usage),
read from batches of events as they came."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentclaims.vllm.streamed import UpstreamStream

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}


def _events() -> list[dict[str, Any]]:
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}
    first = {**HEAD, "prompt_token_ids": [1, 2, 3], "choices": [role]}
    tokens = [
        {**HEAD, "choices": [{"index": 0, "delta": {"content": w}, "token_ids": [t]}]}
        for w, t in (("a", 10), ("b", 11))
    ]
    done = {**HEAD, "choices": [{"index": 0, "delta": {}, "token_ids": [12]}]}
    done["choices"][0]["finish_reason"] = "length"
    usage = {**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}
    usage["kv_transfer_params"] = {"agentclaims": {"nonce": "n"}}
    return [first, *tokens, done, usage]


class _Batches:
    """The events in the batches they came in (``Stream.batches``' shape)."""

    def __init__(self, batches: list[list[dict[str, Any]]]) -> None:
        self._batches = batches
        self.closed = False

    async def batches(self) -> Any:
        for batch in self._batches:
            yield batch

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("keep_ids", [False, True])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("cut", [1, 2, 5])
async def test_the_client_gets_vllms_chunks_and_the_gateway_keeps_the_kv_life(
    keep_ids: bool, usage: bool, cut: int
) -> None:
    events = _events()
    batches = [events[i : i + cut] for i in range(0, len(events), cut)]
    settled: list[dict[str, Any]] = []

    async def settle(data: dict[str, Any]) -> Any:
        settled.append(data)
        return "result"

    stream = UpstreamStream(
        _Batches(copy.deepcopy(batches)),  # type: ignore[arg-type]
        keep_token_ids=keep_ids,
        include_usage=usage,
        settle=settle,
    )
    assert await stream.start() is None  # the first token came
    got = [chunk async for batch in stream.batches() for chunk in batch]
    assert stream.result == "result"
    # what the gateway keeps, however the events were batched
    assert settled == [
        {
            "id": "chatcmpl-1",
            "prompt_token_ids": [1, 2, 3],
            "choices": [{"token_ids": [10, 11, 12], "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3},
        }
    ]
    assert stream.shape == HEAD
    # what the client gets: vLLM's chunks, less what it did not ask for, never the receipt
    expected = _events()
    if not usage:
        expected = [e for e in expected if e["choices"]]
    for e in expected:
        e.pop("kv_transfer_params", None)
        if not keep_ids:
            e.pop("prompt_token_ids", None)
            for c in e["choices"]:
                c.pop("token_ids", None)
    assert got == expected
