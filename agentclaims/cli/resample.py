"""``bootstrap_90``: the 90% interval the benchmarks quote for a figure that chance moves
(the medians of paired rounds, a tenant's pooled p99 ratio)."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["bootstrap_90"]


def bootstrap_90(
    statistic: Callable[[random.Random], float], resamples: int = 2000
) -> tuple[float, float]:
    """The 5th and 95th percentiles of ``statistic`` over ``resamples`` draws, each given the
    one seeded generator to resample its data with (the same data, the same interval)."""
    rng = random.Random(0)
    values = sorted(statistic(rng) for _ in range(resamples))
    return values[int(0.05 * len(values))], values[int(0.95 * len(values)) - 1]
