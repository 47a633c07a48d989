"""``PromptBook``: the prompts the vLLM side has served, by prefix id.

vLLM hashes its own blocks; the gateway names a prompt (and a prompt with its reply) by the
prefix id of the same tokens hashed its way, and keeps the tokens (packed, 8 bytes each:
``pack_tokens``), the cache salt they were served under and their block hashes, so that a
claim naming the prefix later can re-run it with a hold, and residency can be read from
vLLM's KV events. Only the last ``max_prefixes``, and ``max_tokens`` tokens in all, are kept.

An agent's next prompt begins with what its last one served: ``known_chain`` finds the
hashes of the longest run of leading blocks the book served lately, so hashing a call's
prompt costs its new blocks, not its whole context. Candidates are found by a few of a
prefix's blocks (the 1st, 2nd, 4th, 8th, ...: ``_MARKS``), the furthest first: many agents
share their first blocks (a system prompt), few share their 16th; a candidate's tokens are
then compared, never assumed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from agentclaims.contract import BlockHash, prefix_id_of
from agentclaims.engine.blocks import TOKEN_BYTES, hash_packed_blocks, unpack_tokens
from agentclaims.errors import UsageError

__all__ = ["Prompt", "PromptBook", "chain_hashes"]

MAX_TOKENS = 24_000_000
"""The most tokens the book keeps in all, by default (benchmarks/bench_prompt_book.py gives
the bytes a token kept takes: packed, 8 of them, and the index). By count alone
(``max_prefixes``, 100,000) a gateway serving agents with 10,000-token contexts would keep a
billion tokens."""
RECENT = 4
"""Prefixes remembered per marked block (its place, its tokens and the salt) for
``known_chain``: the last few an agent's conversation (its prompts and its prompt with a
reply) left there."""


class Prompt(NamedTuple):
    """A prefix served: the tokens of its full blocks (``pack_tokens``), their cache salt
    and block hashes."""

    packed: bytes
    salt: str | None
    hashes: tuple[BlockHash, ...]

    def token_ids(self) -> list[int]:
        """The prefix's token ids."""
        return unpack_tokens(self.packed)


