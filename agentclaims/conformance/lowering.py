"""Is running a hard claim under another mode a sound lowering? Checked on probe evidence.

A lowering of ``hard_protected`` must keep hard's obligations under the allocator probe (where
the resident claim and the active request cannot both fit): the active request is not served,
no claimed block is chosen as a victim, the refusal names the claim, and nothing is harmed.
A target mode whose contract does not carry those obligations is ``rejected`` by rule (fail
closed), and an observed run that breaks one is ``rejected`` with a counterexample.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentclaims.conformance.probe import ProbeRecord
from agentclaims.contract import EventName, LoweringClass, ProtectionMode
from agentclaims.errors import UsageError

__all__ = [
    "HARD_OBLIGATIONS",
    "MODE_LEVELS",
    "LoweringVerdict",
    "check_hard_lowering",
]

HARD_OBLIGATIONS = (
    "active_not_served",
    "no_claimed_victim",
    "refusal_names_claim",
    "no_harm",
)
"""What a hard claim obliges under the probe, in the order they are checked."""


@dataclass(frozen=True, slots=True)
class LoweringVerdict:
    """The class of a ``hard_protected -> target_mode`` lowering, and why."""

    target_mode: ProtectionMode
    lowering_class: LoweringClass
    violated: tuple[str, ...]
    """Obligations the observed probe broke: a counterexample when non-empty."""
    reason: str


def _violations(probe: ProbeRecord) -> tuple[str, ...]:
    """Hard's obligations the probe broke; the refusal ones apply only when it overcommits."""
    claim = probe.claim_id
    overcommitted = probe.overcommitted
    refusals = [
        e
        for e in probe.named(EventName.ACTIVE_REQUEST_REFUSED, EventName.ACTIVE_REQUEST_DEFERRED)
        if claim in e.data.get("blocking_claim_ids", ())
    ]
    broken = {
        "active_not_served": overcommitted and probe.outcome.served,
        "no_claimed_victim": bool(
            probe.named(EventName.ALLOCATION_VICTIM_SELECTED, claim_id=claim) or probe.resident_lost
        ),
        "refusal_names_claim": overcommitted and not refusals,
        "no_harm": bool(probe.named(EventName.RESIDENT_CLAIM_HARMED, claim_id=claim)),
    }
    return tuple(name for name in HARD_OBLIGATIONS if broken[name])


def check_hard_lowering(probe: ProbeRecord) -> LoweringVerdict:
    """Classify running a hard claim as ``probe.mode``, given what the probe observed."""
    if probe.mode is None:
        raise UsageError("probe.mode", "the probe ran without a claim: nothing to classify")
    violated = _violations(probe)
    if probe.mode is not ProtectionMode.HARD_PROTECTED:
        why = f"{probe.mode.value} does not carry hard_protected's refusal obligation"
        if violated:
            why += f"; observed: {', '.join(violated)} broken"
        return LoweringVerdict(probe.mode, LoweringClass.REJECTED, violated, why)
    if violated:
        return LoweringVerdict(
            probe.mode,
            LoweringClass.REJECTED,
            violated,
            f"hard_protected claimed but {', '.join(violated)} broken under the probe",
        )
    return LoweringVerdict(
        probe.mode,
        LoweringClass.ADAPTER_POLICY,
        (),
        "every hard obligation held under controlled pressure",
    )


MODE_LEVELS: dict[ProtectionMode, tuple[str, ...]] = {
    ProtectionMode.HARD_PROTECTED: ("L3", "L7", "C1"),
    ProtectionMode.EXPIRING: ("L5", "L7"),
    ProtectionMode.SOFT_PRIORITY: ("L6", "L7"),
    ProtectionMode.DEMOTABLE: ("L4", "L7"),
    ProtectionMode.BEST_EFFORT: ("L1", "L2"),
    ProtectionMode.OFFLOADABLE: (),
}
"""The levels whose scenarios exercise each mode's obligations (none exercises offload yet). A
conformance run supports a lowering descriptor's obligations of a mode only when every one of
the mode's levels passed in it (``agentclaims.lowering``)."""
