"""The public surface: what ``agentclaims`` exports, and that importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agentclaims


def test_all_is_sorted_and_every_name_resolves():
    """__all__ is sorted and each exported name is a real attribute."""
    assert list(agentclaims.__all__) == sorted(agentclaims.__all__)
    for name in agentclaims.__all__:
        assert getattr(agentclaims, name) is not None
    assert sorted(dir(agentclaims)) == sorted(agentclaims.__all__)


@pytest.mark.parametrize("module", ["agentclaims", "agentclaims.bindings"])
def test_import_does_not_load_heavy_dependencies(module: str):
    """Importing it loads neither LangGraph, LangChain, OpenAI, the gateway nor matplotlib."""
    code = (
        f"import sys, {module}; "
        "heavy = [m for m in ('langgraph', 'langchain_core', 'starlette', 'matplotlib', 'openai') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_unknown_attribute_is_an_attribute_error():
    """A name that is not exported raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="NoSuchThing"):
        agentclaims.NoSuchThing  # noqa: B018
