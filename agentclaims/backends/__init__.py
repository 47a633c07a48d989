"""Backends: where claims and LLM calls go. ``EmbeddedBackend`` (in-process gateway, the
default) and ``HTTPBackend`` (a gateway on the network) implement the ``Backend`` protocol.

They are imported on first use, so importing this package (for ``Backend``) loads neither the
gateway nor an HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentclaims.backends.base import EXTENSION_KEY, Backend

if TYPE_CHECKING:
    from agentclaims.backends.admission import AdmissionWindow
    from agentclaims.backends.embedded import EmbeddedBackend
    from agentclaims.backends.fleet import FleetBackend
    from agentclaims.backends.http import HTTPBackend

__all__ = [
    "EXTENSION_KEY",
    "AdmissionWindow",
    "Backend",
    "EmbeddedBackend",
    "FleetBackend",
    "HTTPBackend",
]

_LAZY = {
    "AdmissionWindow": "agentclaims.backends.admission",
    "EmbeddedBackend": "agentclaims.backends.embedded",
    "FleetBackend": "agentclaims.backends.fleet",
    "HTTPBackend": "agentclaims.backends.http",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
