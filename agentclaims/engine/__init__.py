"""The reference KV engine: block pool, prefix cache, eviction policies and the claim arbiter,
and ``ReferenceKV``, the engine speaking the claims protocol."""

from agentclaims.contract.ids import BlockHash, prefix_blocks, prefix_id_of
from agentclaims.engine.blocks import (
    NONE_HASH,
    Block,
    blake2b_hash,
    hash_block_tokens,
    hash_token_blocks,
)
from agentclaims.engine.engine import EngineStats, KVEngine
from agentclaims.engine.eviction import EvictionPolicy, LRUPolicy, PriorityPolicy, RankingPolicy
from agentclaims.engine.kv import ReferenceKV, ServiceTimes
from agentclaims.engine.nextuse import NextUsePolicy, WaitModel
from agentclaims.engine.tokenizer import ByteTokenizer, WordTokenizer, tokenizer_named

__all__ = [
    "NONE_HASH",
    "Block",
    "BlockHash",
    "ByteTokenizer",
    "EngineStats",
    "EvictionPolicy",
    "KVEngine",
    "LRUPolicy",
    "NextUsePolicy",
    "PriorityPolicy",
    "RankingPolicy",
    "ReferenceKV",
    "ServiceTimes",
    "WaitModel",
    "WordTokenizer",
    "blake2b_hash",
    "hash_block_tokens",
    "hash_token_blocks",
    "prefix_blocks",
    "prefix_id_of",
    "tokenizer_named",
]
