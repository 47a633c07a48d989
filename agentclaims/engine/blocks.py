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
import sys
from array import array
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
    "hash_packed_blocks",
    "hash_token_blocks",
    "pack_tokens",
    "prefix_blocks",
    "prefix_id_of",
    "unpack_tokens",
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
        end = first + (len(token_ids) - first) // block_size * block_size
        data = pack_tokens(token_ids[first:end])
        return _blake2b_run(
            hashes, data, TOKEN_BYTES * block_size, cache_salt if not first else None
        )
    for start in range(first, len(token_ids) - block_size + 1, block_size):
        extra: tuple[object, ...] = (
            ("cache_salt", cache_salt) if (start == 0 and cache_salt) else ()
        )
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], extra, hash_fn)
        hashes.append(parent)
    return hashes


TOKEN_BYTES = 8
"""Bytes a token packs to (``pack_tokens``): a signed 64-bit integer, as the hash reads it."""
_SWAP = sys.byteorder != "little"


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as the default hash reads them, in one run: each a little-endian signed
    64-bit integer (``<q``). Kept this way a prompt takes 8 bytes a token, not a Python
    integer's 32 and its reference's 8, and two prompts compare as memory does."""
    packed = array("q", token_ids)
    if _SWAP:  # pragma: no cover - little-endian machines
        packed.byteswap()
    return packed.tobytes()


def unpack_tokens(packed: bytes) -> list[int]:
    """The token ids ``pack_tokens`` packed."""
    out = array("q")
    out.frombytes(packed)
    if _SWAP:  # pragma: no cover - little-endian machines
        out.byteswap()
    return out.tolist()


def hash_packed_blocks(
    packed: bytes,
    block_size: int,
    *,
    cache_salt: str | None = None,
    known: Sequence[BlockHash] = (),
) -> list[BlockHash]:
    """``hash_token_blocks`` with the default hash, of tokens packed already
    (``pack_tokens``): the same hashes, nothing packed again."""
    if block_size <= 0:
        raise UsageError("block_size", f"must be positive, got {block_size}")
    if len(packed) % TOKEN_BYTES:
        raise UsageError("packed", f"{len(packed)} bytes is no whole number of packed tokens")
    width = TOKEN_BYTES * block_size
    start = len(known) * width
    if start > len(packed):
        raise UsageError("known", f"{len(known)} blocks known of {len(packed) // 8} tokens")
    salt = cache_salt if not start else None
    return _blake2b_run(list(known), packed[start:] if start else packed, width, salt)


def _blake2b_run(
    hashes: list[BlockHash], data: bytes, width: int, cache_salt: str | None
) -> list[BlockHash]:
    """``hash_block_tokens`` chained with the default hash over ``data``'s whole blocks of
    ``width`` packed bytes, after ``hashes``, appended to them: the same bytes hashed (the
    parent as ``<Q``, each token as ``<q``). ``cache_salt``: on the first block (block 0)."""
    # a digest is its hash big-endian: reversed, the parent as the next block packs it
    parent = (hashes[-1] if hashes else NONE_HASH).to_bytes(8, "little")
    blake2b = hashlib.blake2b
    digests = []
    for offset in range(0, len(data) - width + 1, width):
        payload = parent + data[offset : offset + width]
        if not offset and cache_salt:
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
