"""``settled_heap``: a timed run that the cyclic collector does not charge for what came before.

A full collection of a LangGraph process takes tens of milliseconds and lands wherever the
allocations happen to trigger it. Runs timed one after the other in one process (the demo's
two modes, the SDK bench's alternating rounds) would each pay, by chance, for the garbage the
run before left. Inside the block that garbage is collected first and what lives then is
frozen (never scanned again until the block ends).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["collector_time", "settled_heap"]


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """Collect, freeze what lives, run the block; unfreeze after it, however it ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def collector_time() -> Iterator[list[float]]:
    """The seconds the cyclic collector ran inside the block (``[0]``), all generations."""
    spent, started = [0.0], [0.0]

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]

    gc.callbacks.append(note)
    try:
        yield spent
    finally:
        gc.callbacks.remove(note)
