"""Packaging: the wheel installs only ``agentclaims``, and everything it imports is declared."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Import names whose distribution is named differently (after PEP 503 normalization).
DISTRIBUTION_OF = {
    "langchain_core": "langchain-core",
    "langchain_openai": "langchain-openai",
    "agentclaims_vllm": "agentclaims-vllm",
    "yaml": "pyyaml",
    "opentelemetry": "opentelemetry-api",  # the ``otel`` extra (the API only)
}


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """Distribution names in ``[project].dependencies`` and the optional extras but ``dev``."""
    project = _pyproject()["project"]
    requirements = list(project["dependencies"])
    for name, extra in project.get("optional-dependencies", {}).items():
        if name != "dev":  # test and lint tools: never what the package itself imports
            requirements.extend(extra)
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
        assert match is not None, requirement
        names.add(_normalize(match.group()))
    return names


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party module names imported under ``agentclaims/``, with their files."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "agentclaims").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.partition(".")[0]
                if top != "agentclaims" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_wheel_packages_only_agentclaims():
    """The wheel target installs the ``agentclaims`` package and nothing else."""
    wheel = _pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["agentclaims"]


def test_integrations_is_not_a_python_package():
    """``integrations/`` holds separate distributions, not an importable top-level package."""
    assert not (ROOT / "integrations" / "__init__.py").exists()


def test_every_third_party_import_is_declared():
    """Each third-party module imported under ``agentclaims/`` is a declared dependency or extra."""
    declared = _declared()
    missing = {
        module: sorted(files)
        for module, files in _third_party_imports().items()
        if _normalize(DISTRIBUTION_OF.get(module, module)) not in declared
    }
    assert missing == {}
