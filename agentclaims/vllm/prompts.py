"""``PromptBook``: the prompts the vLLM side has served, by prefix id.

vLLM hashes its own blocks; the gateway names a prompt (and a prompt with its reply) by the
prefix id of the same tokens hashed its way, and keeps the tokens and the cache salt they were
served under, so that a claim naming the prefix later can re-run it with a hold, and residency
can be read from vLLM's KV events. Only the last ``max_prefixes`` are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from agentclaims.contract import BlockHash, prefix_id_of
from agentclaims.engine.blocks import hash_token_blocks

__all__ = ["PromptBook"]


class PromptBook:
    """Prefix id -> the tokens of its full blocks and their cache salt."""

    def __init__(self, block_size: int, max_prefixes: int) -> None:
        self.block_size = block_size
        self._max = max_prefixes
        self._known: OrderedDict[str, tuple[tuple[int, ...], str | None]] = OrderedDict()

    def register(
        self, tokens: Sequence[int], salt: str | None, hashes: list[BlockHash] | None = None
    ) -> tuple[list[BlockHash], str | None]:
        """Remember ``tokens`` under their prefix id (``hashes``: their block hashes, when
        already known): the hashes and the id (``None`` without a full block)."""
        if hashes is None:
            hashes = hash_token_blocks(tokens, self.block_size, cache_salt=salt)
        if not hashes:
            return hashes, None
        pid = prefix_id_of(hashes)
        known = self._known
        if pid not in known:  # the id names the salted chain: a known one has these tokens
            known[pid] = (tuple(tokens[: len(hashes) * self.block_size]), salt)
        known.move_to_end(pid)
        while len(known) > self._max:
            known.popitem(last=False)
        return hashes, pid

    def get(self, prefix_id: str) -> tuple[tuple[int, ...], str | None] | None:
        """The tokens and cache salt of a prefix served here (``None``: unknown)."""
        return self._known.get(prefix_id)
