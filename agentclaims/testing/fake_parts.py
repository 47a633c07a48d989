"""The parts ``FakeKV`` (:mod:`agentclaims.testing.fake`) is made of: the record of a protocol
call, its claim record, a scripted outcome, its block cache and its lowering descriptor."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agentclaims.contract import (
    ArbiterAction,
    BlockHash,
    ClaimId,
    ClaimSpec,
    Feasibility,
    PrefixId,
    ProtectionMode,
    RequestId,
    prefix_id_of,
)
from agentclaims.errors import UsageError
from agentclaims.kernel import Claim
from agentclaims.lowering import IDENTITY_FIELDS
from agentclaims.protocol import ActiveOutcome, ActiveRequest

__all__ = [
    "PENDING",
    "Call",
    "FakeCache",
    "FakeClaim",
    "fake_descriptor",
    "positive_count",
    "scripted_outcome",
]

PENDING = RequestId("?")
"""Request id of a scripted outcome until a request takes it."""


@dataclass(frozen=True, slots=True)
class Call:
    """One protocol call a ``FakeKV`` received: the operation and its main arguments."""

    operation: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))

    @property
    def claim_id(self) -> str | None:
        """The claim the call named, if any."""
        value = self.args.get("claim_id")
        return None if value is None else str(value)


class FakeClaim(Claim):
    """A claim as ``FakeKV`` keeps it: the blocks it covers, when it would end."""

    __slots__ = ("blocks", "expires_at_ns", "expires_at_step")

    def __init__(self, spec: ClaimSpec, blocks: tuple[BlockHash, ...]) -> None:
        super().__init__(spec)
        self.blocks = blocks
        self.expires_at_step: int | None = None
        self.expires_at_ns: int | None = None


def positive_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(name, f"must be a positive integer, got {value!r}")
    return value


def scripted_outcome(
    action: ArbiterAction,
    feasibility: Feasibility,
    blocking: Sequence[str],
    shortfall_blocks: int,
    retry_after_s: float | None,
) -> ActiveOutcome:
    """The outcome a test scripts for the next requests, its arguments checked."""
    if isinstance(blocking, str):
        raise UsageError("blocking", "expected a sequence of claim ids, got a string")
    if retry_after_s is not None and not (
        isinstance(retry_after_s, int | float) and retry_after_s >= 0
    ):
        raise UsageError("retry_after_s", f"must be a number >= 0, got {retry_after_s!r}")
    return ActiveOutcome(
        PENDING,
        action,
        Feasibility(feasibility),
        blocking_claim_ids=tuple(ClaimId(c) for c in blocking),
        shortfall_blocks=positive_count("shortfall_blocks", shortfall_blocks),
        retry_after_s=retry_after_s,
    )


class FakeCache:
    """What ``FakeKV`` has cached (every block served, until the test evicts it), and the
    prefixes it named."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: set[BlockHash] = set()
        self.prefixes: dict[PrefixId, tuple[BlockHash, ...]] = {}

    def name_prefixes(
        self, request: ActiveRequest, hashes: tuple[BlockHash, ...], prompt_blocks: int
    ) -> dict[str, Any]:
        """Name the prompt, the sequence and (chat) every message boundary as a prefix."""
        ends = itertools.accumulate(len(seg) for seg in request.segments)
        by_message = request.chat and request.block_hashes is None
        return {
            "prompt": self._prefix(hashes[:prompt_blocks]),
            "sequence": self._prefix(hashes),
            "messages": [self._prefix(hashes[: e // self.block_size]) for e in ends]
            if by_message
            else [],
        }

    def _prefix(self, blocks: tuple[BlockHash, ...]) -> PrefixId | None:
        if not blocks:
            return None
        pid = prefix_id_of(blocks)
        self.prefixes[pid] = blocks
        return pid

    def evict(self, prefix_id: str) -> None:
        """Drop a known prefix's blocks."""
        blocks = self.prefixes.get(PrefixId(prefix_id))
        if blocks is None:
            raise UsageError("prefix_id", f"unknown prefix {prefix_id!r}")
        self.blocks.difference_update(blocks)

    def present(self, blocks: Sequence[BlockHash]) -> int:
        return sum(h in self.blocks for h in blocks)

    def leading(self, blocks: Sequence[BlockHash]) -> int:
        return sum(1 for _ in itertools.takewhile(self.blocks.__contains__, blocks))

    def holds(self, claim: FakeClaim) -> bool:
        present = [h in self.blocks for h in claim.blocks]
        return claim.spec.materialization_predicate.holds(present)


def fake_descriptor() -> dict[str, Any]:
    """``FakeKV``'s lowering descriptor: a claims speaker deciding each claim itself (as the
    test says) in every mode but ``offloadable``, which it has no tier for (``unknown``)."""
    evidence = [
        {"kind": "source", "where": "agentclaims/testing/fake.py: FakeKV"},
        {"kind": "test", "where": "tests/testing/test_fake.py"},
    ]
    mapping = {
        "primitive": {
            "kind": "claim_arbiter",
            "provider": "runtime",
            "name": "FakeKV: every claim accepted, refused, demoted or harmed as the test says",
        },
        "obligations": {
            "claim_identity": {"met": True, "bound_at": "submission", "evidence": evidence},
            "materialization_predicate": {
                "met": True,
                "predicates": ["leading_prefix_at_least"],
                "evidence": evidence,
            },
            "ordered_lifecycle_events": {
                "met": True,
                "ordering": "per_claim_sequence",
                "evidence": evidence,
            },
            "claim_scoped_outcomes": {
                "met": True,
                "source": "claim_events",
                "attribution": "claim_id",
                "evidence": evidence,
            },
        },
        "limits": ["nothing happens by itself: no eviction, no TTL runs out"],
        "claimed": "native_conformance",
    }
    return {
        "descriptor_version": 1,
        "runtime": "agentclaims-fake-kv",
        "versions": "*",
        "title": "agentclaims.testing.FakeKV (a test double)",
        "facts": {
            "cache_identity": {
                "fields": [*IDENTITY_FIELDS, "adapter_id"],
                "evidence": evidence,
            },
            "token_map": {"kind": "shared_tokenizer", "evidence": evidence},
        },
        "modes": {
            mode.value: mapping for mode in ProtectionMode if mode is not ProtectionMode.OFFLOADABLE
        },
    }
