"""Names of a package that load their module on first use (PEP 562), so that importing the
package stays light: ``__getattr__, __dir__ = lazy(__name__, {"Name": "pkg.module"}, __all__)``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy"]


def lazy(
    package: str, names: Mapping[str, str], exported: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each of ``names`` is imported from
    its module when first asked for, then kept in the package; any other name is an
    ``AttributeError`` naming it."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(exported)

    return __getattr__, __dir__
