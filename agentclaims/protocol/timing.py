"""How long a gateway request waited on its upstream engine: the gateway's own share of a
request's latency is the rest, answered in a ``Server-Timing`` header (``gateway``,
``upstream``, in milliseconds) on every gateway response.

``track()`` starts the count for the current request (a context variable, so concurrent
requests on one event loop count apart); ``waited(s)`` adds one wait on the engine.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["server_timing", "track", "waited"]

_WAITED: ContextVar[list[float] | None] = ContextVar("agentclaims_upstream_s", default=None)


def track() -> list[float]:
    """Count the current request's upstream waits from now; the cell holds the seconds."""
    cell = [0.0]
    _WAITED.set(cell)
    return cell


def waited(seconds: float) -> None:
    """One wait on the upstream engine, added to the current request's count (if any). A
    plain call rather than a context manager: every agent's call counts one, and a
    generator-based ``with`` runs several frames more."""
    cell = _WAITED.get()
    if cell is not None:
        cell[0] += seconds


def server_timing(total_s: float, upstream_s: float) -> str:
    """The ``Server-Timing`` value: the gateway's own time and the upstream wait."""
    own = max(0.0, total_s - upstream_s)
    return f"gateway;dur={own * 1e3:.3f}, upstream;dur={upstream_s * 1e3:.3f}"
