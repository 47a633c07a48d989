"""The reference KV engine: block pool, prefix cache, eviction policies and the claim arbiter,
and ``ReferenceKV``, the engine speaking the claims protocol.

Its parts load on first use: a KV side that only hashes blocks (``agentclaims.engine.blocks``)
or tokenizes does not load the engine, its arbiter and its policies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims._lazy import lazy
from agentclaims.contract.ids import BlockHash, prefix_blocks, prefix_id_of
from agentclaims.engine.blocks import (
    NONE_HASH,
    Block,
    blake2b_hash,
    hash_block_tokens,
    hash_token_blocks,
)

if TYPE_CHECKING:
    from agentclaims.engine.engine import EngineStats, KVEngine
    from agentclaims.engine.eviction import (
        EvictionPolicy,
        LRUPolicy,
        PriorityPolicy,
        RankingPolicy,
    )
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

_LAZY = {
    "EngineStats": "agentclaims.engine.engine",
    "KVEngine": "agentclaims.engine.engine",
    "EvictionPolicy": "agentclaims.engine.eviction",
    "LRUPolicy": "agentclaims.engine.eviction",
    "PriorityPolicy": "agentclaims.engine.eviction",
    "RankingPolicy": "agentclaims.engine.eviction",
    "ReferenceKV": "agentclaims.engine.kv",
    "ServiceTimes": "agentclaims.engine.kv",
    "NextUsePolicy": "agentclaims.engine.nextuse",
    "WaitModel": "agentclaims.engine.nextuse",
    "ByteTokenizer": "agentclaims.engine.tokenizer",
    "WordTokenizer": "agentclaims.engine.tokenizer",
    "tokenizer_named": "agentclaims.engine.tokenizer",
}


__getattr__, __dir__ = lazy(__name__, _LAZY, __all__)
