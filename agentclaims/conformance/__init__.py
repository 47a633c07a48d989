"""The executable conformance suite: levels L1-L7 and C1 of the Resident KV Claims contract.

``run_suite(backend)`` drives anything that speaks the claims protocol (the reference engine,
the gateway in-process or over HTTP, a lowering onto vLLM, a test double) through the same
scenarios, and returns one ``LevelResult`` per level. ``allocator_probe`` and ``capacity_sweep``
reproduce the contract's reference figures; ``MODE_LEVELS`` says which levels exercise each
protection mode: what a run can support in a lowering descriptor (``agentclaims.lowering``).
"""

from agentclaims.conformance.evidence import (
    RunEvidence,
    evidence_from_json,
    self_test,
)
from agentclaims.conformance.lowering import (
    HARD_OBLIGATIONS,
    MODE_LEVELS,
    LoweringVerdict,
    check_hard_lowering,
)
from agentclaims.conformance.probe import (
    PROBE_ACTIVE_BLOCKS,
    PROBE_RESIDENT_BLOCKS,
    PROBE_USABLE_BLOCKS,
    SWEEP_USABLE_BLOCKS,
    ProbeRecord,
    SweepRow,
    allocator_probe,
    capacity_sweep,
)
from agentclaims.conformance.scenarios import (
    LEVELS,
    Evidence,
    LevelResult,
    as_target,
    run_level,
    run_suite,
    suite_not_evaluated,
)
from agentclaims.conformance.target import OWNER_SCOPE, ManualClock, Target, reference_target

__all__ = [
    "HARD_OBLIGATIONS",
    "LEVELS",
    "MODE_LEVELS",
    "OWNER_SCOPE",
    "PROBE_ACTIVE_BLOCKS",
    "PROBE_RESIDENT_BLOCKS",
    "PROBE_USABLE_BLOCKS",
    "SWEEP_USABLE_BLOCKS",
    "Evidence",
    "LevelResult",
    "LoweringVerdict",
    "ManualClock",
    "ProbeRecord",
    "RunEvidence",
    "SweepRow",
    "Target",
    "allocator_probe",
    "as_target",
    "capacity_sweep",
    "check_hard_lowering",
    "evidence_from_json",
    "reference_target",
    "run_level",
    "run_suite",
    "self_test",
    "suite_not_evaluated",
]
