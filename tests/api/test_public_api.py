"""The public surface: what ``agentclaims`` exports, and that importing it stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import agentclaims

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose ``agentclaims`` is imported


def test_all_is_sorted_and_every_name_resolves():
    """__all__ is sorted and each exported name is a real attribute."""
    assert list(agentclaims.__all__) == sorted(agentclaims.__all__)
    for name in agentclaims.__all__:
        assert getattr(agentclaims, name) is not None
    assert sorted(dir(agentclaims)) == sorted(agentclaims.__all__)


# Optional or heavy third-party packages, each loaded only by the part that uses it.
HEAVY = (
    "langgraph",
    "langchain_core",
    "langchain_openai",
    "starlette",
    "openai",
    "networkx",
    "matplotlib",
    "uvicorn",
    "httpx2",
)


@pytest.mark.parametrize("module", ["agentclaims", "agentclaims.bindings"])
def test_import_does_not_load_heavy_dependencies(module: str):
    """Importing it in a fresh interpreter loads none of HEAVY (no LangGraph, LangChain, OpenAI,
    gateway, server, HTTP client, networkx or matplotlib)."""
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "", f"import {module} loaded: {out.stdout.strip()}"


def test_unknown_attribute_is_an_attribute_error():
    """A name that is not exported raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="NoSuchThing"):
        agentclaims.NoSuchThing  # noqa: B018
