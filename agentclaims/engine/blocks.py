"""Blocks, chained block hashes, and the pieces of a paged KV pool.

A block holds ``block_size`` tokens of KV. Full blocks are identified by a chained hash, the
scheme vLLM's prefix cache uses::

    hash(block i) = H(parent = hash(block i-1) or NONE_HASH, token ids of block i, extra keys)

so two sequences share a cached block exactly when their whole prefixes up to it agree.
Only full blocks are hashed; a partial tail block is never reusable.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from agentclaims.contract.ids import BlockHash, prefix_blocks, prefix_id_of
from agentclaims.errors import UsageError

__all__ = [
    "NONE_HASH",
    "Block",
    "BlockHash",
    "HashFn",
    "blake2b_hash",
    "hash_block_tokens",
    "hash_token_blocks",
    "prefix_blocks",
    "prefix_id_of",
]


HashFn = Callable[[bytes], int]


def blake2b_hash(data: bytes) -> int:
    """Default hash: the 64-bit BLAKE2b digest of ``data`` (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


NONE_HASH = BlockHash(blake2b_hash(b"agentclaims:none-hash:0"))
"""The parent hash of block 0 (vLLM derives it from a seed; ours is fixed and explicit)."""


def hash_block_tokens(
    parent: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: tuple[object, ...] = (),
    hash_fn: HashFn = blake2b_hash,
) -> BlockHash:
    """Hash one full block given its parent's hash (``None`` for block 0)."""
    parent_hash = NONE_HASH if parent is None else parent
    payload = struct.pack(f"<Q{len(token_ids)}q", parent_hash, *token_ids)
    if extra_keys:
        payload += repr(extra_keys).encode()
    return BlockHash(hash_fn(payload))


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
    hash_fn: HashFn = blake2b_hash,
    known: Sequence[BlockHash] = (),
) -> list[BlockHash]:
    """Chained hashes of every full block of ``token_ids``; the salt goes on block 0 only.

    ``known``: the hashes of the first blocks, already computed for these same tokens (a
    sequence's prompt, say): hashing goes on from there."""
    if block_size <= 0:
        raise UsageError("block_size", f"must be positive, got {block_size}")
    if len(known) * block_size > len(token_ids):
        raise UsageError("known", f"{len(known)} blocks known of {len(token_ids)} tokens")
    hashes: list[BlockHash] = list(known)
    parent: BlockHash | None = hashes[-1] if hashes else None
    first = len(hashes) * block_size
    if hash_fn is blake2b_hash:  # the default: every block in one pass (every call hashes)
        return _blake2b_blocks(hashes, token_ids, first, block_size, cache_salt)
    for start in range(first, len(token_ids) - block_size + 1, block_size):
        extra: tuple[object, ...] = (
            ("cache_salt", cache_salt) if (start == 0 and cache_salt) else ()
        )
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], extra, hash_fn)
        hashes.append(parent)
    return hashes


def _blake2b_blocks(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    first: int,
    block_size: int,
    cache_salt: str | None,
) -> list[BlockHash]:
    """``hash_block_tokens`` chained with the default hash over the full blocks from token
    ``first`` on, appended to ``hashes``: the same bytes hashed (the parent as ``<Q``, each
    token as ``<q``), the tokens packed once rather than block by block."""
    end = first + (len(token_ids) - first) // block_size * block_size
    if end == first:
        return hashes
    packed = struct.pack(f"<{end - first}q", *token_ids[first:end])
    width = 8 * block_size
    # a digest is its hash big-endian: reversed, the parent as the next block packs it
    parent = (hashes[-1] if hashes else NONE_HASH).to_bytes(8, "little")
    blake2b = hashlib.blake2b
    digests = []
    for offset in range(0, len(packed), width):
        payload = parent + packed[offset : offset + width]
        if first + offset == 0 and cache_salt:
            payload += repr(("cache_salt", cache_salt)).encode()
        digest = blake2b(payload, digest_size=8).digest()
        digests.append(digest)
        parent = digest[::-1]
    hashes += cast("tuple[BlockHash, ...]", struct.unpack(f">{len(digests)}Q", b"".join(digests)))
    return hashes


@dataclass(slots=True, eq=False)
class Block:
    """One physical KV block of the pool."""

    block_id: int
    """Index in the pool, ``0 <= block_id < num_blocks``; never changes."""
    block_hash: BlockHash | None = None
    """Set while the block holds a reusable full block (it is then in the prefix cache)."""
    ref_cnt: int = 0
    """Active requests using the block. ``> 0``: active live KV; ``0``: free or resident."""
    tier: int = 0
    """Where a resident (``ref_cnt == 0``, hashed) block waits; set by the arbiter."""
