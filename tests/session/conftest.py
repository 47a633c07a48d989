"""Fixtures of the session tests: the backends each LangGraph surface test runs on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from servers import gateway_process
from surface import SCRIPT, SCRIPT_JSON

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.http import HTTPBackend


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `agentclaims serve` process with the scripted replies above."""
    script = tmp_path_factory.mktemp("gw") / "script.json"
    script.write_text(json.dumps(SCRIPT_JSON))
    with gateway_process("--blocks", "2048", "--block-size", "16", "--script", str(script)) as url:
        yield url


@pytest.fixture(params=["embedded", "http"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each test twice: on the embedded default and over the real gateway process."""
    if request.param == "embedded":
        b: Any = EmbeddedBackend(num_blocks=2048, block_size=16, script=SCRIPT)
    else:
        b = HTTPBackend(request.getfixturevalue("gateway_url"))
    yield b
    await b.aclose()
