"""The claim kernel: what every KV side (the reference engine, ``FakeKV``, the vLLM side) does
the same way, written once.

* ``Claim`` (``record.py``): a claim's spec, state, end reason and event count; lifecycle moves
  checked by the contract; the view a reader gets.
* ``EventLog`` (``events.py``): the numbered, bounded event stream and its pages.
* ``resolve_request_claims`` (``resolve.py``): a request's claims (``@prompt``, ``@sequence``,
  known prefix ids) checked before anything changes; ``identity_problem``: cache-identity
  compatibility.
* ``decide.py``: the submitted, refused and harmed decisions with their events.

Each side keeps only its own port: how it holds and lets go of blocks, what is resident, how it
serves. ``tests/kernel`` runs one property suite against all three.
"""

from agentclaims.kernel.decide import accepted, harm, harm_fields, refuse, submitted
from agentclaims.kernel.events import EVENTS_KEPT, LOOSE_KEPT, EventLog, EventSource
from agentclaims.kernel.record import CLAIMS_KEPT, Claim, counts_by_mode_and_state, forget_ended
from agentclaims.kernel.resolve import (
    IDENTITY_MISMATCH,
    NO_FULL_BLOCK,
    Resolved,
    claim_blocks,
    identity_problem,
    resolve_request_claims,
)

__all__ = [
    "CLAIMS_KEPT",
    "EVENTS_KEPT",
    "IDENTITY_MISMATCH",
    "LOOSE_KEPT",
    "NO_FULL_BLOCK",
    "Claim",
    "EventLog",
    "EventSource",
    "Resolved",
    "accepted",
    "claim_blocks",
    "counts_by_mode_and_state",
    "forget_ended",
    "harm",
    "harm_fields",
    "identity_problem",
    "refuse",
    "resolve_request_claims",
    "submitted",
]
