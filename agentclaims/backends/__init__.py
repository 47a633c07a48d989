"""Backends: where claims and LLM calls go. ``EmbeddedBackend`` (in-process gateway, the
default) and ``HTTPBackend`` (a gateway on the network) implement the ``Backend`` protocol.

They are imported on first use, so importing this package (for ``Backend``) loads neither the
gateway nor an HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims._lazy import lazy
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


__getattr__, __dir__ = lazy(__name__, _LAZY, __all__)
