"""The checker's rules on one good lowering (fixtures/good.yaml) changed one way at a time:
what counts as evidence, what a conformance run supports, caps, versions, honoured classes."""

from __future__ import annotations

import pytest
from lowering_fixtures import FIXTURES, PASSING, RUN, check_file, document, ran_here

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.lowering import (
    HONOURED,
    SELF_TEST,
    Runs,
    check_descriptor,
    honours,
    parse_descriptor,
    version_in_range,
)

HARD = ProtectionMode.HARD_PROTECTED


def good() -> dict:
    return document(FIXTURES / "good.yaml")


def hard_of(doc: dict, runs: dict | None = None, **kwargs: object):
    return check_descriptor(parse_descriptor(doc, source="t"), ran_here(runs), **kwargs)[HARD]


def test_a_level_that_did_not_pass_supports_nothing_of_its_mode() -> None:
    """With L3 failed, the run no longer shows the ordering it alone showed: not adapter_policy."""
    mapping = hard_of(good(), {RUN: {**PASSING, "L3": "fail"}})
    assert mapping.lowering_class is LoweringClass.ADAPTER_OBSERVATIONAL
    assert f"conformance run {RUN}: L3 fail: cannot support hard_protected" in mapping.reasons
    assert any(why.startswith("not shown: ") for why in mapping.reasons)


def test_a_run_missing_a_level_of_the_mode_supports_nothing() -> None:
    """A run without C1 cannot stand for hard_protected."""
    levels = {k: v for k, v in PASSING.items() if k != "C1"}
    mapping = hard_of(good(), {RUN: levels})
    assert f"conformance run {RUN}: C1 missing: cannot support hard_protected" in mapping.reasons
    assert mapping.below_claimed


def test_a_run_that_cannot_be_read_supports_nothing(tmp_path) -> None:
    """No run file beside the descriptor: the anchor does not count, and the reason says so."""
    descriptor = parse_descriptor(good(), source="t", base_dir=tmp_path)
    mapping = check_descriptor(descriptor)[HARD]
    assert mapping.below_claimed
    assert any("unavailable (no such file beside the descriptor)" in r for r in mapping.reasons)


def test_the_run_file_beside_the_descriptor_is_read() -> None:
    """good.yaml's anchor names runs/all-pass.json, relative to the descriptor file."""
    runs = Runs(base_dir=FIXTURES)
    check_descriptor(parse_descriptor(good(), source="t", base_dir=FIXTURES), runs)
    assert runs.read == {RUN: PASSING}


def test_no_level_exercises_offloadable_so_no_run_supports_it() -> None:
    """A conformance run cited for an offload mapping says it supports nothing there."""
    doc = document(FIXTURES / "offload-good.yaml")
    anchor = {"kind": "conformance_run", "where": RUN}
    doc["modes"]["offloadable"]["offload"]["evidence"] = [anchor]
    check = check_descriptor(parse_descriptor(doc, source="t"), ran_here({RUN: PASSING}))
    mapping = check[ProtectionMode.OFFLOADABLE]
    assert f"conformance run {RUN}: no level exercises offloadable: supports nothing here" in (
        mapping.reasons
    )
    assert mapping.lowering_class is LoweringClass.ADAPTER_OBSERVATIONAL


def test_met_without_an_anchor_does_not_count() -> None:
    """An obligation stated met with no evidence is not met, and the reason says so."""
    doc = good()
    doc["modes"]["hard_protected"]["obligations"]["materialization_predicate"]["evidence"] = []
    mapping = hard_of(doc, {RUN: PASSING})
    assert "materialization_predicate: met, but no evidence anchor counts" in mapping.reasons
    assert mapping.lowering_class is LoweringClass.ADAPTER_OBSERVATIONAL


def test_a_mapping_without_any_anchor_is_unknown() -> None:
    """Every evidence list emptied: no anchored evidence, unknown."""
    doc = good()
    mode = doc["modes"]["hard_protected"]
    mode["primitive"]["evidence"] = []
    for obligation in mode["obligations"].values():
        obligation["evidence"] = []
    mapping = hard_of(doc, {RUN: PASSING})
    assert mapping.lowering_class is LoweringClass.UNKNOWN
    assert "no anchored evidence" in mapping.reasons


def test_stated_but_not_shown_by_an_adapter_is_observational() -> None:
    """Tests and runs taken away (doc and source left): enforcement not shown."""
    doc = good()
    for obligation in doc["modes"]["hard_protected"]["obligations"].values():
        obligation["evidence"] = [{"kind": "doc", "where": "adapter README"}]
    mapping = hard_of(doc)
    assert mapping.lowering_class is LoweringClass.ADAPTER_OBSERVATIONAL
    assert "an adapter joins events to claims, but its enforcement is not shown" in (
        mapping.reasons
    )


