"""Evidence is bound to what it describes: a conformance run counts only for the runtime and
version range that produced it. Borrowed evidence (the reference engine's self-test cited by
another runtime's descriptor, a real run of another backend, a run that does not say what it
ran on, a run on a version outside the range) supports nothing, and says why; and what the
gateway serves from such a descriptor is not trusted by the SDK either."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lowering_fixtures import EXAMPLE_TARGET, FIXTURES, PASSING, RUN, document

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.lowering import (
    SELF_TEST,
    Runs,
    check_descriptor,
    load_descriptor,
    parse_descriptor,
    serve_lowering,
    trusted_modes,
)

HARD = ProtectionMode.HARD_PROTECTED


def _native(runtime: str = "examplekv", where: str = RUN) -> dict[str, Any]:
    """good.yaml as the runtime's own enforcement, claiming native_conformance, citing the run
    at ``where``."""
    doc = document(FIXTURES / "good.yaml")
    doc["runtime"] = runtime
    hard = doc["modes"]["hard_protected"]
    hard["primitive"]["provider"] = "runtime"
    hard["claimed"] = "native_conformance"
    for obligation in hard["obligations"].values():
        for anchor in obligation.get("evidence", []):
            if anchor["kind"] == "conformance_run":
                anchor["where"] = where
    return doc


def _write_run(folder: Path, name: str, target: dict[str, Any] | None) -> str:
    run: dict[str, Any] = {
        "backend": "embedded",
        "levels": {lvl: {"status": "pass", "evidence": [], "detail": ""} for lvl in PASSING},
    }
    if target is not None:
        run["target"] = target
    (folder / name).write_text(json.dumps(run))
    return name


def _hard(doc: dict[str, Any], folder: Path, **runs: Any) -> Any:
    (folder / "d.json").write_text(json.dumps(doc))
    descriptor = load_descriptor(folder / "d.json")
    return check_descriptor(descriptor, Runs(base_dir=folder, self_test=True, **runs))[HARD]


def test_a_run_on_the_described_runtime_and_version_counts(tmp_path: Path) -> None:
    where = _write_run(tmp_path, "run.json", EXAMPLE_TARGET)
    assert _hard(_native(where=where), tmp_path).lowering_class is LoweringClass.NATIVE_CONFORMANCE


def test_another_runtimes_descriptor_citing_the_reference_self_test_earns_nothing(
    tmp_path: Path,
) -> None:
    mapping = _hard(_native("sglang", SELF_TEST), tmp_path)
    assert mapping.lowering_class is not LoweringClass.NATIVE_CONFORMANCE
    assert mapping.below_claimed
    assert any(
        f"conformance run {SELF_TEST}: it ran on 'agentclaims-reference-engine', not on "
        "'sglang'" in why
        for why in mapping.reasons
    ), mapping.reasons


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (
            {"runtime": "agentclaims-reference-engine", "runtime_version": None},
            "it ran on 'agentclaims-reference-engine', not on 'examplekv'",
        ),
        (None, "it does not say what it ran on"),
        (
            {"runtime": "examplekv", "runtime_version": "2.1"},
            "it ran on version '2.1', outside the descriptor's range >=1.0,<2.0",
        ),
        ({"runtime": "examplekv", "runtime_version": None}, "it ran on version None"),
    ],
    ids=["another-backends-run", "no-target", "outside-the-range", "no-version"],
)
def test_a_borrowed_run_supports_nothing_and_says_why(
    tmp_path: Path, target: dict[str, Any] | None, why: str
) -> None:
    where = _write_run(tmp_path, "borrowed.json", target)
    mapping = _hard(_native(where=where), tmp_path)
    assert mapping.lowering_class is not LoweringClass.NATIVE_CONFORMANCE
    assert any(why in reason for reason in mapping.reasons), mapping.reasons


def test_a_gateway_serving_borrowed_evidence_is_not_trusted_by_the_sdk() -> None:
    """Served with the reference engine's self-test as its runs, another runtime's
    descriptor checks below native at the gateway, and again at the client, even when the
    served section claims the run was its own."""
    doc = _native("sglang", SELF_TEST)
    doc["versions"] = "*"
    out = serve_lowering(doc, name="sglang", runs={SELF_TEST: PASSING})
    assert out.modes["hard_protected"]["lowering_class"] != "native_conformance"
    forged = dict(out.section or {})
    forged["run_targets"] = {SELF_TEST: {"runtime": "sglang", "runtime_version": None}}
    trusted = trusted_modes({"lowering": out.section, "modes": out.modes})[HARD]
    assert trusted.lowering_class is not LoweringClass.NATIVE_CONFORMANCE
    # what the gateway checked of its own runs is what the client checks: the reference
    # engine's self-test is the reference engine's, whatever a section says it was
    relabelled = trusted_modes({"lowering": forged, "modes": out.modes})[HARD]
    assert relabelled.lowering_class is not LoweringClass.NATIVE_CONFORMANCE


def test_the_reference_engines_own_descriptor_still_earns_native() -> None:
    from agentclaims.lowering.served import REFERENCE_DESCRIPTOR

    descriptor = load_descriptor(REFERENCE_DESCRIPTOR)
    check = check_descriptor(descriptor, Runs(base_dir=descriptor.base_dir, self_test=True))
    assert check[HARD].lowering_class is LoweringClass.NATIVE_CONFORMANCE


def test_a_version_range_that_matches_nothing_is_an_error() -> None:
    from agentclaims.errors import DescriptorError

    doc = document(FIXTURES / "good.yaml")
    doc["versions"] = ">=2.0,<1.0"
    with pytest.raises(DescriptorError, match="matches no version"):
        parse_descriptor(doc, source="t")
    for fine in ("*", ">=1.0,<2.0", "==0.5.*", ">0.5,<0.6", "==1.2.3", "!=1.0"):
        doc["versions"] = fine
        parse_descriptor(doc, source="t")
