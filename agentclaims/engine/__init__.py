"""The reference KV engine: block pool, prefix cache, eviction policies and the claim arbiter."""

from agentclaims.engine.blocks import (
    NONE_HASH,
    Block,
    BlockHash,
    blake2b_hash,
    hash_block_tokens,
    hash_token_blocks,
    prefix_blocks,
    prefix_id_of,
)
from agentclaims.engine.engine import ActiveOutcome, ClaimDecision, ClaimView, EngineStats, KVEngine
from agentclaims.engine.eviction import EvictionPolicy, LRUPolicy, PriorityPolicy

__all__ = [
    "NONE_HASH",
    "ActiveOutcome",
    "Block",
    "BlockHash",
    "ClaimDecision",
    "ClaimView",
    "EngineStats",
    "EvictionPolicy",
    "KVEngine",
    "LRUPolicy",
    "PriorityPolicy",
    "blake2b_hash",
    "hash_block_tokens",
    "hash_token_blocks",
    "prefix_blocks",
    "prefix_id_of",
]