def test_stated_but_not_shown_by_the_runtime_is_an_approximation() -> None:
    """A runtime's own obligations need showing too: stated only, approximation_substrate."""
    doc = good()
    mode = doc["modes"]["hard_protected"]
    mode["primitive"]["provider"] = "runtime"
    for obligation in mode["obligations"].values():
        obligation["evidence"] = [{"kind": "doc", "where": "runtime docs"}]
    assert hard_of(doc).lowering_class is LoweringClass.APPROXIMATION_SUBSTRATE


def test_the_runtime_itself_shown_is_native() -> None:
    """Everything met and shown, by the runtime: native_conformance (capped at the claim)."""
    doc = good()
    doc["modes"]["hard_protected"]["primitive"]["provider"] = "runtime"
    doc["modes"]["hard_protected"]["claimed"] = "native_conformance"
    assert hard_of(doc, {RUN: PASSING}).lowering_class is LoweringClass.NATIVE_CONFORMANCE


def test_the_class_never_exceeds_the_claimed_one() -> None:
    """Evidence for adapter_policy, a claim of approximation_substrate: the claim is the class."""
    doc = good()
    doc["modes"]["hard_protected"]["claimed"] = "approximation_substrate"
    mapping = hard_of(doc, {RUN: PASSING})
    assert mapping.lowering_class is LoweringClass.APPROXIMATION_SUBSTRATE
    assert not mapping.below_claimed
    assert "capped at its claimed class approximation_substrate (shown: adapter_policy)" in (
        mapping.reasons
    )


def test_an_event_observer_is_never_more_than_observational() -> None:
    """An observer with every obligation shown is still adapter_observational."""
    doc = good()
    doc["modes"]["hard_protected"]["primitive"]["kind"] = "event_observer"
    mapping = hard_of(doc, {RUN: PASSING})
    assert mapping.lowering_class is LoweringClass.ADAPTER_OBSERVATIONAL
    assert "an event observer enforces nothing" in mapping.reasons


def test_a_timed_pin_is_at_best_an_approximation_of_hard() -> None:
    """A pin released on a timeout cannot carry hard_protected, however well shown."""
    doc = good()
    doc["modes"]["hard_protected"]["primitive"]["kind"] = "timed_pin"
    mapping = hard_of(doc, {RUN: PASSING})
    assert mapping.lowering_class is LoweringClass.APPROXIMATION_SUBSTRATE
    assert any("at best an approximation of hard_protected" in r for r in mapping.reasons)


def test_a_mode_the_descriptor_does_not_describe_is_unknown() -> None:
    """good.yaml describes hard_protected only: every other mode is unknown, not described."""
    check = check_file(FIXTURES / "good.yaml")
    others = [m for m in check.mappings if m.mode is not HARD]
    assert {m.lowering_class for m in others} == {LoweringClass.UNKNOWN}
    assert {m.reasons for m in others} == {("not described",)}
    assert [m.mode for m in check.described] == [HARD]


def test_a_runtime_version_outside_the_range_makes_every_mode_unknown() -> None:
    """examplekv 2.1 is outside >=1.0,<2.0: nothing the descriptor says applies."""
    mapping = hard_of(good(), {RUN: PASSING}, runtime_version="2.1")
    assert mapping.lowering_class is LoweringClass.UNKNOWN
    assert "runtime version 2.1 is outside the descriptor's range >=1.0,<2.0" in mapping.reasons


def test_a_range_needs_a_stated_version_where_one_is_required() -> None:
    """Served, a descriptor pinned to a range is unknown until the runtime names its version."""
    mapping = hard_of(good(), {RUN: PASSING}, require_version=True)
    assert mapping.lowering_class is LoweringClass.UNKNOWN
    assert hard_of(good(), {RUN: PASSING}, runtime_version="1.4").lowering_class is (
        LoweringClass.ADAPTER_POLICY
    )


@pytest.mark.parametrize(
    ("version", "versions", "inside"),
    [
        ("0.32.0", ">=0.32,<0.34", True),
        ("0.33.9rc1+cpu", ">=0.32,<0.34", True),
        ("0.34.0", ">=0.32,<0.34", False),
        ("0.5.6", "==0.5.6", True),
        ("0.5.6.1", "==0.5.6", False),
        ("0.5.6.1", "==0.5.*", True),
        ("1.0", "!=1.*", False),
        ("anything", "*", True),
        ("not-a-version", ">=1", False),
    ],
)
def test_version_in_range(version: str, versions: str, inside: bool) -> None:
    """A runtime version (its release part) against a descriptor's range."""
    assert version_in_range(version, versions) is inside


def test_the_self_test_anchor_runs_the_suite_on_a_scratch_engine() -> None:
    """``self_test:reference_engine`` is run when asked for, and every level passes."""
    runs = Runs(self_test=True)
    assert dict(runs.levels(SELF_TEST)) == PASSING
    assert Runs().levels(SELF_TEST) == "not run here"


def test_only_enforcement_shown_is_honoured() -> None:
    """native_conformance and adapter_policy are honoured; every other class is not."""
    assert {cls for cls in LoweringClass if honours(cls)} == HONOURED
    assert {LoweringClass.NATIVE_CONFORMANCE, LoweringClass.ADAPTER_POLICY} == HONOURED
