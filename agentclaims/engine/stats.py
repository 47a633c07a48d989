"""``EngineStats``: the reference engine's counters (requests, blocks, claims, harm)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["EngineStats"]


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started."""

    requests_served: int = 0
    requests_deferred: int = 0
    requests_refused: int = 0
    hit_blocks: int = 0
    restored_blocks: int = 0
    computed_blocks: int = 0
    evicted_blocks: int = 0
    recomputed_blocks: int = 0
    """Blocks computed again whose hash was evicted lately (``BlockPool.evicted_lately``):
    evictions that were regretted."""
    evicted_claimed_blocks: int = 0
    true_harm: int = 0
    true_harm_hard: int = 0
    blocks_lost_after_release: int = 0
    claims_accepted: int = 0
    claims_rejected: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
