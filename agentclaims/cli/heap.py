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
from collections.abc import Iterator

__all__ = ["settled_heap"]


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """Collect, freeze what lives, run the block; unfreeze after it, however it ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
