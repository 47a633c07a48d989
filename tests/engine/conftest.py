"""Shared pieces of the engine tests: a settable clock, chained prefixes, claim specs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentclaims.contract import CacheIdentity, ClaimSpec, ProtectionMode
from agentclaims.engine import BlockHash, KVEngine, hash_token_blocks, prefix_id_of

BLOCK_SIZE = 4
IDENTITY = CacheIdentity("agentclaims-embedded", "scripted", "agentclaims-bytes", "default", 4)

ChainFn = Callable[[int, int], list[BlockHash]]
SpecFn = Callable[..., ClaimSpec]
Warm = Callable[[KVEngine, str, list[BlockHash]], None]


class FakeClock:
    """An injectable ``clock() -> ns`` that moves only when told."""

    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


def make_chain(tag: int, n: int) -> list[BlockHash]:
    """``n`` chained block hashes of a token sequence unique to ``tag``."""
    tokens = [tag * 100_000 + i for i in range(n * BLOCK_SIZE)]
    return hash_token_blocks(tokens, BLOCK_SIZE)


def make_spec(
    claim_id: str,
    hashes: list[BlockHash],
    mode: ProtectionMode | str,
    owner: str = "wf",
    **kw: Any,
) -> ClaimSpec:
    """A claim on the whole prefix ``hashes`` (predicate: leading_prefix_at_least(all))."""
    return ClaimSpec(
        claim_id=claim_id,
        owner_scope=owner,
        object_id=prefix_id_of(hashes),
        cache_identity=kw.pop("cache_identity", IDENTITY),
        footprint_blocks=len(hashes),
        protection_mode=mode,  # type: ignore[arg-type]
        **kw,
    )


def warm(engine: KVEngine, request_id: str, hashes: list[BlockHash]) -> None:
    """Run one request over ``hashes`` so they end up resident in the prefix cache."""
    assert engine.begin(request_id, hashes).served
    engine.finish(request_id)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def chain() -> ChainFn:
    return make_chain


@pytest.fixture
def spec() -> SpecFn:
    return make_spec


@pytest.fixture
def warmup() -> Warm:
    return warm