class PromptBook:
    """Prefix id -> the ``Prompt`` it names. Tokens come and are kept packed
    (``agentclaims.engine.blocks.pack_tokens``): hashed as they are, compared as memory."""

    def __init__(self, block_size: int, max_prefixes: int, max_tokens: int = MAX_TOKENS) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise UsageError("max_tokens", f"must be a positive integer, got {max_tokens!r}")
        self.block_size = block_size
        self._max = max_prefixes
        self.max_tokens = max_tokens
        """The most tokens kept in all: the least recently served prefixes go past it, as past
        ``max_prefixes`` (the newest is kept whatever its length)."""
        self.tokens = 0
        """The tokens kept now, over every prefix."""
        self._known: OrderedDict[str, Prompt] = OrderedDict()
        self._width = TOKEN_BYTES * block_size
        self._by_mark: dict[tuple[str | None, int, bytes], list[str]] = {}
        """(salt, a marked block's place, its tokens) -> the prefix ids served lately that
        have those tokens there (``_MARKS``)."""

    def register(
        self, tokens: bytes, salt: str | None, hashes: list[BlockHash] | None = None
    ) -> tuple[list[BlockHash], str | None]:
        """Remember the packed ``tokens`` under their prefix id (``hashes``: their block
        hashes, when already known): the hashes and the id (``None`` without a full block)."""
        if hashes is None:
            hashes = hash_packed_blocks(
                tokens, self.block_size, cache_salt=salt, known=self.known_chain(tokens, salt)
            )
        if not hashes:
            return hashes, None
        pid = prefix_id_of(hashes)
        known = self._known
        if pid not in known:  # the id names the salted chain: a known one has these tokens
            full = tokens[: len(hashes) * self._width]
            known[pid] = Prompt(full, salt, tuple(hashes))
            self.tokens += len(full) // TOKEN_BYTES
            for key in self._marks(full, salt, len(hashes)):
                recent = self._by_mark.setdefault(key, [])
                recent.insert(0, pid)  # newest first
                del recent[RECENT:]
        known.move_to_end(pid)
        while len(known) > 1 and (len(known) > self._max or self.tokens > self.max_tokens):
            self._forget(*known.popitem(last=False))
        return hashes, pid

    def __len__(self) -> int:
        return len(self._known)

    def get(self, prefix_id: str) -> Prompt | None:
        """What a prefix served here is made of (``None``: unknown)."""
        return self._known.get(prefix_id)

    def known_chain(self, tokens: bytes, salt: str | None) -> list[BlockHash]:
        """The hashes of the packed ``tokens``' leading full blocks, as far as a prefix
        served lately under ``salt`` has the same tokens (empty where none begins as they
        do): what is left to hash is the rest. The prefixes that share the furthest marked
        block are compared first; the search ends at the first mark the longest run found so
        far goes past."""
        width = self._width
        blocks = len(tokens) // width
        best: tuple[BlockHash, ...] = ()
        seen: set[str] = set()
        for key in reversed(self._marks(tokens, salt, blocks)):
            for pid in self._by_mark.get(key, ()):
                prompt = self._known.get(pid)
                if prompt is None or pid in seen:
                    continue
                seen.add(pid)
                shared = _common_blocks(tokens, prompt.packed, len(prompt.hashes), width)
                if shared > len(best):
                    best = prompt.hashes[:shared]
            if len(best) > key[1]:  # nearer marks find the prefixes that share less, mostly
                break
        return list(best)

    def chains(
        self,
        tokens: bytes,
        sequence: bytes | None,
        salt: str | None,
        known: Sequence[BlockHash] = (),
    ) -> tuple[list[BlockHash], list[BlockHash]]:
        """``chain_hashes`` of a served call: from the prompt's hashes ``known`` already, or
        else from those of what an earlier call served that it begins with (``known_chain``):
        a call hashes its new blocks only."""
        known = known or self.known_chain(tokens, salt)
        return chain_hashes(self.block_size, tokens, sequence, salt, known)

    def _marks(
        self, tokens: bytes, salt: str | None, blocks: int
    ) -> list[tuple[str | None, int, bytes]]:
        """The index keys of the packed ``tokens``' first ``blocks`` blocks, nearest first."""
        width = self._width
        return [(salt, at, tokens[at * width : (at + 1) * width]) for at in _MARKS if at < blocks]

    def _forget(self, pid: str, prompt: Prompt) -> None:
        self.tokens -= len(prompt.packed) // TOKEN_BYTES
        for key in self._marks(prompt.packed, prompt.salt, len(prompt.hashes)):
            recent = self._by_mark.get(key)
            if recent is not None and pid in recent:
                recent.remove(pid)
                if not recent:
                    del self._by_mark[key]


def chain_hashes(
    block_size: int,
    tokens: bytes,
    sequence: bytes | None,
    cache_salt: str | None,
    known: Sequence[BlockHash] = (),
) -> tuple[list[BlockHash], list[BlockHash]]:
    """The block hashes of the packed prompt ``tokens`` and of the ``sequence`` it left
    cached, as one chain: the sequence's blocks begin with the prompt's, or (a reply that
    completed no block) are the first of them. ``known``: the prompt's, hashed already."""
    longer = sequence if sequence and len(sequence) > len(tokens) else tokens
    chain = hash_packed_blocks(longer, block_size, cache_salt=cache_salt, known=known)
    width = TOKEN_BYTES * block_size
    return chain[: len(tokens) // width], (chain[: len(sequence) // width] if sequence else [])


_MARKS = tuple(2**k - 1 for k in range(40))
"""The blocks a prefix is found by: the 1st, 2nd, 4th, 8th, ... (0, 1, 3, 7, ...)."""


def _common_blocks(tokens: bytes, other: bytes, most: int, width: int) -> int:
    """How many leading blocks of ``width`` packed bytes ``tokens`` and ``other`` share, at
    most ``most``. A conversation that grew differs from what it served before in its last
    block or two at most (the template's tokens after a reply): those are tried first, from
    the longest, a block's tokens before the whole run's; a binary search after that. Each
    comparison is of memory (``bytes``), in C."""
    most = min(most, len(tokens) // width)
    for blocks in range(most, max(0, most - 3), -1):
        end = blocks * width
        if tokens[end - width : end] == other[end - width : end] and (tokens[:end] == other[:end]):
            return blocks
    low, high = 0, most - 3  # low blocks are shared; more than high are not
    while low < high:
        mid = (low + high + 1) // 2
        if tokens[: mid * width] == other[: mid * width]:
            low = mid
        else:
            high = mid - 1
    return low
