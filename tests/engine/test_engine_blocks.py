"""Chained block hashes: prefix sharing, salts, partial tails."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.engine import NONE_HASH, hash_block_tokens, hash_token_blocks, prefix_id_of
from agentclaims.engine.blocks import hash_packed_blocks, pack_tokens, unpack_tokens
from agentclaims.errors import UsageError

tokens = st.lists(st.integers(0, 50_000), max_size=40)


@given(tokens, tokens, tokens, st.integers(1, 6))
def test_common_prefix_shares_exactly_the_common_full_blocks(
    common: list[int], a: list[int], b: list[int], block_size: int
) -> None:
    """Two sequences share block i's hash iff their first (i+1)*block_size tokens agree."""
    x = hash_token_blocks(common + a, block_size)
    y = hash_token_blocks(common + b, block_size)
    shared = 0
    for i in range(min(len(x), len(y))):
        end = (i + 1) * block_size
        if (common + a)[:end] != (common + b)[:end]:
            break
        shared += 1
    assert shared >= len(common) // block_size
    assert x[:shared] == y[:shared]
    assert all(p != q for p, q in zip(x[shared:], y[shared:], strict=False))


def test_one_changed_token_changes_its_block_and_every_later_one() -> None:
    """Changing a token in block 1 keeps block 0 and changes blocks 1, 2, 3."""
    base = list(range(16))
    changed = base.copy()
    changed[5] = 999
    x, y = hash_token_blocks(base, 4), hash_token_blocks(changed, 4)
    assert x[0] == y[0]
    assert all(p != q for p, q in zip(x[1:], y[1:], strict=True))


def test_cache_salt_changes_block_zero_and_thus_all() -> None:
    """A salt goes into block 0 only, and the chain carries it into every block."""
    seq = list(range(12))
    plain = hash_token_blocks(seq, 4)
    salted = hash_token_blocks(seq, 4, cache_salt="tenant-a")
    other = hash_token_blocks(seq, 4, cache_salt="tenant-b")
    assert all(p != s for p, s in zip(plain, salted, strict=True))
    assert all(s != o for s, o in zip(salted, other, strict=True))
    assert salted == hash_token_blocks(seq, 4, cache_salt="tenant-a")


def test_partial_tail_is_not_hashed() -> None:
    """Only full blocks get a hash; a tail shorter than a block adds nothing."""
    assert len(hash_token_blocks(list(range(11)), 4)) == 2
    assert hash_token_blocks(list(range(11)), 4) == hash_token_blocks(list(range(8)), 4)
    assert hash_token_blocks([1, 2, 3], 4) == []


def test_chain_is_built_from_parents() -> None:
    """Block 0's parent is NONE_HASH; block i's parent is block i-1's hash."""
    seq = list(range(8))
    h0, h1 = hash_token_blocks(seq, 4)
    assert h0 == hash_block_tokens(None, seq[:4]) == hash_block_tokens(NONE_HASH, seq[:4])
    assert h1 == hash_block_tokens(h0, seq[4:])


def test_injected_hash_function_is_used() -> None:
    """The hash function is a parameter (vLLM style)."""
    hashes = hash_token_blocks(list(range(8)), 4, hash_fn=lambda data: len(data))
    assert hashes == [8 + 4 * 8, 8 + 4 * 8]


def test_prefix_id_names_the_last_block_and_length() -> None:
    """prefix_id_of names a prefix by its last hash and its length; empty is refused."""
    hashes = hash_token_blocks(list(range(12)), 4)
    pid = prefix_id_of(hashes)
    assert pid.endswith("-3")
    assert pid != prefix_id_of(hashes[:2])
    with pytest.raises(UsageError) as info:
        prefix_id_of([])
    assert info.value.field == "block_hashes"
    with pytest.raises(UsageError) as size:
        hash_token_blocks([1], 0)
    assert size.value.field == "block_size"


@given(tokens, tokens, st.integers(1, 6), st.data(), st.sampled_from([None, "tenant-a"]))
def test_hashing_goes_on_from_known_blocks(
    prompt: list[int], reply: list[int], block_size: int, data: st.DataObject, salt: str | None
) -> None:
    """Continuing from a prefix's known hashes gives exactly the hashes from scratch."""
    whole = hash_token_blocks(prompt + reply, block_size, cache_salt=salt)
    head = hash_token_blocks(prompt, block_size, cache_salt=salt)
    k = data.draw(st.integers(0, len(head)))
    went_on = hash_token_blocks(prompt + reply, block_size, cache_salt=salt, known=head[:k])
    assert went_on == whole


def test_more_known_blocks_than_tokens_is_refused() -> None:
    known = hash_token_blocks(list(range(8)), 4)
    with pytest.raises(UsageError, match="known"):
        hash_token_blocks(list(range(7)), 4, known=known)


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=80),
    st.integers(1, 9),
    st.sampled_from([None, "", "tenant-a"]),
    st.data(),
)
def test_the_one_pass_default_hash_is_the_chain_of_block_hashes(
    tokens: list[int], block_size: int, salt: str | None, data: st.DataObject
) -> None:
    """``hash_token_blocks`` packs the tokens once for the default hash; each block's hash is
    still exactly ``hash_block_tokens`` of its parent and its tokens (the salt on block 0), from
    any known head on."""
    chain: list[int] = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra: tuple[object, ...] = ("cache_salt", salt) if start == 0 and salt else ()
        parent = hash_block_tokens(parent, tokens[start : start + block_size], extra)
        chain.append(parent)
    assert hash_token_blocks(tokens, block_size, cache_salt=salt) == chain
    known = data.draw(st.integers(0, len(chain)))
    assert hash_token_blocks(tokens, block_size, cache_salt=salt, known=chain[:known]) == chain
    packed = pack_tokens(tokens)
    assert unpack_tokens(packed) == tokens
    assert packed == struct.pack(f"<{len(tokens)}q", *tokens)
    assert hash_packed_blocks(packed, block_size, cache_salt=salt, known=chain[:known]) == chain


def test_packed_tokens_must_be_whole_and_cover_what_is_known() -> None:
    with pytest.raises(UsageError, match="packed"):
        hash_packed_blocks(b"\x00" * 12, 1)
    with pytest.raises(UsageError, match="known"):
        hash_packed_blocks(pack_tokens([1, 2, 3]), 2, known=hash_token_blocks([1, 2, 3, 4], 2))
    with pytest.raises(UsageError, match="block_size"):
        hash_packed_blocks(pack_tokens([1]), 0)
