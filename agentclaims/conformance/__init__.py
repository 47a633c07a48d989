"""The executable conformance suite: levels L1-L7 and C1 of the Resident KV Claims contract.

``run_suite(backend)`` drives any ``ConformanceBackend`` (the embedded reference engine through
``EmbeddedConformanceBackend``; a gateway or a vLLM lowering through their own adapters) and
returns one ``LevelResult`` per level. ``allocator_probe`` and ``capacity_sweep`` reproduce the
contract's reference figures.
"""

from agentclaims.conformance.backend import (
    ConformanceBackend,
    EmbeddedConformanceBackend,
    ManualClock,
    OperationNotExposed,
)
from agentclaims.conformance.lowering import HARD_OBLIGATIONS, LoweringVerdict, check_hard_lowering
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
    run_level,
    run_suite,
    suite_not_evaluated,
)

__all__ = [
    "HARD_OBLIGATIONS",
    "LEVELS",
    "PROBE_ACTIVE_BLOCKS",
    "PROBE_RESIDENT_BLOCKS",
    "PROBE_USABLE_BLOCKS",
    "SWEEP_USABLE_BLOCKS",
    "ConformanceBackend",
    "EmbeddedConformanceBackend",
    "Evidence",
    "LevelResult",
    "LoweringVerdict",
    "ManualClock",
    "OperationNotExposed",
    "ProbeRecord",
    "SweepRow",
    "allocator_probe",
    "capacity_sweep",
    "check_hard_lowering",
    "run_level",
    "run_suite",
    "suite_not_evaluated",
]
