"""Layering: no part of ``agentclaims`` imports a part above it (read from the code with ``ast``).

A part is a subfolder of ``agentclaims/``, or one of the top modules ``errors`` and
``agentclaims`` (the top ``__init__.py``). Every import counts: module-level, function-local
(lazy) and under ``if TYPE_CHECKING:`` (it still names a dependency), except the annotation-only
ones of the parts in ``TYPE_CHECKING_EXEMPT``. docs/architecture.md draws this map.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ANY = frozenset({"*"})

BASE = frozenset({"errors", "_lazy", "_json"})
"""The top modules every part may import: the errors, the lazy loader of a package's names, and
the JSON codec of the per-request path."""

# What each part may import besides itself and BASE (importable by all), lowest first.
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "_lazy": frozenset(),
    "_json": frozenset(),
    "contract": frozenset(),
    "protocol": frozenset({"contract"}),
    "graph": frozenset({"contract"}),
    "planner": frozenset({"contract", "graph"}),
    "observability": frozenset({"contract"}),
    # The claim kernel: what every KV side does the same way (records, events, resolution).
    "kernel": frozenset({"contract", "protocol"}),
    "engine": frozenset({"contract", "protocol", "kernel"}),
    # The gateway's half of the vLLM lowering (launch + the connector's signed operations).
    "vllm": frozenset({"contract", "protocol", "kernel", "engine", "lowering"}),
    "conformance": frozenset({"contract", "protocol", "engine"}),
    "lowering": frozenset({"contract", "protocol", "conformance"}),
    "gateway": frozenset({"contract", "protocol", "engine", "conformance", "lowering"}),
    # Only backends/inprocess.py and embedded.py need the gateway, the engine and vLLM's KV
    # side: they run the gateway in-process.
    "backends": frozenset({"contract", "protocol", "engine", "gateway", "vllm"}),
    "session": frozenset(
        {"contract", "protocol", "graph", "planner", "observability", "backends", "lowering"}
    ),
    "bindings": frozenset({"contract", "protocol", "graph", "session", "backends"}),
    "testing": frozenset(
        {
            "contract",
            "protocol",
            "kernel",
            "engine",
            "gateway",
            "backends",
            "session",
            "observability",
            "lowering",
        }
    ),
    "replay": frozenset(
        {
            "contract",
            "protocol",
            "engine",
            "graph",
            "planner",
            "session",
            "backends",
            "observability",
        }
    ),
    "demo": frozenset(
        {"contract", "protocol", "engine", "gateway", "backends", "session", "bindings", "graph"}
    ),
    "cli": ANY,
    # Anything, but only lazily: test_public_api checks that ``import agentclaims`` stays light.
    "agentclaims": ANY,
}

# errors.py names protocol types in annotations only; its TYPE_CHECKING imports do not count.
TYPE_CHECKING_EXEMPT = frozenset({"errors"})

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agentclaims"


def _part_of(path: Path) -> str:
    """The part a file under ``agentclaims/`` belongs to."""
    relative = path.relative_to(PACKAGE)
    if len(relative.parts) > 1:
        return relative.parts[0]
    # ``__main__`` (``python -m agentclaims``) is the command line's way in, as the top is
    return "agentclaims" if relative.stem in ("__init__", "__main__") else relative.stem


def _module_of(path: Path) -> list[str]:
    """The dotted package a file's relative imports start from, as a list of names."""
    parts = ["agentclaims", *path.relative_to(PACKAGE).with_suffix("").parts]
    return parts[:-1]  # a module's package; for ``__init__`` the package itself


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, absolute module, under TYPE_CHECKING) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_of(path)

    def visit(node: ast.AST, type_checking: bool) -> Iterator[tuple[int, str, bool]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, type_checking
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module == "agentclaims":  # ``from agentclaims import graph`` names a part
                for alias in node.names:
                    yield node.lineno, f"agentclaims.{alias.name}", type_checking
            else:
                yield node.lineno, module, type_checking
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:
                yield from visit(child, type_checking)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, type_checking)

    yield from visit(tree, False)


def _target_part(module: str) -> str | None:
    """The part an absolute module belongs to; ``None`` outside ``agentclaims``."""
    names = module.split(".")
    if names[0] != "agentclaims":
        return None
    if len(names) > 1 and (names[1] in BASE or (PACKAGE / names[1]).is_dir()):
        return names[1]
    return "agentclaims"  # the top module, or a name it exports


def _parts() -> set[str]:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return folders | BASE | {"agentclaims"}


def test_every_part_has_a_place_in_the_map():
    """Each subfolder (and top module) is in ALLOWED, and ALLOWED names only real parts."""
    parts = _parts()
    assert set(ALLOWED) == parts
    for part, allowed in ALLOWED.items():
        assert allowed == ANY or allowed <= parts - {part}, part


def test_the_map_has_no_cycles():
    """ALLOWED is a layering: following "may import" never comes back to where it started."""
    done: set[str] = set()

    def walk(part: str, path: tuple[str, ...]) -> None:
        assert part not in path, " -> ".join([*path, part])
        if part in done or ALLOWED[part] == ANY:
            return
        for lower in sorted(ALLOWED[part] | (frozenset() if part in BASE else BASE)):
            walk(lower, (*path, part))
        done.add(part)

    for part in sorted(ALLOWED):
        walk(part, ())


def test_no_part_imports_a_part_above_it():
    """Every agentclaims import in the package is allowed by ALLOWED."""
    offending = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = _part_of(path)
        allowed = ALLOWED[part]
        if allowed == ANY:
            continue
        for line, module, type_checking in _imports(path):
            target = _target_part(module)
            if target is None or target == part or target in BASE or target in allowed:
                continue
            if type_checking and part in TYPE_CHECKING_EXEMPT:
                continue
            offending.append(
                f"{path.relative_to(ROOT)}:{line} imports {module}"
                f" ({part} may import only: {', '.join(sorted(allowed | BASE))})"
            )
    assert not offending, "imports against the layering:\n" + "\n".join(offending)


def _module_name(path: Path) -> str:
    parts = ["agentclaims", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_of_a_part_import_each_other() -> None:
    """Inside each part, the modules' imports (module-level and lazy; not annotation-only
    ones) form no circle: every module of a part can be read before the ones that use it.
    A package's ``__init__`` gathers its modules' names and is left out."""
    import networkx as nx

    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p.stem != "__init__"]
    known = {_module_name(p) for p in files}
    graph: nx.DiGraph[str] = nx.DiGraph()
    for path in files:
        source = _module_name(path)
        graph.add_node(source)
        for _, module, type_checking in _imports(path):
            target = module if module in known else module.rpartition(".")[0]
            if type_checking or target not in known or target == source:
                continue
            if _part_of(path) == _target_part(target):
                graph.add_edge(source, target)
    cycles = sorted(" -> ".join(c) for c in nx.simple_cycles(graph))
    assert cycles == []
