"""The Resident KV Claims contract: ids, modes, states, decisions, actions, predicates, events,
and the one wire codec they travel in."""

from agentclaims.contract.claims import CacheIdentity, ClaimSpec, owned_claim, parse_mode
from agentclaims.contract.events import SCHEMA_VERSION, ClaimEvent, ClaimHistory, rebuild_claims
from agentclaims.contract.hints import SESSION_STATES, WAIT_CLASSES, ReuseHint, hint_owner
from agentclaims.contract.ids import (
    BlockHash,
    ClaimId,
    OwnerScope,
    PrefixId,
    RequestId,
    prefix_blocks,
    prefix_id_of,
)
from agentclaims.contract.lifecycle import LEGAL_TRANSITIONS, check_transition
from agentclaims.contract.names import (
    BACKEND_RESTART,
    ArbiterAction,
    ClaimState,
    ConformanceStatus,
    Decision,
    EventName,
    Feasibility,
    LoweringClass,
    ProtectionMode,
    backend_restart_end,
)
from agentclaims.contract.predicates import (
    ContiguousRange,
    LeadingPrefixAtLeast,
    MaterializationPredicate,
    leading_run,
    predicate_from_dict,
)

__all__ = [
    "BACKEND_RESTART",
    "LEGAL_TRANSITIONS",
    "SCHEMA_VERSION",
    "SESSION_STATES",
    "WAIT_CLASSES",
    "ArbiterAction",
    "BlockHash",
    "CacheIdentity",
    "ClaimEvent",
    "ClaimHistory",
    "ClaimId",
    "ClaimSpec",
    "ClaimState",
    "ConformanceStatus",
    "ContiguousRange",
    "Decision",
    "EventName",
    "Feasibility",
    "LeadingPrefixAtLeast",
    "LoweringClass",
    "MaterializationPredicate",
    "OwnerScope",
    "PrefixId",
    "ProtectionMode",
    "RequestId",
    "ReuseHint",
    "backend_restart_end",
    "check_transition",
    "hint_owner",
    "leading_run",
    "owned_claim",
    "parse_mode",
    "predicate_from_dict",
    "prefix_blocks",
    "prefix_id_of",
    "rebuild_claims",
]
