"""The claims protocol: the one boundary every backend speaks.

Like httpx's transport, it is a small family of async methods. The required part is the
claims API of the contract; serving active requests and controlling an instance are optional
capabilities, each its own protocol, so a caller asks ``supports(backend, ActiveServing)``
instead of guessing, and an operation a backend lacks raises ``OperationNotExposed``::

    ClaimsProtocol      submit / get / renew / release a claim, events since a sequence
                        number, residency of prefixes, the descriptor
    ActiveServing       serve an active request; which blocks are resident, per block
    InstanceControl     a fresh instance of N usable blocks; advance the step counter

Speakers: the reference engine (``agentclaims.engine.ReferenceKV``), the gateway over HTTP
(``HTTPBackend``, and ``EmbeddedBackend`` in-process), a pool of them (``BackendPool``), the
test double (``agentclaims.testing.FakeBackend``). The gateway serves whatever KV side speaks
it, and the conformance suite drives any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentclaims.protocol.types import RENEW_AS_IS, Renewal

if TYPE_CHECKING:
    from agentclaims.contract import CacheIdentity, ClaimEvent, ClaimSpec
    from agentclaims.contract.ids import BlockHash, ClaimId, OwnerScope, PrefixId
    from agentclaims.protocol.types import (
        ActiveRequest,
        ClaimDecision,
        ClaimView,
        Descriptor,
        EventPage,
        ServeResult,
    )

__all__ = [
    "EXTENSION_KEY",
    "INSTANCE_HEADER",
    "INSTANCE_URL_HEADER",
    "ROUTER_SAFE_HEADER",
    "ActiveServing",
    "ClaimsProtocol",
    "InstanceControl",
    "Tokenizer",
    "collect_events",
    "supports",
]

EXTENSION_KEY = "agentclaims"
"""Key of the extension object in a completion request's body and in its response."""
INSTANCE_HEADER = "X-Agentclaims-Instance"
"""Names the gateway instance that answered (every response): claims live per instance."""
INSTANCE_URL_HEADER = "X-Agentclaims-Instance-URL"
"""Where that instance's claims API is reached directly (``--advertise-url``), when known."""
ROUTER_SAFE_HEADER = "X-Agentclaims-Router-Safe"
"""A client behind a router sends ``1``: no claim outcome is then a status routers retry."""


@runtime_checkable
class ClaimsProtocol(Protocol):
    """The claims API of the Resident KV Claims contract."""

    name: str

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        """Submit a residency claim on ``spec.object_id`` (a known prefix, or the prefix made
        of ``block_hashes``); the decision says accepted or refused and why."""
        ...

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView: ...

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        """Extend a live claim (``renewal``: new ``duration_steps`` and/or ``ttl_s``)."""
        ...

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        """End a live claim now. ``done``: its agent is finished and nothing will use the
        prefix again (a KV side may then evict its blocks first; a hint, never a promise)."""
        ...

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        """One page of events with ``seq > since``, in order; with ``id_prefix``, only those
        whose claim id (else request id) starts with it (a session's own events)."""
        ...

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        """How many leading blocks of each known prefix are resident now (0 if unknown)."""
        ...

    async def descriptor(self) -> Descriptor:
        """What this backend can honour: identity, block size, lowering class per mode."""
        ...


class Tokenizer(Protocol):
    """Turns text and chat messages into the token ids a KV side hashes."""

    tokenizer_id: str

    def encode(self, text: str) -> list[int]: ...

    def encode_message(self, message: Mapping[str, Any]) -> list[int]: ...


@runtime_checkable
class ActiveServing(Protocol):
    """Optional: serve active requests and report residency block by block."""

    async def serve(self, request: ActiveRequest) -> ServeResult:
        """Run one active request: the arbiter's outcome, and its claims submitted if served."""
        ...

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """For each block hash, whether that block is resident (reusable) on the device."""
        ...


@runtime_checkable
class InstanceControl(Protocol):
    """Optional: what the conformance suite needs to run a scenario from a known state."""

    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        """Replace the instance by an empty one with ``usable_blocks`` usable blocks; refused
        while another owner than ``owner_scope`` holds a live claim."""
        ...

    async def step(self, n: int = 1) -> None:
        """Advance the step counter that ``duration_steps`` counts."""
        ...


async def collect_events(
    backend: ClaimsProtocol, since: int = 0, *, id_prefix: str | None = None
) -> list[ClaimEvent]:
    """Every buffered event after ``since``, page by page, in order."""
    out: list[ClaimEvent] = []
    while True:
        page = await backend.events(since, id_prefix=id_prefix)
        out.extend(page.events)
        if not page.more or page.next_since <= since:
            return out
        since = page.next_since


def supports(backend: object, capability: type) -> bool:
    """Whether ``backend`` offers an optional capability (``ActiveServing``, ...)."""
    return isinstance(backend, capability)
