"""The public surface: what ``agentclaims`` exports, and that importing it stays light."""

from __future__ import annotations

import builtins
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentclaims
from agentclaims import contract, errors

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
    "aiohttp",
    "yaml",
    "jsonschema",
)


@pytest.mark.parametrize("module", ["agentclaims", "agentclaims.bindings"])
def test_import_does_not_load_heavy_dependencies(module: str):
    """Importing it in a fresh interpreter loads none of HEAVY (no LangGraph, LangChain, OpenAI,
    gateway, server, HTTP client, networkx, matplotlib, PyYAML or jsonschema)."""
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "", f"import {module} loaded: {out.stdout.strip()}"


def test_hashing_blocks_does_not_load_the_reference_engine():
    """A KV side that only hashes blocks (``agentclaims.engine.blocks``) loads none of the
    engine, its arbiter or its policies; the engine's names still load on first use."""
    code = (
        "import sys, agentclaims.engine.blocks; "
        "print(','.join(sorted(m for m in sys.modules if m.startswith('agentclaims.engine.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "agentclaims.engine.blocks"
    from agentclaims.engine import ReferenceKV
    from agentclaims.engine.kv import ReferenceKV as Defined

    assert ReferenceKV is Defined
    import agentclaims.engine as engine

    with pytest.raises(AttributeError, match="NoSuchPolicy"):
        engine.NoSuchPolicy  # noqa: B018


def test_unknown_attribute_is_an_attribute_error():
    """A name that is not exported raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="NoSuchThing"):
        agentclaims.NoSuchThing  # noqa: B018


def test_contract_ids_are_exported():
    """The ids of the user-facing surface are the contract's NewTypes."""
    for name in ("ClaimId", "PrefixId", "OwnerScope"):
        assert getattr(agentclaims, name) is getattr(contract, name)
        assert name in agentclaims.__all__


def test_backend_protocol_is_exported_lazily():
    """``agentclaims.Backend`` is the protocol every backend implements."""
    from agentclaims.backends.base import Backend

    assert agentclaims.Backend is Backend


_TREE_LINE = re.compile(r"^[ |]*(?:\+-- )?(?P<name>[A-Z]\w+)(?: \(also (?P<also>\w+)\))?")


def _docstring_tree() -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """``name -> (parent, extra bases)`` as errors.py's docstring draws the tree."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    tree: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name) from the root down
    for line in block.splitlines():
        match = _TREE_LINE.match(line[4:])  # the block is indented by four
        if match is None:
            continue  # a continuation line of a description
        column = match.start("name")
        while stack and stack[-1][0] >= column:
            stack.pop()
        parent = stack[-1][1] if stack else None
        also = (match["also"],) if match["also"] else ()
        assert match["name"] not in tree, f"{match['name']} is drawn twice"
        tree[match["name"]] = (parent, also)
        stack.append((column, match["name"]))
    return tree


def test_error_tree_in_the_docstring_is_the_class_tree():
    """errors.py's docstring lists exactly its exception classes, each with the parent (and
    the builtin base) it really has, and each is exported from agentclaims."""
    defined = {
        name: cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type)
        and issubclass(cls, BaseException)
        and cls.__module__ == errors.__name__
    }
    tree = _docstring_tree()
    assert sorted(tree) == sorted(defined) == sorted(errors.__all__)
    for name, (parent, also) in tree.items():
        cls = defined[name]
        expected = (Exception,) if parent is None else (defined[parent],)
        assert cls.__bases__ == expected + tuple(getattr(builtins, b) for b in also), name
        assert getattr(agentclaims, name) is cls
        assert name in agentclaims.__all__
