"""``PromptBook``: the prompts the vLLM side has served, by prefix id.

vLLM hashes its own blocks; the gateway names a prompt (and a prompt with its reply) by the
prefix id of the same tokens hashed its way, and keeps the tokens, the cache salt they were
served under and their block hashes, so that a claim naming the prefix later can re-run it
with a hold, and residency can be read from vLLM's KV events. Only the last ``max_prefixes``
are kept.

An agent's next prompt begins with what its last one served: ``known_chain`` finds the
hashes of the longest run of leading blocks the book served lately, so hashing a call's
prompt costs its new blocks, not its whole context.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import NamedTuple

from agentclaims.contract import BlockHash, prefix_id_of
from agentclaims.engine.blocks import hash_token_blocks

__all__ = ["Prompt", "PromptBook"]

RECENT = 4
"""Prefixes remembered per first block (and salt) for ``known_chain``: the last few an agent's
conversation (its prompts and its prompt with a reply) left."""


class Prompt(NamedTuple):
    """A prefix served: the tokens of its full blocks, their cache salt and block hashes."""

    tokens: tuple[int, ...]
    salt: str | None
    hashes: tuple[BlockHash, ...]


class PromptBook:
    """Prefix id -> the ``Prompt`` it names."""

    def __init__(self, block_size: int, max_prefixes: int) -> None:
        self.block_size = block_size
        self._max = max_prefixes
        self._known: OrderedDict[str, Prompt] = OrderedDict()
        self._by_start: dict[tuple[str | None, tuple[int, ...]], deque[str]] = {}
        """(salt, the first block's tokens) -> the prefix ids served lately that begin so."""

    def register(
        self, tokens: Sequence[int], salt: str | None, hashes: list[BlockHash] | None = None
    ) -> tuple[list[BlockHash], str | None]:
        """Remember ``tokens`` under their prefix id (``hashes``: their block hashes, when
        already known): the hashes and the id (``None`` without a full block)."""
        if hashes is None:
            hashes = hash_token_blocks(
                tokens, self.block_size, cache_salt=salt, known=self.known_chain(tokens, salt)
            )
        if not hashes:
            return hashes, None
        pid = prefix_id_of(hashes)
        known = self._known
        if pid not in known:  # the id names the salted chain: a known one has these tokens
            full = tuple(tokens[: len(hashes) * self.block_size])
            known[pid] = Prompt(full, salt, tuple(hashes))
            recent = self._by_start.setdefault((salt, full[: self.block_size]), deque())
            if pid not in recent:
                recent.appendleft(pid)
                if len(recent) > RECENT:
                    recent.pop()
        known.move_to_end(pid)
        while len(known) > self._max:
            self._forget(*known.popitem(last=False))
        return hashes, pid

    def get(self, prefix_id: str) -> Prompt | None:
        """What a prefix served here is made of (``None``: unknown)."""
        return self._known.get(prefix_id)

    def known_chain(self, tokens: Sequence[int], salt: str | None) -> list[BlockHash]:
        """The hashes of ``tokens``' leading full blocks, as far as a prefix served lately
        under ``salt`` has the same tokens (empty where none begins as they do): what is left
        to hash is the rest."""
        size = self.block_size
        recent = self._by_start.get((salt, tuple(tokens[:size])))
        if not recent:
            return []
        best: tuple[BlockHash, ...] = ()
        for pid in recent:
            prompt = self._known.get(pid)
            if prompt is not None:
                blocks = _common_blocks(tokens, prompt.tokens, len(prompt.hashes), size)
                if blocks > len(best):
                    best = prompt.hashes[:blocks]
        return list(best)

    def _forget(self, pid: str, prompt: Prompt) -> None:
        key = (prompt.salt, prompt.tokens[: self.block_size])
        recent = self._by_start.get(key)
        if recent is not None and pid in recent:
            recent.remove(pid)
            if not recent:
                del self._by_start[key]


def _common_blocks(tokens: Sequence[int], other: tuple[int, ...], most: int, size: int) -> int:
    """How many leading blocks of ``size`` tokens ``tokens`` and ``other`` share, at most
    ``most`` (the first is shared). A conversation that grew differs from what it served
    before in its last block or two at most (the template's tokens after a reply): those are
    tried first, from the longest, a block's tokens before the whole run's; a binary search
    after that."""
    most = min(most, len(tokens) // size)
    for blocks in range(most, max(1, most - 2) - 1, -1):
        end = blocks * size
        if tuple(tokens[end - size : end]) == other[end - size : end] and (
            tuple(tokens[:end]) == other[:end]
        ):
            return blocks
    low, high = 1, most - 3  # low blocks are shared; more than high are not
    while low < high:
        mid = (low + high + 1) // 2
        if tuple(tokens[: mid * size]) == other[: mid * size]:
            low = mid
        else:
            high = mid - 1
    return low
