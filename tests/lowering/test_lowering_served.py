"""The checker at both ends of ``GET /v1/descriptor``: what the gateway serves for its KV side,
and what a client trusts of a served descriptor (``trusted_modes``)."""

from __future__ import annotations

from typing import Any

import httpx2
from lowering_fixtures import EXAMPLE_TARGET, FIXTURES, PASSING, RUN, document

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.lowering import serve_lowering, trusted_modes
from agentclaims.testing import FakeBackend, FakeKV

HARD = ProtectionMode.HARD_PROTECTED


def served(runtime_version: str | None = "1.2", **runs: Any) -> dict[str, Any]:
    """good.yaml served for a KV side of examplekv ``runtime_version``."""
    out = serve_lowering(
        document(FIXTURES / "good.yaml"),
        name="examplekv",
        runs={RUN: PASSING},
        runtime_version=runtime_version,
        targets={RUN: EXAMPLE_TARGET},
    )
    return {"lowering": out.section, "modes": out.modes}


def test_the_served_descriptor_is_trusted_as_it_checks() -> None:
    """Served and checked again: adapter_policy for hard, unknown for the modes not described."""
    trusted = trusted_modes(served())
    assert trusted[HARD].lowering_class is LoweringClass.ADAPTER_POLICY
    assert trusted[ProtectionMode.EXPIRING].lowering_class is LoweringClass.UNKNOWN


def test_the_served_runs_are_checked_again() -> None:
    """A served run whose L3 failed cannot show hard_protected, whatever ``modes`` states."""
    desc = served()
    desc["lowering"]["runs"][RUN]["L3"] = "fail"
    assert desc["modes"]["hard_protected"]["lowering_class"] == "adapter_policy"
    mapping = trusted_modes(desc)[HARD]
    assert mapping.lowering_class is LoweringClass.ADAPTER_OBSERVATIONAL
    assert f"conformance run {RUN}: L3 fail: cannot support hard_protected" in mapping.reasons


def test_a_descriptor_without_a_lowering_section_is_trusted_in_no_mode() -> None:
    """Classes stated without a descriptor to check them are not evidence."""
    desc = {"modes": {m.value: {"lowering_class": "native_conformance"} for m in ProtectionMode}}
    trusted = trusted_modes(desc)
    assert {m.lowering_class for m in trusted.values()} == {LoweringClass.UNKNOWN}
    assert trusted[HARD].reasons == ("the backend serves no lowering descriptor",)


def test_a_runtime_outside_the_range_is_unknown_in_every_mode() -> None:
    """examplekv 3.0 is outside >=1.0,<2.0: served and trusted as unknown."""
    desc = served(runtime_version="3.0")
    assert desc["modes"]["hard_protected"]["lowering_class"] == "unknown"
    assert trusted_modes(desc)[HARD].lowering_class is LoweringClass.UNKNOWN


def test_a_pinned_range_without_a_runtime_version_is_unknown() -> None:
    """A KV side that does not say which version it runs gets nothing of a pinned range."""
    assert served(runtime_version=None)["modes"]["hard_protected"]["lowering_class"] == "unknown"


def test_a_kv_side_without_a_descriptor_is_unknown_in_every_mode() -> None:
    """No descriptor: no section to serve, and every mode unknown, saying so."""
    out = serve_lowering(None, name="bare")
    assert out.section is None
    assert {v["lowering_class"] for v in out.modes.values()} == {"unknown"}
    assert out.modes["hard_protected"]["reasons"] == ["no lowering descriptor for KV side 'bare'"]


async def test_the_gateway_serves_its_kv_sides_descriptor_checked() -> None:
    """FakeKV's own descriptor: native in every mode but offloadable, which it does not
    describe; the descriptor itself is served with the classes."""
    backend = FakeBackend()
    desc = await backend.descriptor()
    await backend.aclose()
    classes = {mode: v["lowering_class"] for mode, v in desc["modes"].items()}
    assert classes.pop("offloadable") == "unknown"
    assert set(classes.values()) == {"native_conformance"}
    assert desc["lowering"]["source"] == "kv_side:fake"
    assert desc["lowering"]["descriptor"]["runtime"] == "agentclaims-fake-kv"


async def test_a_descriptor_file_given_to_the_gateway_has_its_runs_read_beside_it() -> None:
    """``create_app(kv, text, lowering=FILE)``: the run next to the file is read and served."""
    kv = FakeKV()
    kv.runtime_version = "1.4"  # type: ignore[attr-defined]
    app = create_app(kv, ScriptedModel(), lowering=FIXTURES / "good.yaml")
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://gw") as client:
        desc = (await client.get("/v1/descriptor")).json()
    assert desc["lowering"]["runs"] == {RUN: PASSING}
    assert desc["lowering"]["runtime_version"] == "1.4"
    assert desc["modes"]["hard_protected"]["lowering_class"] == "adapter_policy"
    assert trusted_modes(desc)[HARD].lowering_class is LoweringClass.ADAPTER_POLICY
