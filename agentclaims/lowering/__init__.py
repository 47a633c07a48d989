"""Fail-closed lowering: descriptors of how a runtime carries each protection mode, and the
checker that classifies every runtime x mode mapping from its anchored evidence.

A descriptor (YAML or JSON, ``descriptor_version: 1``, schema in ``descriptor.schema.json``)
states, per mode, the primitive it lowers to, which of the four obligations it meets (claim
identity, materialization predicate, ordered lifecycle events, claim-scoped outcomes) with
evidence anchors, the known limits and the claimed class. ``check_descriptor`` classifies it
(``agentclaims lowering check`` on the command line); the gateway serves its KV side's
descriptor checked, and the SDK checks what it was served again (``trusted_modes``) and
accepts a claim only in a mode whose class ``honours``. docs/lowering.md is the guide.

Importing this package loads neither PyYAML nor jsonschema: reading a descriptor does.
"""

from agentclaims.lowering.check import (
    HONOURED,
    IDENTITY_FIELDS,
    OBLIGATIONS,
    PRIMITIVES,
    SELF_TEST,
    DescriptorCheck,
    MappingResult,
    Primitive,
    Runs,
    check_descriptor,
    honours,
)
from agentclaims.lowering.document import (
    DESCRIPTOR_VERSION,
    SCHEMA_PATH,
    Descriptor,
    load_descriptor,
    parse_descriptor,
    version_in_range,
)
from agentclaims.lowering.served import (
    CONNECTOR_DESCRIPTOR,
    REFERENCE_DESCRIPTOR,
    LoweringSource,
    ServedLowering,
    reference_descriptor,
    serve_lowering,
    trusted_modes,
)

__all__ = [
    "CONNECTOR_DESCRIPTOR",
    "DESCRIPTOR_VERSION",
    "HONOURED",
    "IDENTITY_FIELDS",
    "OBLIGATIONS",
    "PRIMITIVES",
    "REFERENCE_DESCRIPTOR",
    "SCHEMA_PATH",
    "SELF_TEST",
    "Descriptor",
    "DescriptorCheck",
    "LoweringSource",
    "MappingResult",
    "Primitive",
    "Runs",
    "ServedLowering",
    "check_descriptor",
    "honours",
    "load_descriptor",
    "parse_descriptor",
    "reference_descriptor",
    "serve_lowering",
    "trusted_modes",
    "version_in_range",
]
