"""The public entry points keep their types: mypy, run on a small snippet, sees through them.

Each snippet line may end in ``# reveal: REGEX`` (mypy's ``reveal_type`` note there matches)
or ``# error: REGEX`` (an error there matches); any other error fails the test.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]

WORKFLOWS = """
import asyncio

from agentclaims import Backend, ClaimedSession, claimed_session


def check(backend: Backend) -> None:
    @claimed_session(backend=backend)
    async def f(x: int) -> str:
        return str(x)

    async def g(x: int, *, y: str = "") -> list[str]:
        return [y]

    def sync(x: int) -> int:
        return x

    reveal_type(f)  # reveal: ^def \\(x: int\\) -> typing\\.Coroutine\\[Any, Any, str\\]$
    reveal_type(claimed_session(g, backend=backend, horizon=3))  # reveal: ^def \\(x: int, \\*, y: str =\\) -> typing\\.Coroutine\\[Any, Any, list\\[str\\]\\]$
    reveal_type(claimed_session(backend=backend)(g))  # reveal: -> typing\\.Coroutine\\[Any, Any, list\\[str\\]\\]$
    asyncio.run(f(1))
    f("one")  # error: incompatible type "str"; expected "int"
    claimed_session(backend=backend, horizon="x")  # error: No overload variant
    claimed_session(g, backend=backend, horizn=3)  # error: Unexpected keyword argument "horizn"
    claimed_session(sync, backend=backend)  # error: incompatible type
    claimed_session(backend=backend, horizon=3)
    reveal_type(ClaimedSession(backend).owner_scope)  # reveal: ^agentclaims\\.contract\\.ids\\.OwnerScope$
"""

GRAPHS = """
from typing import TypedDict

from langgraph.graph import StateGraph


class State(TypedDict):
    x: int


async def run(backend: Backend) -> None:
    claimed = claimed_session(StateGraph(State).compile(), backend=backend, planner="off")
    reveal_type(claimed)  # reveal: ^agentclaims\\.bindings\\.decorators\\.ClaimedGraph\\[langgraph\\.graph\\.state\\.CompiledStateGraph\\[
    reveal_type(claimed.graph)  # reveal: ^langgraph\\.graph\\.state\\.CompiledStateGraph\\[
    await claimed.ainvoke({"x": 1}, {"recursion_limit": 5})
    await claimed.ainvoke({"x": "one"})  # error: Argument 1 to "ainvoke" of "ClaimedGraph" has incompatible type
    claimed.with_config(run_name="r").invoke({"x": 2})
    claimed.no_such_method()  # error: has no attribute "no_such_method"
"""


def _expectations(source: str) -> dict[int, tuple[str, str]]:
    marks = {}
    for number, line in enumerate(source.splitlines(), start=1):
        match = re.search(r"# (reveal|error): (.+)$", line)
        if match:
            marks[number] = (match[1], match[2])
    return marks


@pytest.mark.slow
def test_mypy_sees_through_claimed_session(tmp_path):
    """A decorated workflow keeps its parameters and result; a wrong option, a sync function
    or a wrong graph input is a type error; a claimed graph keeps the graph's types."""
    source = WORKFLOWS + (GRAPHS if importlib.util.find_spec("langgraph") else "")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    # mypy in a child process: ``mypy.api.run`` in this one would leave millions of objects
    # alive here (every later full garbage collection of the test run would walk them)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            str(snippet),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",  # only the snippet's own errors
            "--no-incremental",
            f"--cache-dir={os.devnull}",  # write no cache: every run checks afresh
            "--show-absolute-path",
            "--hide-error-context",
            "--no-error-summary",
        ],
        cwd=ROOT,  # mypy searches the working directory first: the checkout's agentclaims
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not done.stderr, done.stderr
    stdout = done.stdout
    seen: dict[int, list[tuple[str, str]]] = {}
    for line in stdout.splitlines():
        match = re.match(rf"{re.escape(str(snippet))}:(\d+): (error|note): (.*)$", line)
        assert match, line
        number, kind, message = int(match[1]), match[2], match[3]
        if kind == "note" and message.startswith("Revealed type is "):
            seen.setdefault(number, []).append(("reveal", message[len('Revealed type is "') : -1]))
        elif kind == "error":
            seen.setdefault(number, []).append(("error", message))
    expected = _expectations(source)
    for number, (kind, pattern) in expected.items():
        found = [message for k, message in seen.get(number, []) if k == kind]
        assert any(re.search(pattern, m) for m in found), (number, kind, pattern, found)
    unexpected = {
        number: [m for k, m in items if k == "error"]
        for number, items in seen.items()
        if number not in expected and any(k == "error" for k, _ in items)
    }
    assert not unexpected, unexpected
