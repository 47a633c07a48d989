"""The house rule on size: no class of the package or the connector runs over 400 lines (a
class that grows past it is split into parts that receive what they use)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST = 400


def test_no_class_runs_over_400_lines():
    over = []
    for folder in (ROOT / "agentclaims", ROOT / "integrations"):
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    if size > MOST:
                        over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size})")
    assert not over, f"classes over {MOST} lines: {over}"
