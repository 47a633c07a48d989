"""Reading a backend descriptor's stated class for a mode, fail closed."""

from __future__ import annotations

import pytest

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.protocol import stated_class

HARD = ProtectionMode.HARD_PROTECTED


def test_a_stated_class_is_read_as_its_lowering_class() -> None:
    """``modes.<mode>.lowering_class`` names the class."""
    desc = {"modes": {"hard_protected": {"lowering_class": "adapter_policy"}}}
    assert stated_class(desc, HARD) is LoweringClass.ADAPTER_POLICY


@pytest.mark.parametrize(
    "desc",
    [
        {},
        {"modes": None},
        {"modes": {"expiring": {"lowering_class": "native_conformance"}}},
        {"modes": {"hard_protected": "native_conformance"}},
        {"modes": {"hard_protected": {"lowering_class": "pinned"}}},
        {"modes": {"hard_protected": {"lowering_class": None}}},
    ],
)
def test_anything_else_is_unknown(desc: dict) -> None:
    """A mode not stated, stated in another shape, or with a name this version does not know."""
    assert stated_class(desc, HARD) is LoweringClass.UNKNOWN
