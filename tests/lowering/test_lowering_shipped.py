"""The descriptors shipped in integrations/descriptors/ check to the classes docs/lowering.md
states for them, each honestly from its anchored facts."""

from __future__ import annotations

import re

import pytest
from lowering_fixtures import ROOT, SHIPPED, check_file

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.lowering import REFERENCE_DESCRIPTOR

N, A, R = "native_conformance", "approximation_substrate", "rejected"
MODES = [m.value for m in ProtectionMode]
# file -> class per mode, in ProtectionMode order (hard, expiring, soft, offloadable,
# demotable, best_effort); None where the descriptor does not describe the mode
EXPECTED: dict[str, list[str | None]] = {
    "reference-engine.yaml": [N, N, N, N, N, N],
    "vllm-stock.yaml": [R, R, R, R, R, A],
    "vllm-agentclaims-connector.yaml": [A, A, None, None, A, A],
    "sglang.yaml": [A, A, A, R, A, A],
    "tensorrt-llm.yaml": [R, R, A, R, A, A],
    "lmcache.yaml": [R, R, None, R, None, A],
    "dynamo.yaml": [R, R, A, R, None, A],
    "llm-d.yaml": [R, None, None, None, None, A],
}


def _classes(name: str) -> list[str | None]:
    check = check_file(SHIPPED / name)
    described = {m.mode.value: m.lowering_class.value for m in check.described}
    return [described.get(mode) for mode in MODES]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_descriptor_checks_to_its_expected_classes(name: str) -> None:
    """Each mode it describes has the expected class; every reason list says why."""
    assert _classes(name) == EXPECTED[name]
    assert all(m.reasons for m in check_file(SHIPPED / name).described)


def test_every_shipped_descriptor_is_expected() -> None:
    """Nothing ships in integrations/descriptors/ without an expected class here."""
    assert {p.name for p in SHIPPED.glob("*.yaml")} == set(EXPECTED)


def test_only_the_connector_is_below_its_claim_until_its_evidence_lands() -> None:
    """Every shipped descriptor claims what it shows but the connector's, whose own source,
    tests and conformance run are not anchored yet: each of its obligations says so."""
    below = {n: check_file(SHIPPED / n).below_claimed for n in EXPECTED}
    assert {n for n, mappings in below.items() if mappings} == {"vllm-agentclaims-connector.yaml"}
    for mapping in below["vllm-agentclaims-connector.yaml"]:
        assert "claim_scoped_outcomes: met, but no evidence anchor counts" in mapping.reasons
        assert mapping.claimed in (
            LoweringClass.ADAPTER_POLICY,
            LoweringClass.ADAPTER_OBSERVATIONAL,
        )


def test_no_stock_runtime_backs_a_hard_claim() -> None:
    """hard_protected is rejected or only approximated on every runtime but the reference
    engine: none is honoured."""
    for name in set(EXPECTED) - {"reference-engine.yaml"}:
        assert EXPECTED[name][0] in (R, A), name


def test_the_shipped_reference_descriptor_is_the_packaged_one() -> None:
    """integrations/descriptors/reference-engine.yaml is the file the gateway serves."""
    assert (SHIPPED / "reference-engine.yaml").resolve() == REFERENCE_DESCRIPTOR.resolve()


def test_the_docs_table_is_the_checkers() -> None:
    """docs/lowering.md's runtime x mode table shows exactly what the checker gives."""
    text = (ROOT / "docs" / "lowering.md").read_text()
    table = text.split("<!-- classes: begin -->")[1].split("<!-- classes: end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    shown = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = re.match(r"`([^`]+)`", cells[0])
        assert name is not None, row
        shown[name.group(1)] = [None if c == "-" else c.strip("*") for c in cells[1:7]]
    assert shown == {name: _classes(name) for name in EXPECTED}
