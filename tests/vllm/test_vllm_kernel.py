"""The claim kernel's property suite (``tests/kernel/kvsides.py``) on the vLLM side: a
``VllmKV`` in front of the session's real vLLM with the agentclaims connector, the same rules
and invariants as on the reference engine and ``FakeKV``."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
from conftest import VllmServer
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from kernel.kvsides import KernelMachine, Side, loop_runner

from agentclaims.vllm.kv import VllmKV

pytestmark = pytest.mark.vllm
BS = 32


class OnVllm(KernelMachine):
    server: VllmServer

    def __init__(self) -> None:
        self.loop, self._run = loop_runner()
        super().__init__()

    def make_side(self) -> Side:
        return VllmKV(self.server.url, self.server.key, block_size=BS)

    def run(self, coro: Awaitable[Any]) -> Any:
        return self._run(coro)

    def prompt_tokens(self, n: int) -> list[int]:
        return [3 + (n * 37 + i) % 900 for i in range(BS + 8)]

    def teardown(self) -> None:
        try:
            super().teardown()
            assert isinstance(self.side, VllmKV)
            self.run(self.side.aclose())
        finally:
            self.loop.close()


def test_the_kernel_properties_hold_on_vllm(vllm_server: VllmServer) -> None:
    OnVllm.server = vllm_server
    run_state_machine_as_test(
        OnVllm,
        settings=settings(
            max_examples=6,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        ("chat", {"messages": "hi"}, "messages"),
        ("chat", {"messages": [{"role": "user", "content": "hi"}], "tools": [1]}, "tools"),
        ("completion", {"prompt": ["a", "b"]}, "prompt"),
        ("embeddings", {"input": "hi"}, "kind"),
    ],
)
def test_the_vllm_writer_checks_a_body_before_anything_is_sent(
    kind: str, body: dict[str, Any], field: str
) -> None:
    """``VllmKV.prepare`` refuses a body of the wrong shape itself, as the scripted writer
    does: the gateway lets go of no claim the call releases (nothing listens on port 9)."""
    from agentclaims.errors import UsageError
    from agentclaims.protocol import CompletionCall

    kv = VllmKV("http://127.0.0.1:9", "key", block_size=BS)
    with pytest.raises(UsageError) as caught:
        kv.prepare(CompletionCall(kind, body))  # type: ignore[arg-type]
    assert caught.value.field == field
    assert kv.riding.rode == 0
    assert kv.completions == 0
