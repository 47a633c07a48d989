"""The contract's identifiers, as distinct types: a claim id is never a prefix id.

``NewType`` costs nothing at run time (the values are plain ``str`` / ``int`` on the wire) and
lets mypy catch an owner scope passed where a claim id belongs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NewType

from agentclaims.errors import UsageError

__all__ = [
    "BlockHash",
    "ClaimId",
    "OwnerScope",
    "PrefixId",
    "RequestId",
    "prefix_blocks",
    "prefix_id_of",
]

ClaimId = NewType("ClaimId", str)
"""Names one residency claim; unique per backend instance."""
PrefixId = NewType("PrefixId", str)
"""Names a prefix (a leading run of blocks): ``pfx-<last block hash>-<number of blocks>``."""
OwnerScope = NewType("OwnerScope", str)
"""Who may read, renew and release a claim (a workflow, a tenant)."""
RequestId = NewType("RequestId", str)
"""Names one active (LLM) request."""
BlockHash = NewType("BlockHash", int)
"""A 64-bit chained block hash (vLLM publishes the low 64 bits of its hashes as ints too)."""


def prefix_id_of(block_hashes: Sequence[int]) -> PrefixId:
    """The id of the prefix made of these blocks: its last hash names the whole chain."""
    if not block_hashes:
        raise UsageError("block_hashes", "a prefix needs at least one full block")
    return PrefixId(f"pfx-{block_hashes[-1] & 0xFFFFFFFFFFFFFFFF:016x}-{len(block_hashes)}")


def prefix_blocks(prefix_id: str) -> int:
    """How many blocks the prefix named ``prefix_id`` has (the inverse of ``prefix_id_of``)."""
    head, _, count = prefix_id.rpartition("-")
    if not head.startswith("pfx-") or not count.isdigit():
        raise UsageError("prefix_id", f"not a prefix id: {prefix_id!r}")
    return int(count)
