"""The claim kernel's property suite (``kvsides.py``) on the reference engine and on ``FakeKV``;
``tests/vllm/test_vllm_kernel.py`` runs the same suite on a real vLLM server."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from hypothesis import HealthCheck, settings
from kernel.kvsides import KernelMachine, Side, loop_runner

from agentclaims.engine import ReferenceKV
from agentclaims.engine.kv import ServiceTimes
from agentclaims.testing import FakeKV

BS = 4
SETTINGS = settings(
    max_examples=40,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class _InProcess(KernelMachine):
    def __init__(self) -> None:
        self.loop, self._run = loop_runner()
        super().__init__()

    def run(self, coro: Awaitable[Any]) -> Any:
        return self._run(coro)

    def prompt_tokens(self, n: int) -> list[int]:
        return [3 + (n * 37 + i) % 500 for i in range(3 * BS + 1)]

    def teardown(self) -> None:
        super().teardown()
        self.loop.close()


class OnTheReferenceEngine(_InProcess):
    def make_side(self) -> Side:
        return ReferenceKV.create(40, BS, service=ServiceTimes(0.0, 0.0))


class OnFakeKV(_InProcess):
    def make_side(self) -> Side:
        return FakeKV(40, BS)


TestOnTheReferenceEngine = OnTheReferenceEngine.TestCase
TestOnTheReferenceEngine.settings = SETTINGS
TestOnFakeKV = OnFakeKV.TestCase
TestOnFakeKV.settings = SETTINGS
