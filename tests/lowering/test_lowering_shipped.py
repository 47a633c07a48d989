"""The descriptors shipped in integrations/descriptors/ check to the classes docs/lowering.md
states for them, each honestly from its anchored facts."""

from __future__ import annotations

import re

import pytest
from lowering_fixtures import ROOT, SHIPPED, check_file

from agentclaims.contract import ProtectionMode
from agentclaims.lowering import CONNECTOR_DESCRIPTOR, REFERENCE_DESCRIPTOR

N, A, R = "native_conformance", "approximation_substrate", "rejected"
P, OBS = "adapter_policy", "adapter_observational"
MODES = [m.value for m in ProtectionMode]
# file -> class per mode, in ProtectionMode order (hard, expiring, soft, offloadable,
# demotable, best_effort); None where the descriptor does not describe the mode
EXPECTED: dict[str, list[str | None]] = {
    "reference-engine.yaml": [N, N, N, N, N, N],
    "vllm-stock.yaml": [R, R, R, R, R, A],
    "vllm-agentclaims-connector.yaml": [P, P, None, None, P, OBS],
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


def test_every_shipped_descriptor_shows_what_it_claims() -> None:
    """No shipped descriptor is below the class it claims (the connector's obligations are
    anchored in its source and in the tests that run it inside a real vLLM)."""
    below = {n: check_file(SHIPPED / n).below_claimed for n in EXPECTED}
    assert {n for n, mappings in below.items() if mappings} == set()


def test_no_stock_runtime_backs_a_hard_claim() -> None:
    """hard_protected is rejected or only approximated on every stock runtime: only the
    reference engine and vLLM with the agentclaims connector honour it."""
    honouring = {"reference-engine.yaml", "vllm-agentclaims-connector.yaml"}
    for name in set(EXPECTED) - honouring:
        assert EXPECTED[name][0] in (R, A), name
    assert EXPECTED["vllm-agentclaims-connector.yaml"][0] == P


def test_the_shipped_reference_and_connector_descriptors_are_the_packaged_ones() -> None:
    """integrations/descriptors/ holds the very files the gateway serves for the reference
    engine and for vLLM with the connector."""
    assert (SHIPPED / "reference-engine.yaml").resolve() == REFERENCE_DESCRIPTOR.resolve()
    assert (SHIPPED / "vllm-agentclaims-connector.yaml").resolve() == CONNECTOR_DESCRIPTOR.resolve()


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
